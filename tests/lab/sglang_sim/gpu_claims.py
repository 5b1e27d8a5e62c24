"""The simulated GPUs' state directory (the simgpu contract): the GPU list and one claim file per (GPU, PID).

A claim counts while its PID exists and is not a zombie; used = live claims + 1 MiB, free = total - used.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = "/var/lib/simgpu"
DRIVER_RESERVED_MIB = 1
_CLAIM_NAME = re.compile(r"^gpu(\d+)\.pid(\d+)$")


@dataclass(frozen=True)
class SimGpu:
    index: int
    uuid: str
    total_mib: int
    name: str


class GpuStateError(Exception):
    """The GPU list is missing or malformed."""


def state_dir() -> Path:
    return Path(os.environ.get("SIMGPU_STATE_DIR") or DEFAULT_STATE_DIR)


def read_gpus(directory: Path | None = None) -> list[SimGpu]:
    path = (directory or state_dir()) / "gpus"
    try:
        text = path.read_text()
    except OSError as exc:
        raise GpuStateError(f"cannot read the simulated GPU list {path}: {exc.strerror}") from exc
    gpus = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise GpuStateError(f"{path}:{number}: expected index<TAB>uuid<TAB>total_mib<TAB>name, got {line!r}")
        try:
            gpus.append(SimGpu(int(fields[0]), fields[1], int(fields[2]), fields[3]))
        except ValueError as exc:
            raise GpuStateError(f"{path}:{number}: index and total_mib must be integers, got {line!r}") from exc
    return sorted(gpus, key=lambda gpu: gpu.index)


def visible_gpus(gpus: list[SimGpu], cuda_visible_devices: str | None) -> list[SimGpu]:
    """The GPUs a CUDA process would see, in order: all, or those CUDA_VISIBLE_DEVICES names by index or UUID."""
    if cuda_visible_devices is None:
        return gpus
    by_key = {str(gpu.index): gpu for gpu in gpus}
    by_key.update({gpu.uuid: gpu for gpu in gpus})
    visible = []
    for item in cuda_visible_devices.split(","):
        item = item.strip()
        if not item:
            continue
        if item not in by_key:
            # CUDA stops at the first entry that names no device.
            break
        visible.append(by_key[item])
    return visible


def pid_alive(pid: int) -> bool:
    """True while /proc/PID exists and its state is neither zombie (Z) nor dead (X)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return False
    state = data[data.rindex(b")") + 2 :][:1]
    return state not in (b"Z", b"X")


def claim_path(gpu_index: int, pid: int, directory: Path | None = None) -> Path:
    return (directory or state_dir()) / "claims" / f"gpu{gpu_index}.pid{pid}"


def live_claims_mib(gpu_index: int, directory: Path | None = None, exclude_pid: int | None = None) -> int:
    claims = (directory or state_dir()) / "claims"
    total = 0
    try:
        names = os.listdir(claims)
    except OSError:
        return 0
    for name in names:
        match = _CLAIM_NAME.match(name)
        if not match or int(match.group(1)) != gpu_index:
            continue
        pid = int(match.group(2))
        if pid == exclude_pid or not pid_alive(pid):
            continue
        try:
            total += int((claims / name).read_text().strip() or 0)
        except (OSError, ValueError):
            continue
    return total


def free_mib(gpu: SimGpu, directory: Path | None = None, exclude_pid: int | None = None) -> int:
    return gpu.total_mib - DRIVER_RESERVED_MIB - live_claims_mib(gpu.index, directory, exclude_pid)


def write_claim(gpu_index: int, pid: int, mib: int, directory: Path | None = None) -> None:
    """Set this PID's claim atomically (readers never see a half-written number)."""
    path = claim_path(gpu_index, pid, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{int(mib)}\n")
    os.replace(tmp, path)


def remove_claim(gpu_index: int, pid: int, directory: Path | None = None) -> None:
    try:
        claim_path(gpu_index, pid, directory).unlink()
    except FileNotFoundError:
        pass
