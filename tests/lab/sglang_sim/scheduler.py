"""The child processes: one scheduler per rank (it loads the model into its GPU's memory) and the detokenizer.

Each runs in a forked copy of the launcher and behaves as sglang/srt/managers/scheduler.py
`run_scheduler_process` and sglang/srt/managers/detokenizer_manager.py `run_detokenizer_process`:
`kill_itself_when_parent_died()` first (sglang/srt/utils/common.py: prctl(PR_SET_PDEATHSIG, SIGKILL)), then
setproctitle; no SIGTERM handler (SIGTERM kills them at once); a scheduler that fails logs "Scheduler hit an
exception: <traceback>" and sends SIGQUIT to its parent; a ShutdownReq (the main process's drain) makes a
scheduler leave its loop and exit 0. The scheduler's GPU is the CUDA device `gpu_id` of those
CUDA_VISIBLE_DEVICES leaves visible (cuda_devices.py), as torch.cuda.set_device(gpu_id) in model_runner.py.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import allreduce, cuda_devices, gpu_claims, jit, proctitle, rendezvous
from .logs import configure

logger = logging.getLogger("sglang_sim.scheduler")

WEIGHT_PHASE = 0.6
KV_PHASE = 0.85
WEIGHT_CHUNKS = 10
CRASH_AT_CHUNK = 5
KV_BYTES_PER_TOKEN = 128 * 1024
NO_DRIVER = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver from "
    "http://www.nvidia.com/Download/index.aspx"
)
INVALID_ORDINAL = (
    "CUDA error: invalid device ordinal\n"
    "GPU device may be out of range, do you have enough GPUs?\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


class OutOfMemoryError(RuntimeError):
    """Stands for torch.OutOfMemoryError, so the traceback's last line reads like PyTorch's."""


class AcceleratorError(RuntimeError):
    """Stands for torch.AcceleratorError (torch >= 2.8 raises it for CUDA errors)."""


OutOfMemoryError.__module__ = "torch"
AcceleratorError.__module__ = "torch"


@dataclass(frozen=True)
class RankPlan:
    index: int
    title: str
    log_prefix: str
    gpu_id: int
    tp_rank: int
    tp_size: int
    package_dir: Path | None
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
    # --pp-size > 1: the scheduler runs event_loop_pp (managers/scheduler_pp_mixin.py), which never checks for
    # ShutdownReq; the main process kills it 15 s later, "before they released".
    pipeline: bool = False
    # Why the custom all-reduce fails to set up (allreduce.py), or None.
    allreduce_error: str | None = None
    # A multi-node engine's rendezvous (rendezvous.py), or None on one node.
    group: rendezvous.GroupPlan | None = None


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


def _device(plan: RankPlan) -> cuda_devices.CudaDevice:
    """torch.cuda.set_device(gpu_id) as model_runner.py calls it, with its warning on failure."""
    try:
        gpus = gpu_claims.read_gpus()
    except gpu_claims.StateError as exc:
        if not gpu_claims.state_dir().joinpath("gpus").exists():
            raise RuntimeError(NO_DRIVER) from None
        raise RuntimeError(f"simgpu: {exc}") from None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = cuda_devices.visible_devices(gpus, visible)
    if not devices:
        raise RuntimeError("No CUDA GPUs are available")
    if plan.gpu_id >= len(devices):
        logger.warning(
            "Context: self.device='cuda' get_device().gpu_id=%d os.environ.get('CUDA_VISIBLE_DEVICES')=%r "
            "get_parallel().tp_rank=%d get_parallel().tp_size=%d",
            plan.gpu_id,
            visible,
            plan.tp_rank,
            plan.tp_size,
        )
        raise AcceleratorError(INVALID_ORDINAL)
    return devices[plan.gpu_id]


def _gib(mib: float) -> float:
    return mib / 1024


def _oom_message(gpu_id: int, gpu: cuda_devices.CudaDevice, wanted_mib: int, free_mib: int, own_mib: int) -> str:
    return (
        f"CUDA out of memory. Tried to allocate {_gib(wanted_mib):.2f} GiB. GPU {gpu_id} has a total capacity of "
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
        self.gpu = _device(plan)
        if plan.allreduce_error is not None:
            # init_model_parallel, before the weights load (parallel_state.py:503-517)
            logger.warning(allreduce.SETUP_FAILED, plan.allreduce_error)

    def _free(self) -> int:
        return gpu_claims.free_mib(self.gpu, exclude_pid=self.pid) - self.claimed

    def _sleep_until(self, fraction: float) -> None:
        delay = self.start + self.plan.load_time * fraction - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _claim(self, mib: int) -> None:
        self.claimed += mib
        if not self.plan.never_load:
            gpu_claims.write_claim(self.gpu, self.pid, self.claimed)

    def load(self) -> dict:
        plan = self.plan
        started_free = self._free()
        logger.info("Load weight begin. avail mem=%.2f GB", _gib(started_free))
        weight_mib = int(plan.weight_fraction * self.gpu.total_mib)
        for chunk in range(1, WEIGHT_CHUNKS + 1):
            self._sleep_until(WEIGHT_PHASE * chunk / WEIGHT_CHUNKS)
            if plan.crash and chunk == CRASH_AT_CHUNK:
                raise RuntimeError("Simulated crash while loading the weights (--sim-fault crash-on-load).")
            wanted = weight_mib * chunk // WEIGHT_CHUNKS - self.claimed
            free = self._free()
            if not plan.never_load and wanted > free:
                raise OutOfMemoryError(_oom_message(plan.gpu_id, self.gpu, wanted, free, self.claimed))
            self._claim(wanted)
        logger.info(
            "Load weight end. elapsed=%.2f s, type=%s, avail mem=%.2f GB, mem usage=%.2f GB.",
            time.monotonic() - self.start,
            plan.architecture,
            _gib(self._free()),
            _gib(weight_mib),
        )
        self._sleep_until(KV_PHASE)
        jit.load_kernel(plan.package_dir)
        reserved = self.gpu.total_mib * (1.0 - plan.mem_fraction_static)
        kv_mib = (
            int(self._free() - reserved)
            if not plan.never_load
            else int(self.gpu.total_mib * plan.mem_fraction_static - weight_mib)
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
                + _oom_message(plan.gpu_id, self.gpu, overhead, free, self.claimed)
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
            "gpu": self.gpu.label,
            "weight_mib": weight_mib,
            "kv_mib": kv_mib,
            "graph_mib": overhead,
            "startup_available_mib": started_free,
            "max_total_num_tokens": tokens,
            "claimed_mib": 0 if plan.never_load else self.claimed,
        }


def _serve(control_fd: int, obeys_shutdown: bool, group=None) -> int:
    """The event loop: blocks until ShutdownReq (then 0). SIGTERM or the parent-death SIGKILL end it sooner.

    In a multi-node group (`group`: (plan, link, store)), rank 0's ShutdownReq reaches every rank over the link,
    and a link that closes is a dead peer: the next broadcast fails.
    """
    plan, link, store = group or (None, None, None)
    watched = [control_fd] + ([link] if link is not None else [])
    while True:
        try:
            readable = select.select(watched, [], [])[0]
        except InterruptedError:
            continue
        if link is not None and link in readable:
            data = link.recv(64)
            if not data:
                raise rendezvous.connection_closed(plan)
            if obeys_shutdown and rendezvous.SHUTDOWN in data:
                return 0
        if control_fd not in readable:
            continue
        data = os.read(control_fd, 64)
        if not data:
            # The main process is gone without our parent-death signal: a real scheduler blocks on its
            # socket forever, holding its GPU memory.
            while True:
                signal.pause()
        if obeys_shutdown and b"shutdown" in data:
            if link is not None and store is None:
                # Only TP rank 0 reads ShutdownReq from the tokenizer manager; every other rank of the group gets it
                # in rank 0's broadcast (request_receiver.py `_pull_raw_reqs`, `_broadcast_reqs_across_ranks`).
                # Leaving at once would close its link first, and the others would read a dead peer.
                continue
            if store is not None:
                store.shutdown()
            return 0


def run_scheduler(plan: RankPlan, report_fd: int, control_fd: int) -> int:
    """Body of a scheduler process; returns its exit status."""
    parent_pid = os.getppid()
    if plan.orphan:
        # The fault: a scheduler that outlives its parent on every path, as one that escaped its process tree.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    else:
        proctitle.set_parent_death_signal(signal.SIGKILL)
    proctitle.set_title(plan.title)
    configure(plan.log_level, plan.log_prefix)
    group = None
    try:
        if plan.group is not None:
            # init_torch_distributed comes before the weights load (model_runner.py)
            store = rendezvous.Store(plan.group) if plan.group.hosts_store else None
            group = (plan.group, rendezvous.join(plan.group, store), store)
        report = Loader(plan).load()
        os.write(report_fd, (json.dumps(report) + "\n").encode())
        status = _serve(control_fd, obeys_shutdown=not (plan.orphan or plan.pipeline), group=group)
    except Exception:
        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        try:
            os.kill(parent_pid, signal.SIGQUIT)
        except ProcessLookupError:
            pass
        return 1
    gpu_claims.mark_exiting(os.getpid())  # leaving the loop releases the GPU memory
    return status


def run_detokenizer(report_fd: int, control_fd: int, log_level: str) -> int:
    proctitle.set_parent_death_signal(signal.SIGKILL)
    proctitle.set_title("sglang::detokenizer")
    configure(log_level)
    os.write(report_fd, b'{"detokenizer": true}\n')
    return _serve(control_fd, obeys_shutdown=False)
