"""`python -m sglang_sim.launch_server`: the simulated SGLang server's main process.

Order of a launch, as sglang/launch_server.py, sglang/srt/server_args.py (`prepare_server_args`, with the
`--config` merge), sglang/srt/entrypoints/engine.py (`_launch_subprocesses`) and
sglang/srt/entrypoints/http_server.py (`launch_server`, uvicorn): the interpreter (the wheel needs Python
>= 3.11), the config file, the arguments; the installed sglang (modified sources must compile, the algorithm
must exist; a modified source may declare faults, see sources.py); `server_args=` logged; the schedulers and
the detokenizer started, every scheduler loaded; the subprocess watchdog; uvicorn's startup (the warm-up
thread starts, then the port is bound); /health 503 until the warm-up is done. lifecycle.py takes it from there.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import (
    adaptive,
    allreduce,
    args,
    configfile,
    faults,
    info,
    lifecycle,
    logs,
    rendezvous,
    sources,
    spec_args,
    specmodel,
)
from .engine import Engine, EngineConfig
from .http_api import make_server
from .scheduler import RankPlan, rank_names, run_detokenizer, run_scheduler
from .state import ServerState
from .supervisor import Supervisor

logger = logging.getLogger("sglang_sim")

REQUIRED_PYTHON = (3, 11)  # the wheel's METADATA: Requires-Python: >=3.11
DEFAULT_HEALTH_CHECK_TIMEOUT = 20
BOOL_TRUE = ("true", "1", "yes", "y")  # environ.py EnvBool
BOOL_FALSE = ("false", "0", "no", "n")


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.lower() in BOOL_TRUE:
        return True
    if raw.lower() in BOOL_FALSE:
        return False
    warnings.warn(
        f'Invalid value for {name}: "{raw.lower()}" is not a valid boolean value, using default "{default}"',
        stacklevel=2,
    )
    return default


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        warnings.warn(
            f'Invalid value for {name}: "{raw}" is not a valid float value, using default "{default}"',
            stacklevel=2,
        )
        return default


def _environment_settings(ns) -> None:
    """The variables SGLang reads: http_server.py's int() at import (a bad value is a traceback) and environ.py's."""
    ns.health_check_timeout = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", DEFAULT_HEALTH_CHECK_TIMEOUT))
    ns.health_generates = _env_bool("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True)
    ns.warmup_timeout = _env_float("SGLANG_WARMUP_TIMEOUT", -1.0)


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
        adaptive=spec_args.AdaptiveFlags(
            enabled=ns.speculative_adaptive,
            config=ns.speculative_adaptive_config,
            attn_dp_size=ns.attn_dp_size,
            enable_multi_layer_eagle=ns.enable_multi_layer_eagle,
            enable_two_batch_overlap=ns.enable_two_batch_overlap,
            enable_pdmux=ns.enable_pdmux,
        ),
    )


def _engine(ns, spec: spec_args.SpecConfig, model: info.ModelConfig, max_running: int) -> Engine:
    params = None
    if spec.enabled:
        params = specmodel.params_for(
            spec.algorithm,
            ns.sim_spec_accept_prob,
            ns.sim_spec_draft_step_cost,
            ns.sim_spec_topk_cost,
            ns.sim_spec_verify_token_cost,
            ns.sim_spec_draft_batch_cost,
            ns.sim_spec_verify_batch_cost,
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    nccl = allreduce.uses_nccl(ns.tp_size, ns.disable_custom_all_reduce, visible)
    slowdown = ns.faults.get(faults.SLOWDOWN) or 1.0  # the slowdown=F fault: every decode step F times as long
    chosen = dict(ns.faults)
    if spec.enabled and chosen.get(faults.LOSSY_STEPS, -1) == spec.num_steps:  # a draft that is not lossless here
        chosen.setdefault(faults.OUTPUT_DRIFT, faults.FAULTS[faults.OUTPUT_DRIFT].default)
    return Engine(
        EngineConfig(
            token_latency_s=ns.sim_token_latency_ms
            / 1000.0
            * (1.0 + (ns.sim_nccl_allreduce_cost if nccl else 0.0))
            * slowdown,
            prefill_s_per_token=ns.sim_prefill_ms_per_token / 1000.0,
            seed=ns.sim_seed,
            noise=ns.sim_noise,
            batch_slowdown=ns.sim_batch_slowdown,
            max_running_requests=max_running,
            context_length=model.context_len,
            stream_interval=ns.stream_interval,
            incremental_streaming=ns.incremental_streaming_output,
            spec=spec,
            spec_params=params,
            adaptive=_adaptive_params(spec, max_running),
            faults=chosen,
            decode_log_interval=ns.decode_log_interval,
            model=ns.model_path,
        )
    )


def _adaptive_params(spec: spec_args.SpecConfig, max_running: int) -> adaptive.AdaptiveParams | None:
    """The worker's AdaptiveSpeculativeParams, routed through the CUDA-graph batch sizes up to max running."""
    if not spec.adaptive:
        return None
    return adaptive.AdaptiveParams(spec.num_steps, spec.adaptive_config, adaptive.decode_cuda_graph_bs(max_running))


