"""The engine's side of the simulated GPU: its memory claims, read and written through simgpu's own module.

simgpu_state (tests/lab/simgpu/simgpu_state.py) is the Python reading of the state directory that the simulated
libnvidia-ml.so.1 also implements; a lab host installs it in /usr/local/lib/simgpu (as a real host installs the
driver's libraries), and the lab's tests put tests/lab/simgpu on the path.
"""

from __future__ import annotations

import sys

SIMGPU_LIB_DIR = "/usr/local/lib/simgpu"

try:
    import simgpu_state
except ImportError:  # a lab host: the module lives with the driver stand-in, outside the venv
    sys.path.append(SIMGPU_LIB_DIR)
    import simgpu_state

Gpu = simgpu_state.Gpu
MigDevice = simgpu_state.MigDevice
StateError = simgpu_state.StateError


def state_dir():
    return simgpu_state.state_dir()


def read_gpus() -> list:
    return simgpu_state.read_gpus()


def reserved_mib() -> int:
    """The driver's reservation on each GPU, which CUDA leaves out of a device's total."""
    return simgpu_state.reserved_mib()


def free_mib(device, exclude_pid: int | None = None) -> int:
    """Free memory of a CUDA device (cuda_devices.CudaDevice, whose total leaves the reservation out): its total less
    the counted claims and the 1 MiB of an idle device."""
    reserved = reserved_mib() if device.mig is None else 0
    return device.total_mib + reserved - simgpu_state.used_mib(None, device.gpu, device.mig, exclude_pid)


def write_claim(device, pid: int, mib: int) -> None:
    simgpu_state.write_claim(None, device.gpu, device.mig, pid, mib)


def mark_exiting(pid: int) -> None:
    """The holder is about to exit: its memory is released after the driver's lag from now."""
    simgpu_state.mark_pid_exit(None, pid)
