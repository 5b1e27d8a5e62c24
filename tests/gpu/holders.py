"""GPU memory holders for the conformance kit: processes titled as SGLang's that hold GPU memory until killed.

Two backends, chosen by what the machine has:

- ``cuda``: the NVIDIA driver's ``libcuda.so.1`` through ctypes: ``cuInit``, the device's primary context (what
  the CUDA runtime, and so torch, uses), ``cuMemAlloc``. NVML then lists the process with its memory.
- ``simgpu``: the lab's simulated GPU: a claim file per (GPU, PID) in simgpu's state directory, written through
  simgpu's own module (``simgpu_state``), as the lab's simulated engine does.

Run as a script (``python3 holders.py hold|parent|enumerate ...``): the kit starts holders this way, so each is a
real process of its own. Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SIMGPU_LIB_DIRS = ("/usr/local/lib/simgpu", str(REPO / "tests" / "lab" / "simgpu"))
PROCTITLE = REPO / "tests" / "lab" / "sglang_sim" / "proctitle.py"
SIMGPU_DEFAULT_STATE_DIR = "/var/lib/simgpu"
BACKENDS = ("cuda", "simgpu")
MIB = 1024 * 1024
READY_TIMEOUT_S = 120.0


class HolderError(Exception):
    """A holder could not start or a backend is not usable; the message says why."""


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def set_title(title: str) -> None:
    """The title SGLang's processes carry (setproctitle: argv block and comm), set as the lab's simulated engine
    sets it (tests/lab/sglang_sim/proctitle.py)."""
    _load("gpu_kit_proctitle", PROCTITLE).set_title(title)


def simgpu_state():
    """simgpu's own reading of its state directory: the host's installed copy first, else the checkout's."""
    for directory in SIMGPU_LIB_DIRS:
        path = Path(directory) / "simgpu_state.py"
        if path.is_file():
            if directory not in sys.path:
                sys.path.append(directory)
            import simgpu_state

            return simgpu_state
    raise HolderError(f"simgpu_state.py not found in {', '.join(SIMGPU_LIB_DIRS)}")


# -- CUDA driver API -------------------------------------------------------------------------------------------


class Cuda:
    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise HolderError(f"libcuda.so.1 not loadable: {exc}") from None

    def check(self, code: int, call: str) -> None:
        if code == 0:
            return
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        raw = name.value
        text = raw.decode() if raw is not None else f"CUresult {code}"
        raise HolderError(f"{call} failed: {text} ({code})")

    def init(self) -> None:
        self.check(self.lib.cuInit(0), "cuInit")

    def devices(self) -> list:
        count = ctypes.c_int()
        self.check(self.lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        found = []
        for ordinal in range(count.value):
            device = ctypes.c_int()
            self.check(self.lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
            raw = (ctypes.c_ubyte * 16)()
            getter = getattr(self.lib, "cuDeviceGetUuid_v2", None) or self.lib.cuDeviceGetUuid
            self.check(getter(raw, device), "cuDeviceGetUuid")
            text = bytes(raw).hex()
            uuid = f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
            bus = ctypes.create_string_buffer(64)
            self.check(self.lib.cuDeviceGetPCIBusId(bus, 64, device), "cuDeviceGetPCIBusId")
            name = ctypes.create_string_buffer(256)
            self.check(self.lib.cuDeviceGetName(name, 256, device), "cuDeviceGetName")
            found.append(
                {"ordinal": ordinal, "uuid": uuid, "pci_bus_id": bus.value.decode(), "name": name.value.decode()}
            )
        return found

    def hold(self, mib: int) -> None:
        """Allocate ``mib`` MiB on CUDA device 0 (the caller narrows CUDA_VISIBLE_DEVICES to one GPU)."""
        device = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        context = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        pointer = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib * MIB)), "cuMemAlloc")


def cuda_usable() -> str | None:
    """None when the CUDA driver initialises with at least one device, else why not."""
    try:
        cuda = Cuda()
        cuda.init()
        if not cuda.devices():
            return "the CUDA driver lists no device"
    except HolderError as exc:
        return str(exc)
    return None


def simgpu_usable() -> str | None:
    state_dir = Path(os.environ.get("SIMGPU_STATE_DIR") or SIMGPU_DEFAULT_STATE_DIR)
    if not (state_dir / "gpus").is_file():
        return f"no simulated GPU list at {state_dir / 'gpus'}"
    try:
        simgpu_state()
    except HolderError as exc:
        return str(exc)
    return None


def choose_backend(wanted: str = "auto") -> tuple:
    """``(backend, {backend: why it was not usable})``: CUDA where the driver answers, else the lab's simgpu."""
    reasons = {}
    for backend, usable in (("cuda", cuda_usable), ("simgpu", simgpu_usable)):
        if wanted not in ("auto", backend):
            continue
        reason = usable()
        if reason is None:
            return backend, reasons
        reasons[backend] = reason
    detail = "; ".join(f"{name}: {why}" for name, why in reasons.items())
    raise HolderError(f"no holder backend is usable ({detail})")


