"""The server's shared state: configuration, the engine, the lifecycle status and the requests in flight."""

from __future__ import annotations

import threading

from . import info
from .engine import Engine

STARTING, UP, DRAINING = "Starting", "Up", "Draining"


class ServerState:
    """What the handlers read: configuration, the engine, the lifecycle status and in-flight requests."""

    def __init__(self, ns, spec, model: info.ModelConfig, engine: Engine, *, version: str, launch_command: str):
        self.ns = ns
        self.spec = spec
        self.model = model
        self.engine = engine
        self.version = version
        self.launch_command = launch_command
        self.args = info.server_args(ns, spec, model)
        self.status = STARTING
        self.startup_time = 0.0
        self.reports: list = []
        self._inflight = 0
        self._lock = threading.Condition()

    @property
    def max_total_num_tokens(self) -> int:
        tokens = [r.get("max_total_num_tokens", 0) for r in self.reports if "rank" in r]
        return min(tokens) if tokens else 0

    def enter(self) -> bool:
        with self._lock:
            if self.status == DRAINING:
                return False
            self._inflight += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._lock.notify_all()

    @property
    def inflight(self) -> int:
        with self._lock:
            return self._inflight

    def mark_up(self) -> bool:
        with self._lock:
            if self.status == STARTING:
                self.status = UP
            return self.status == UP

    def begin_drain(self) -> None:
        with self._lock:
            self.status = DRAINING

    def wait_drained(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._inflight == 0, timeout)

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
            last_gen_throughput=self.engine.stats.gen_throughput(),
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
