"""The child processes: one scheduler per rank (it loads the model into its GPU's memory) and the detokenizer.

Each runs in a forked copy of the launcher, retitles itself as SGLang's do, and reports on a pipe.
A scheduler that fails logs "Scheduler hit an exception: <traceback>" and sends SIGQUIT to its parent,
as SGLang's run_scheduler_process does.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import traceback
from dataclasses import dataclass

from . import gpu_claims, proctitle
from .logs import configure

logger = logging.getLogger("sglang_sim.scheduler")

WEIGHT_PHASE = 0.6
KV_PHASE = 0.85
WEIGHT_CHUNKS = 10
CRASH_AT_CHUNK = 5
KV_BYTES_PER_TOKEN = 128 * 1024
PARENT_POLL_S = 0.5
CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


class OutOfMemoryError(RuntimeError):
    """Stands for torch.OutOfMemoryError, so the traceback's last line reads like PyTorch's."""


OutOfMemoryError.__module__ = "torch"


@dataclass(frozen=True)
class RankPlan:
    index: int
    title: str
    log_prefix: str
    gpu: gpu_claims.SimGpu
    load_time: float
    weight_fraction: float
    mem_fraction_static: float
    graph_mib: int
    draft_mib: int
    architecture: str
    log_level: str
    crash: bool
    never_load: bool
    orphan: bool


def rank_names(tp_size: int, dp_size: int) -> list[tuple[str, str]]:
    """(process title, log prefix) per rank, DP-major: sglang::scheduler_TP1, sglang::scheduler_DP0_TP1, ..."""
    names = []
    for dp_rank in range(dp_size):
        for tp_rank in range(tp_size):
            prefix = ""
            if dp_size > 1:
                prefix += f" DP{dp_rank}"
            if tp_size > 1:
                prefix += f" TP{tp_rank}"
            names.append((f"sglang::scheduler{prefix.replace(' ', '_')}", prefix))
    return names


def _gib(mib: float) -> float:
    return mib / 1024


def _oom_message(gpu: gpu_claims.SimGpu, wanted_mib: int, free_mib: int, own_mib: int) -> str:
    return (
        f"CUDA out of memory. Tried to allocate {_gib(wanted_mib):.2f} GiB. GPU {gpu.index} has a total capacity of "
        f"{_gib(gpu.total_mib):.2f} GiB of which {_gib(max(free_mib, 0)):.2f} GiB is free. Including non-PyTorch "
        f"memory, this process has {_gib(own_mib):.2f} GiB memory in use. Of the allocated memory "
        f"{_gib(own_mib):.2f} GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


class Loader:
    """One scheduler's load: weights, then the KV cache pool, then CUDA graphs and the draft model."""

    def __init__(self, plan: RankPlan):
        self.plan = plan
        self.pid = os.getpid()
        self.claimed = 0
        self.start = time.monotonic()

    def _free(self) -> int:
        return gpu_claims.free_mib(self.plan.gpu)

    def _sleep_until(self, fraction: float) -> None:
        delay = self.start + self.plan.load_time * fraction - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _claim(self, mib: int) -> None:
        self.claimed += mib
        if not self.plan.never_load:
            gpu_claims.write_claim(self.plan.gpu.index, self.pid, self.claimed)

    def load(self) -> dict:
        plan = self.plan
        started_free = self._free()
        logger.info("Load weight begin. avail mem=%.2f GB", _gib(started_free))
        weight_mib = int(plan.weight_fraction * plan.gpu.total_mib)
        for chunk in range(1, WEIGHT_CHUNKS + 1):
            self._sleep_until(WEIGHT_PHASE * chunk / WEIGHT_CHUNKS)
            if plan.crash and chunk == CRASH_AT_CHUNK:
                raise RuntimeError("Simulated crash while loading the weights (--sim-fault crash-on-load).")
            wanted = weight_mib * chunk // WEIGHT_CHUNKS - self.claimed
            free = self._free()
            if not plan.never_load and wanted > free:
                raise OutOfMemoryError(_oom_message(plan.gpu, wanted, free, self.claimed))
            self._claim(wanted)
        logger.info(
            "Load weight end. elapsed=%.2f s, type=%s, avail mem=%.2f GB, mem usage=%.2f GB.",
            time.monotonic() - self.start,
            plan.architecture,
            _gib(self._free()),
            _gib(weight_mib),
        )
        self._sleep_until(KV_PHASE)
        reserved = plan.gpu.total_mib * (1.0 - plan.mem_fraction_static)
        kv_mib = (
            int(self._free() - reserved)
            if not plan.never_load
            else int(plan.gpu.total_mib * plan.mem_fraction_static - weight_mib)
        )
        if kv_mib <= 0:
            raise RuntimeError(
                "Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: mem_fraction_static={plan.mem_fraction_static}"
            )
        self._claim(kv_mib)
        tokens = kv_mib * 1024 * 1024 // KV_BYTES_PER_TOKEN
        logger.info(
            "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB",
            tokens,
            _gib(kv_mib) / 2,
            _gib(kv_mib) / 2,
        )
        logger.info("Memory pool end. avail mem=%.2f GB", _gib(self._free()))
        self._sleep_until(1.0)
        overhead = plan.graph_mib + plan.draft_mib
        free = self._free()
        if not plan.never_load and overhead > free:
            raise RuntimeError(
                "Capture cuda graph failed: "
                + _oom_message(plan.gpu, overhead, free, self.claimed)
                + "\n"
                + CUDA_GRAPH_CAPTURE_FAILED_MSG
            )
        self._claim(overhead)
        logger.info(
            "Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB.",
            time.monotonic() - self.start,
            _gib(overhead),
            _gib(self._free()),
        )
        return {
            "rank": plan.index,
            "pid": self.pid,
            "gpu": plan.gpu.index,
            "weight_mib": weight_mib,
            "kv_mib": kv_mib,
            "graph_mib": overhead,
            "startup_available_mib": started_free,
            "max_total_num_tokens": tokens,
            "claimed_mib": 0 if plan.never_load else self.claimed,
        }


def _idle(parent_pid: int, watch_parent: bool) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if watch_parent and os.getppid() != parent_pid:
            return


def _exit_on_sigterm(cleanup) -> None:
    def handler(signum, frame):
        cleanup()
        os._exit(0)

    signal.signal(signal.SIGTERM, handler)


def run_scheduler(plan: RankPlan, report_fd: int, parent_pid: int) -> int:
    """Body of a scheduler process; returns its exit status."""
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    proctitle.set_title(plan.title)
    configure(plan.log_level, plan.log_prefix)

    def cleanup() -> None:
        gpu_claims.remove_claim(plan.gpu.index, os.getpid())

    if plan.orphan:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    else:
        _exit_on_sigterm(cleanup)
        proctitle.set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent_pid:
            cleanup()
            return 0
    try:
        report = Loader(plan).load()
        os.write(report_fd, (json.dumps(report) + "\n").encode())
    except Exception:
        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        cleanup()
        try:
            os.kill(parent_pid, signal.SIGQUIT)
        except ProcessLookupError:
            pass
        return 1
    _idle(parent_pid, watch_parent=not plan.orphan)
    cleanup()
    return 0


def run_detokenizer(report_fd: int, parent_pid: int, log_level: str) -> int:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    proctitle.set_title("sglang::detokenizer")
    configure(log_level)
    _exit_on_sigterm(lambda: None)
    proctitle.set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent_pid:
        return 0
    os.write(report_fd, b'{"detokenizer": true}\n')
    _idle(parent_pid, watch_parent=True)
    return 0