def _plans(ns, spec: spec_args.SpecConfig, model: info.ModelConfig, installed) -> list[RankPlan]:
    draft_mib = 0
    if spec.enabled:
        # Adaptive builds a runtime state (buffers, CUDA graphs) for every candidate: the deepest one sizes them.
        deepest = max(spec.candidate_steps) if spec.adaptive else None
        draft_mib = specmodel.draft_memory_mib(
            spec.num_steps if deepest is None else deepest,
            spec.eagle_topk,
            spec.num_draft_tokens if deepest is None else deepest + 1,
            ns.sim_draft_base_mib,
            ns.sim_mem_overhead_mib_per_draft_token,
        )
    architecture = (model.architectures or ["LlamaForCausalLM"])[0]
    allreduce_error = allreduce.setup_error(
        ns.tp_size, ns.disable_custom_all_reduce, os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    plans = []
    names = rank_names(ns.tp_size, ns.dp_size)
    ranks = node_ranks(ns.tp_size, ns.dp_size, ns.nnodes, ns.node_rank)
    address = _dist_init_address(ns)
    for rank, global_rank in enumerate(ranks):
        title, prefix = names[global_rank]
        dp_rank, tp_rank = divmod(global_rank, ns.tp_size)
        # engine.py / data_parallel_controller.py: base_gpu_id + dp offset + tp_rank * gpu_id_step; on several
        # nodes the rank within the node's range (engine.py _launch_scheduler_processes, tp_rank % tp_size_per_node)
        local_tp = tp_rank % (ns.tp_size // ns.nnodes)
        gpu_id = ns.base_gpu_id + dp_rank * ns.tp_size * ns.gpu_id_step + local_tp * ns.gpu_id_step
        group = None
        if ns.nnodes > 1:
            group = rendezvous.GroupPlan(
                host=address[0],
                port=address[1],
                world_size=ns.tp_size,
                rank=tp_rank,
                timeout_s=ns.dist_timeout if ns.dist_timeout is not None else rendezvous.DEFAULT_TIMEOUT_S,
            )
        plans.append(
            RankPlan(
                index=rank,
                title=title,
                log_prefix=prefix,
                gpu_id=gpu_id,
                tp_rank=tp_rank,
                tp_size=ns.tp_size,
                package_dir=installed.package_dir,
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
                pipeline=ns.pp_size > 1,
                allreduce_error=allreduce_error,
                group=group,
            )
        )
    return plans


def node_ranks(tp_size: int, dp_size: int, nnodes: int, node_rank: int) -> list[int]:
    """The ranks (DP-major, then TP) whose schedulers this node runs: on one node every rank of every replica; on
    several (no DP there) this node's range of TP ranks (engine.py `_calculate_rank_ranges`, pp_size 1)."""
    if nnodes == 1:
        return list(range(tp_size * dp_size))
    per_node = tp_size // nnodes
    return list(range(per_node * node_rank, per_node * (node_rank + 1)))


def _dist_init_address(ns) -> tuple[str, int]:
    """--dist-init-addr, else the serving host and a free local port (bootstrap.py `_resolve_dist_init_method` with
    PortArgs' random nccl_port): on several nodes each then waits on an address of its own until the timeout."""
    if ns.dist_init_addr:
        return rendezvous.parse_addr(ns.dist_init_addr)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return (ns.host or "127.0.0.1", probe.getsockname()[1])


def check_server_args(ns) -> None:
    """The assertions of arg_groups/validation_hook.py `check_server_args` on the multi-node flags (pp_size 1)."""
    assert ns.tp_size % ns.nnodes == 0, "tp_size must be divisible by number of nodes"
    assert not (ns.dp_size > 1 and ns.nnodes != 1), (
        "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes"
    )


def _launch(ns, argv: list[str], ignored: list[str]) -> int:
    _environment_settings(ns)
    logs.configure(ns.log_level)
    check_server_args(ns)
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
    server_args = info.server_args(ns, spec, model)
    engine = _engine(ns, spec, model, server_args["max_running_requests"])
    # launch_command: the (config-merged) arguments, as prepare_server_args records them.
    state = ServerState(ns, spec, model, engine, version=installed.version(), launch_command=" ".join(argv))
    logger.info("server_args=%r", state.args)
    if ns.faults:
        shown = [name if value is None else f"{name}={value}" for name, value in sorted(ns.faults.items())]
        logger.warning("sglang_sim faults on: %s", ", ".join(shown))
    sources.compile_sources(modified)

    if ns.node_rank >= 1:
        return _follower(ns, spec, model, installed)
    supervisor = Supervisor()
    httpd = make_server(state)
    life = lifecycle.Lifecycle(ns, state, supervisor, httpd)
    signal.signal(signal.SIGQUIT, life._on_sigquit)  # launch_phase_sigquit_handler
    supervisor.close_in_children = [httpd.fileno()]
    try:
        _spawn_schedulers(supervisor, _plans(ns, spec, model, installed))
        supervisor.spawn("detokenizer", lambda report, control: run_detokenizer(report, control, ns.log_level), False)
        state.reports = supervisor.wait_ready()
        supervisor.start_watchdog()
        return _uvicorn(ns, life, httpd)
    finally:
        supervisor.kill_process_tree(include_parent=False)  # launch_server.py's `finally`


def _spawn_schedulers(supervisor, plans) -> None:
    for plan in plans:
        supervisor.spawn(
            f"scheduler_{plan.index}",
            lambda report, control, p=plan: run_scheduler(p, report, control),
            scheduler=True,
            escapes_kill=plan.orphan,
        )


def _follower(ns, spec, model, installed) -> int:
    """A node of rank >= 1 (engine.py `_launch_subprocesses`, node_rank >= 1; http_server.py `launch_server` returns
    after it): its schedulers only (no detokenizer, no tokenizer manager, no API), a SIGTERM handler that only
    logs, once they are ready a dummy health server on --host/--port (utils/common.py
    `launch_dummy_health_check_server`: /ping, /health, /health_generate answer 200, nothing else), then it waits
    for the schedulers to exit; launch_server.py's `finally` kills what is left and the process exits 0."""
    supervisor = Supervisor()

    def on_sigquit(signum, frame) -> None:  # launch_phase_sigquit_handler
        logger.error("Received sigquit from a child process. It usually means the child failed.")
        supervisor.kill_process_tree(include_parent=True)

    signal.signal(signal.SIGQUIT, on_sigquit)
    try:
        _spawn_schedulers(supervisor, _plans(ns, spec, model, installed))
        supervisor.wait_ready()

        def on_sigterm(signum, frame) -> None:
            logger.warning(
                "SIGTERM received on node_rank %s; waiting for the rank-0 ShutdownReq broadcast to stop "
                "the schedulers.",
                ns.node_rank,
            )

        signal.signal(signal.SIGTERM, on_sigterm)
        model_name = ns.served_model_name or ns.model_path
        local_tp = node_ranks(ns.tp_size, ns.dp_size, ns.nnodes, ns.node_rank)
        exposition = follower_metrics(model_name, local_tp) if ns.enable_metrics else None
        health = make_dummy_health_server(ns.host, ns.port, exposition)
        threading.Thread(target=health.serve_forever, name="health-check-server", daemon=True).start()
        logger.info("Dummy health check server started in background thread at %s:%s", ns.host, ns.port)
        for child in supervisor.schedulers:
            while supervisor.poll(child) is None:
                time.sleep(0.2)
            logger.error("Scheduler or DataParallelController %s terminated with %s", child.pid, child.exit_code)
        return 0
    finally:
        supervisor.kill_process_tree(include_parent=False)  # launch_server.py's `finally`


def follower_metrics(model_name: str, tp_ranks: list[int]) -> str:
    """What /metrics shows on a rank >= 1 with --enable-metrics (utils/common.py `launch_dummy_health_check_server`
    adds `add_prometheus_middleware`: the multiprocess registry of this node's schedulers; no tokenizer metrics and no
    sglang:http_requests_active, which only the main API server initialises). An idle node's gauges: rank 0 holds
    the requests."""
    lines = []
    for name, doc in (
        ("sglang:num_running_reqs", "The number of running requests."),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    ):
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        for rank in tp_ranks:
            lines.append(
                f'{name}{{model_name="{model_name}",engine_type="unified",tp_rank="{rank}",pp_rank="0",'
                f'moe_ep_rank="0"}} 0.0'
            )
    return "\n".join(lines) + "\n"


def make_dummy_health_server(host: str, port: int, metrics_text: str | None = None) -> ThreadingHTTPServer:
    class DummyHealth(BaseHTTPRequestHandler):
        def log_message(self, format, *args) -> None:  # uvicorn runs it at log level warning: no access lines
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/ping", "/health", "/health_generate"):
                body, status = b"", 200
            elif metrics_text is not None and path.startswith("/metrics") and self.command == "GET":
                body, status = metrics_text.encode(), 200
            else:
                body, status = b'{"detail":"Not Found"}', 404
            self.send_response(status)
            kind = "text/plain; version=0.0.4; charset=utf-8" if path.startswith("/metrics") else "application/json"
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    server = ThreadingHTTPServer((host, port), DummyHealth)
    server.daemon_threads = True
    return server


def _uvicorn(ns, life: lifecycle.Lifecycle, httpd) -> int:
    life.install_signals()  # uvicorn's capture_signals
    logs.uvicorn_line(f"Started server process [{os.getpid()}]")
    logs.uvicorn_line("Waiting for application startup.")
    life.start_warmup()  # the lifespan starts the warm-up thread
    logs.uvicorn_line("Application startup complete.")
    try:
        httpd.server_bind()
    except OSError as exc:
        logs.uvicorn_line(
            f"[Errno {exc.errno}] error while attempting to bind on address ('{ns.host}', {ns.port}): "
            f"{(exc.strerror or '').lower()}",
            level="ERROR",
        )
        logs.uvicorn_line("Waiting for application shutdown.")
        logs.uvicorn_line("Application shutdown complete.")
        return 1
    return life.serve()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if sys.version_info < REQUIRED_PYTHON:
        # pip will not install the wheel for an older interpreter, so `python -m sglang.launch_server` finds nothing.
        print(
            f"{sys.executable}: Error while finding module specification for 'sglang.launch_server' "
            "(ModuleNotFoundError: No module named 'sglang')",
            file=sys.stderr,
        )
        return 1
    argv = configfile.merge(argv, args.store_true_keys(args.build_parser()))
    ns, ignored = args.parse(argv)
    return _launch(ns, argv, ignored)


if __name__ == "__main__":
    sys.exit(main())