def enumerate_devices(backend: str) -> list:
    """CUDA's device order as this process's environment sets it (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES)."""
    if backend == "cuda":
        cuda = Cuda()
        cuda.init()
        return cuda.devices()
    # The lab's reading of CUDA's enumeration (the simulated engine's own).
    sys.path.insert(0, str(REPO / "tests" / "lab"))
    simgpu_state()
    from sglang_sim import cuda_devices, gpu_claims

    devices = cuda_devices.visible_devices(gpu_claims.read_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [
        {"ordinal": ordinal, "uuid": device.uuid, "pci_bus_id": None, "name": device.name}
        for ordinal, device in enumerate(devices)
    ]


def _claim_simgpu(index: int, mib: int) -> None:
    state = simgpu_state()
    pid = os.getpid()
    gpu = next((gpu for gpu in state.read_gpus() if gpu.index == index), None)
    if gpu is None:
        raise HolderError(f"no simulated GPU {index}")
    with state.locked(None):
        free = gpu.total_mib - state.used_mib(None, index, None, exclude_pid=pid)
        if mib > free:
            raise HolderError(f"out of memory: {mib} MiB asked, {free} MiB free on GPU {index}")
        state.write_claim(None, index, None, pid, mib)


def _nspid() -> list:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(part) for part in line.split()[1:]]
    return [os.getpid()]


def hold(args) -> None:
    """Set the title, take the memory, say so in ``<ready-dir>/<pid>.json``, then sleep until killed.

    SIGTERM keeps its default action, as in SGLang's schedulers (no handler): the process dies at once.
    """
    report = {"pid": os.getpid(), "title": args.title, "index": args.index, "mib": args.mib, "nspid": _nspid()}
    try:
        set_title(args.title)
        if args.backend == "cuda":
            cuda = Cuda()
            cuda.init()
            cuda.hold(args.mib)
        else:
            _claim_simgpu(args.index, args.mib)
        report["ok"] = True
    except HolderError as exc:
        report.update(ok=False, error=str(exc))
    _write_json(Path(args.ready_dir) / f"{os.getpid()}.json", report)
    if not report["ok"]:
        sys.exit(1)
    while True:
        signal.pause()


def _write_json(path: Path, data) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    temporary.rename(path)


def holder_command(backend: str, index: int, uuid: str, mib: int, title: str, ready_dir: str) -> tuple:
    """``(argv, env)`` of one holder process on GPU ``index`` (``uuid``)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "hold", "--backend", backend, "--index", str(index)]
    argv += ["--mib", str(mib), "--title", title, "--ready-dir", ready_dir]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    return argv, env


def start_holder(backend: str, index: int, uuid: str, mib: int, title: str, ready_dir: str) -> subprocess.Popen:
    argv, env = holder_command(backend, index, uuid, mib, title, ready_dir)
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)


def wait_ready(ready_dir: str, pids: list, timeout: float = READY_TIMEOUT_S) -> dict:
    """{pid: report} once every holder in ``pids`` has reported; raises HolderError for a failed or silent one."""
    deadline = time.monotonic() + timeout
    reports = {}
    while True:
        for pid in pids:
            path = Path(ready_dir) / f"{pid}.json"
            if pid not in reports and path.is_file():
                reports[pid] = json.loads(path.read_text())
        failed = [report for report in reports.values() if not report.get("ok")]
        if failed:
            raise HolderError("; ".join(f"holder {r['pid']} {r['title']!r}: {r.get('error')}" for r in failed))
        if len(reports) == len(pids):
            return reports
        if time.monotonic() > deadline:
            missing = sorted(set(pids) - set(reports))
            raise HolderError(f"holders {missing} did not report within {timeout:g} s")
        time.sleep(0.02)


def parent(args) -> None:
    """Start the holders listed in ``--spec``, wait until they hold their memory, record them, and exit: they stay
    behind as orphans, as SGLang's schedulers do after their main process was killed."""
    children = []
    for entry in json.loads(args.spec):
        proc = start_holder(args.backend, entry["index"], entry["uuid"], entry["mib"], entry["title"], args.ready_dir)
        children.append(proc.pid)
    report = {"pid": os.getpid(), "children": children}
    try:
        report["holders"] = wait_ready(args.ready_dir, children)
        report["ok"] = True
    except HolderError as exc:
        report.update(ok=False, error=str(exc))
    _write_json(Path(args.ready_dir) / "parent.json", report)
    os._exit(0 if report["ok"] else 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    holder = modes.add_parser("hold", help="hold GPU memory under a title until killed")
    holder.add_argument("--backend", choices=BACKENDS, required=True)
    holder.add_argument("--index", type=int, required=True, help="the GPU's NVML index (simgpu)")
    holder.add_argument("--mib", type=int, required=True)
    holder.add_argument("--title", required=True)
    holder.add_argument("--ready-dir", required=True)
    orphans = modes.add_parser("parent", help="start holders, then exit and leave them orphaned")
    orphans.add_argument("--backend", choices=BACKENDS, required=True)
    orphans.add_argument("--spec", required=True, help='JSON list of {"index", "uuid", "mib", "title"}')
    orphans.add_argument("--ready-dir", required=True)
    listing = modes.add_parser("enumerate", help="print CUDA's devices in the order this environment gives")
    listing.add_argument("--backend", choices=BACKENDS, required=True)
    args = parser.parse_args(argv)
    if args.mode == "hold":
        hold(args)
    elif args.mode == "parent":
        parent(args)
    else:
        try:
            print(json.dumps(enumerate_devices(args.backend)))
        except HolderError as exc:
            print(f"enumerate: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
