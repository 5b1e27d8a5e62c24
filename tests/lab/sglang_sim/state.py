"""The server's shared state: configuration, the engine, TokenizerManager's status flags and its requests.

Mirrors sglang/srt/managers/tokenizer_manager.py: `server_status` (Starting, Up, UnHealthy),
`gracefully_exit` (set by the SIGTERM handler), and `rid_to_state` (every request from its arrival until
its output or an acknowledged abort, health checks included), which the SIGTERM drain waits on.
"""

from __future__ import annotations

import threading
import time

from . import info
from .engine import ClientGone, Engine

STARTING, UP, UNHEALTHY = "Starting", "Up", "UnHealthy"


class ServerState:
    """What the handlers read and the lifecycle changes."""

    def __init__(self, ns, spec, model: info.ModelConfig, engine: Engine, *, version: str, launch_command: str):
        self.ns = ns
        self.spec = spec
        self.model = model
        self.engine = engine
        self.version = version
        self.launch_command = launch_command
        self.args = info.server_args(ns, spec, model)
        self.status = STARTING
        self.gracefully_exit = False
        self.startup_time = 0.0
        self.reports: list = []
        self._rids: dict[str, int] = {}
        self._lock = threading.Lock()
        self.first_request = threading.Event()  # TokenizerManager.auto_create_handle_loop has run
        self.handle_loop_started: float | None = None

    @property
    def max_total_num_tokens(self) -> int:
        tokens = [r.get("max_total_num_tokens", 0) for r in self.reports if "rank" in r]
        return min(tokens) if tokens else 0

    def is_healthy(self) -> bool:
        """TokenizerManager.is_healthy: up and not shutting down."""
        return not self.gracefully_exit and self.status == UP

    def start_handle_loop(self) -> None:
        """auto_create_handle_loop: from the first request on, TokenizerManager handles SIGTERM."""
        with self._lock:
            if self.handle_loop_started is None:
                self.handle_loop_started = time.monotonic()
        self.first_request.set()

    def enter(self, rid: str) -> None:
        """A request reaches generate_request (rid_to_state gets it; the handle loop exists from now on)."""
        self.start_handle_loop()
        with self._lock:
            self._rids[rid] = self._rids.get(rid, 0) + 1

    def leave(self, rid: str) -> None:
        with self._lock:
            left = self._rids.get(rid, 0) - 1
            if left > 0:
                self._rids[rid] = left
            else:
                self._rids.pop(rid, None)

    def remaining(self) -> list[str]:
        with self._lock:
            return list(self._rids)

    # -- generate_request: the engine, with the request in rid_to_state until it answers ------------------------
    @property
    def config(self):
        return self.engine.config

    def validate(self, request) -> None:
        self.engine.validate(request)

    def generate(self, request, emit=None, client_gone=None) -> dict:
        """A disconnected client's request stays in rid_to_state when the stuck scheduler never acknowledges it."""
        self.enter(request.rid)
        kept = False
        try:
            return self.engine.generate(request, emit, client_gone)
        except ClientGone as exc:
            kept = exc.kept
            raise
        finally:
            if not kept:
                self.leave(request.rid)

    def set_status(self, status: str) -> None:
        with self._lock:
            self.status = status

    def server_info(self) -> dict:
        rank0 = next((r for r in self.reports if r.get("rank") == 0), {})
        memory = info.memory_usage(
            rank0.get("weight_mib", 0),
            rank0.get("kv_mib", 0),
            rank0.get("graph_mib", 0),
            rank0.get("startup_available_mib", 0),
            rank0.get("max_total_num_tokens", 0),
        )
        state = info.internal_state(
            self.args,
            self.ns,
            startup_time=self.startup_time,
            last_gen_throughput=self.engine.gauges()[2],
            memory=memory,
            avg_accept_length=self.engine.stats.avg_accept_length(),
        )
        scheduler_info = {
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.model.context_len - 5,
        }
        return info.server_info(
            self.args,
            launch_command=self.launch_command,
            startup_time=self.startup_time,
            scheduler_info=scheduler_info,
            internal_states=[dict(state) for _rank in range(self.ns.dp_size)],
            version=self.version,
        )
