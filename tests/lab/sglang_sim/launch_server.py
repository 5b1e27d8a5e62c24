"""`python -m sglang_sim.launch_server`: the simulated SGLang server's main process.

Order of a launch, as SGLang's: validate arguments; read the installed sglang (modified sources must
compile, the algorithm must exist; a modified source may declare faults, see sources.py); fork the
schedulers and the detokenizer and wait for every scheduler to load; only then listen on HTTP; /health
turns 200 after the warm-up. SIGTERM drains.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import time

from . import args, faults, info, logs, sources, spec_args, specmodel
from .engine import Engine, EngineConfig, new_request, parse_sampling
from .http_api import make_server
from .scheduler import RankPlan, rank_names, run_detokenizer, run_scheduler
from .state import ServerState
from .supervisor import ChildFailed, Supervisor

logger = logging.getLogger("sglang_sim")

SCHEDULER_EXIT_GRACE_S = 5.0
DRAIN_LOG_INTERVAL_S = 5.0
WARMUP_PROMPT = "The capital city of France is"
DEFAULT_HEALTH_CHECK_TIMEOUT = 20.0
TRUE_VALUES = ("1", "true", "yes", "on")


def _environment_settings(ns) -> None:
    ns.health_check_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT") or DEFAULT_HEALTH_CHECK_TIMEOUT)
    ns.health_generates = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "").lower() in TRUE_VALUES


def _resolve_spec(ns, installed: sources.InstalledSglang, model: info.ModelConfig) -> spec_args.SpecConfig:
    members: frozenset = frozenset()
    aliases: frozenset = frozenset()
    if ns.speculative_algorithm is not None:
        members, aliases = sources.algorithm_names(installed)
    architecture = (model.architectures or [None])[0]
    return spec_args.resolve(
        ns.speculative_algorithm,
        ns.speculative_num_steps,
        ns.speculative_eagle_topk,
        ns.speculative_num_draft_tokens,
        members=members,
        aliases=aliases,
        model_arch=architecture,
    )


def _engine(ns, spec: spec_args.SpecConfig, model: info.ModelConfig) -> Engine:
    params = None
    if spec.enabled:
        params = specmodel.params_for(
            spec.algorithm,
            ns.sim_spec_accept_prob,
            ns.sim_spec_draft_step_cost,
            ns.sim_spec_topk_cost,
            ns.sim_spec_verify_token_cost,
        )
    return Engine(
        EngineConfig(
            token_latency_s=ns.sim_token_latency_ms / 1000.0,
            prefill_s_per_token=ns.sim_prefill_ms_per_token / 1000.0,
            seed=ns.sim_seed,
            noise=ns.sim_noise,
            batch_slowdown=ns.sim_batch_slowdown,
            context_length=model.context_len,
            stream_interval=ns.stream_interval,
            incremental_streaming=ns.incremental_streaming_output,
            spec=spec,
            spec_params=params,
            faults=ns.faults,
        )
    )


def _plans(ns, spec: spec_args.SpecConfig, model: info.ModelConfig) -> list[RankPlan]:
    draft_mib = 0
    if spec.enabled:
        draft_mib = specmodel.draft_memory_mib(
            spec.num_steps,
            spec.eagle_topk,
            spec.num_draft_tokens,
            ns.sim_draft_base_mib,
            ns.sim_mem_overhead_mib_per_draft_token,
        )
    architecture = (model.architectures or ["LlamaForCausalLM"])[0]
    return [
        RankPlan(
            index=rank,
            title=title,
            log_prefix=prefix,
            gpu=ns.rank_gpus[rank],
            load_time=ns.sim_load_time,
            weight_fraction=ns.sim_weight_fraction,
            mem_fraction_static=ns.mem_fraction_static,
            graph_mib=ns.sim_cuda_graph_mib,
            draft_mib=draft_mib,
            architecture=architecture,
            log_level=ns.log_level,
            crash=faults.CRASH_ON_LOAD in ns.faults and rank == 0,
            never_load=faults.NEVER_LOAD in ns.faults,
            orphan=faults.ORPHAN_SCHEDULERS in ns.faults,
        )
        for rank, (title, prefix) in enumerate(rank_names(ns.tp_size, ns.dp_size))
    ]


class Server:
    """The main process after validation: children, HTTP, warm-up, and the SIGTERM drain."""

    def __init__(self, ns, state: ServerState):
        self.ns = ns
        self.state = state
        self.supervisor = Supervisor()
        self.stopping = threading.Event()
        self.httpd = make_server(state)

    def _on_sigterm(self, signum, frame) -> None:
        self.stopping.set()

    def bind(self) -> None:
        """Take the port now, so a port in use fails before any GPU memory is claimed."""
        self.httpd.server_bind()

    def load(self, plans: list[RankPlan]) -> None:
        self.supervisor.close_in_children = [self.httpd.fileno()]
        signal.signal(signal.SIGQUIT, self.supervisor.on_sigquit)
        parent = os.getpid()
        for plan in plans:
            self.supervisor.spawn(f"scheduler_{plan.index}", lambda fd, p=plan: run_scheduler(p, fd, parent))
        self.supervisor.spawn("detokenizer", lambda fd: run_detokenizer(fd, parent, self.ns.log_level))
        started = time.monotonic()
        try:
            self.state.reports = self.supervisor.wait_reports()
        except ChildFailed as failure:
            logger.error(str(failure))
            self.supervisor.kill_tree_and_exit()
        self.state.startup_time = time.monotonic() - started

    def serve(self) -> int:
        self.httpd.server_activate()
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()
        logs.uvicorn_line(f"Started server process [{os.getpid()}]")
        logs.uvicorn_line("Waiting for application startup.")
        logs.uvicorn_line("Application startup complete.")
        logs.uvicorn_line(f"Uvicorn running on http://{self.ns.host}:{self.ns.port} (Press CTRL+C to quit)")
        threading.Thread(target=self._warmup, name="warmup", daemon=True).start()
        while not self.stopping.wait(0.2):
            dead = self.supervisor.dead_child()
            if dead is not None:
                logger.error(
                    "Subprocess %s (pid=%d) crashed with exit code %s. Triggering SIGQUIT for cleanup...",
                    dead.name,
                    dead.pid,
                    dead.exit_code,
                )
                self.supervisor.kill_tree_and_exit()
            if self.supervisor.sigquit:
                logger.error("SIGQUIT received. It usually means one child failed.")
                self.supervisor.kill_tree_and_exit()
        return self._shutdown()

    def _warmup(self) -> None:
        if self.stopping.wait(self.ns.sim_warmup_time):
            return
        engine = self.state.engine
        if not self.ns.skip_server_warmup and not engine.hangs:
            sampling = parse_sampling({"max_new_tokens": 8, "temperature": 0.0})
            engine.generate(new_request(WARMUP_PROMPT, None, sampling, False))
        if self.state.mark_up():
            logger.info("The server is fired up and ready to roll!")

    def _drain(self) -> None:
        deadline = time.monotonic() + self.ns.sim_drain_time
        slow = faults.SLOW_DRAIN in self.ns.faults
        while True:
            remaining = self.state.inflight
            left = deadline - time.monotonic()
            if left <= 0 or (remaining == 0 and not slow):
                return
            logger.info("Gracefully exiting... Remaining number of requests %d.", remaining)
            if slow:
                time.sleep(min(DRAIN_LOG_INTERVAL_S, left))
            else:
                self.state.wait_drained(min(DRAIN_LOG_INTERVAL_S, left))

    def _shutdown(self) -> int:
        logger.warning("SIGTERM received. Draining requests and shutting down...")
        self.state.begin_drain()
        self._drain()
        self.state.engine.abort.set()
        self.state.wait_drained(1.0)
        orphan = faults.ORPHAN_SCHEDULERS in self.ns.faults
        leftovers = self.supervisor.stop(SCHEDULER_EXIT_GRACE_S, kill_leftovers=not orphan)
        if leftovers and orphan:
            logger.warning(
                "Schedulers still alive %gs after ShutdownReq; they ignore SIGTERM and are left running: %s",
                SCHEDULER_EXIT_GRACE_S,
                leftovers,
            )
        elif leftovers:
            logger.warning(
                "Schedulers still alive %gs after ShutdownReq, killing them before they released: %s",
                SCHEDULER_EXIT_GRACE_S,
                leftovers,
            )
        self.httpd.shutdown()
        self.httpd.server_close()
        logs.uvicorn_line("Shutting down")
        logs.uvicorn_line(f"Finished server process [{os.getpid()}]")
        return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ns, ignored = args.parse(argv)
    _environment_settings(ns)
    logs.configure(ns.log_level)
    if ignored:
        logger.warning("Ignoring SGLang arguments the simulator does not model: %s", " ".join(ignored))
    try:
        installed = sources.locate()
    except sources.SglangNotInstalled as exc:
        logger.error("sglang_sim: %s", exc)
        return 1
    modified = sources.modified_sources(installed)
    try:
        declared = sources.declared_faults(installed, modified)
    except ValueError as exc:
        logger.error("sglang_sim: modified sglang source %s", exc)
        return 2
    for relative, names in declared.items():
        logger.warning("sglang_sim: the modified source %s declares faults: %s", relative, ", ".join(sorted(names)))
        args.add_faults(ns, names)
    model = info.read_model_config(ns.model_path, ns.context_length)
    spec = _resolve_spec(ns, installed, model)
    for warning in spec.warnings:
        logger.warning(warning)
    launch_command = shlex.join([sys.executable, "-m", "sglang_sim.launch_server", *argv])
    state = ServerState(
        ns, spec, model, _engine(ns, spec, model), version=installed.version(), launch_command=launch_command
    )
    logger.info("server_args=ServerArgs(%s)", ", ".join(f"{k}={v!r}" for k, v in state.args.items()))
    if ns.faults:
        logger.warning("sglang_sim faults on: %s", ", ".join(sorted(ns.faults)))
    sources.compile_sources(modified)
    server = Server(ns, state)
    try:
        server.bind()
    except OSError as exc:
        logger.error(
            "[Errno %s] error while attempting to bind on address ('%s', %s): %s",
            exc.errno,
            ns.host,
            ns.port,
            (exc.strerror or "").lower(),
        )
        return 1
    server.load(_plans(ns, spec, model))
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
