# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU inventory: NVML through pynvml when importable, else `nvidia-smi`; holders of /dev/nvidia*.

Private to the llmops.inference collection; not a public API. Needs only the Python standard
library; pynvml (package nvidia-ml-py) is optional and imported only when NVML is queried.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

MIB = 1024 * 1024
BACKENDS = ("auto", "nvml", "nvidia-smi")
NVIDIA_DEVICE_PREFIX = "/dev/nvidia"
SMI_GPU_QUERY = ["--query-gpu=index,uuid,name,memory.used,memory.total", "--format=csv,noheader,nounits"]
SMI_APPS_QUERY = ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
SMI_MISSING_VALUES = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "")
# NVML's NVML_VALUE_NOT_AVAILABLE for unsigned long long fields; older pynvml passes it through.
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1


class GpuQueryError(Exception):
    """No backend could list the GPUs; the message names what was tried and why it failed."""


@dataclass
class GpuProcess:
    pid: int
    used_mib: int | None

    def as_dict(self) -> dict:
        return {"pid": self.pid, "used_mib": self.used_mib}


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    total_mib: int | None
    used_mib: int | None
    processes: list = field(default_factory=list)

    @property
    def free_mib(self) -> int | None:
        if self.total_mib is None or self.used_mib is None:
            return None
        return self.total_mib - self.used_mib

    def pids(self) -> set:
        return {proc.pid for proc in self.processes}

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "used_mib": self.used_mib,
            "total_mib": self.total_mib,
            "processes": [proc.as_dict() for proc in self.processes],
        }


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _bytes_to_mib(value) -> int | None:
    if value is None or value == NVML_VALUE_NOT_AVAILABLE:
        return None
    return int(value) // MIB


def _merge_processes(processes) -> list:
    """One entry per PID (NVML may list a PID once per context); memory summed, unknown stays None."""
    merged = {}
    for proc in processes:
        if proc.pid not in merged:
            merged[proc.pid] = GpuProcess(proc.pid, proc.used_mib)
        elif proc.used_mib is not None:
            known = merged[proc.pid].used_mib
            merged[proc.pid].used_mib = proc.used_mib + (known or 0)
    return sorted(merged.values(), key=lambda proc: proc.pid)


def import_pynvml():
    """Return the pynvml module, or raise GpuQueryError saying it is missing."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuQueryError(f"pynvml is not importable ({exc}); install nvidia-ml-py or use nvidia-smi") from None
    return pynvml


def query_nvml(nvml=None) -> list:
    """List GPUs through NVML. ``nvml`` is the pynvml module (injectable for tests)."""
    nvml = nvml or import_pynvml()
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise GpuQueryError(f"NVML initialisation failed: {exc}") from None
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            processes = [
                GpuProcess(int(info.pid), _bytes_to_mib(getattr(info, "usedGpuMemory", None)))
                for info in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ]
            gpus.append(
                Gpu(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    total_mib=_bytes_to_mib(memory.total),
                    used_mib=_bytes_to_mib(memory.used),
                    processes=_merge_processes(processes),
                )
            )
        return gpus
    except Exception as exc:
        raise GpuQueryError(f"NVML query failed: {exc}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass  # shutting down after a failed query has nothing left to report


def _smi_value(text: str) -> int | None:
    text = text.strip()
    if text in SMI_MISSING_VALUES or text.startswith("["):
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_smi_gpus(text: str) -> list:
    """Parse ``--query-gpu=index,uuid,name,memory.used,memory.total`` CSV (the name may hold commas)."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 5 or not fields[0].isdigit():
            raise GpuQueryError(f"unexpected nvidia-smi GPU line: {line!r}")
        gpus.append(
            Gpu(
                index=int(fields[0]),
                uuid=fields[1],
                name=", ".join(fields[2:-2]),
                used_mib=_smi_value(fields[-2]),
                total_mib=_smi_value(fields[-1]),
            )
        )
    return gpus


def parse_smi_apps(text: str) -> list:
    """Parse ``--query-compute-apps=pid,gpu_uuid,used_memory`` CSV into (gpu_uuid, GpuProcess) pairs."""
    apps = []
    for line in text.splitlines():
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            continue  # blank lines and "No running processes found"
        apps.append((fields[1], GpuProcess(int(fields[0]), _smi_value(fields[2]))))
    return apps


def default_run_command(args):
    try:
        proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def query_nvidia_smi(run_command=None, binary: str = "nvidia-smi") -> list:
    run_command = run_command or default_run_command
    outputs = []
    for query in (SMI_GPU_QUERY, SMI_APPS_QUERY):
        rc, out, err = run_command([binary, *query])
        if rc != 0:
            detail = (err or out or "").strip() or "no output"
            raise GpuQueryError(f"`{binary} {query[0]}` failed (rc={rc}): {detail}")
        outputs.append(out)
    gpus = parse_smi_gpus(outputs[0])
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    for uuid, proc in parse_smi_apps(outputs[1]):
        if uuid in by_uuid:
            by_uuid[uuid].processes.append(proc)
    for gpu in gpus:
        gpu.processes = _merge_processes(gpu.processes)
    return gpus


def query_gpus(backend: str = "auto", run_command=None, nvml=None) -> tuple:
    """Return ``(backend_used, gpus)``; ``auto`` tries NVML first, then nvidia-smi."""
    if backend not in BACKENDS:
        raise GpuQueryError(f"unknown GPU backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "nvml":
        return "nvml", query_nvml(nvml)
    if backend == "nvidia-smi":
        return "nvidia-smi", query_nvidia_smi(run_command)
    try:
        return "nvml", query_nvml(nvml)
    except GpuQueryError as nvml_error:
        try:
            return "nvidia-smi", query_nvidia_smi(run_command)
        except GpuQueryError as smi_error:
            raise GpuQueryError(f"no GPU backend worked: NVML: {nvml_error}; nvidia-smi: {smi_error}") from None


def select_gpus(gpus: list, selectors) -> list:
    """Pick GPUs by index (int or numeric string) or UUID; empty selectors mean all.

    Raises ValueError naming the first selector that matches no GPU.
    """
    if not selectors:
        return list(gpus)
    by_index = {gpu.index: gpu for gpu in gpus}
    by_uuid = {gpu.uuid.lower(): gpu for gpu in gpus}
    chosen = []
    for selector in selectors:
        gpu = None
        if isinstance(selector, bool):
            gpu = None
        elif isinstance(selector, int) or str(selector).strip().isdigit():
            gpu = by_index.get(int(str(selector).strip()))
        else:
            gpu = by_uuid.get(str(selector).strip().lower())
        if gpu is None:
            known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
            raise ValueError(f"unknown GPU {selector!r}; known GPUs: {known}")
        if gpu not in chosen:
            chosen.append(gpu)
    return sorted(chosen, key=lambda gpu: gpu.index)


def device_holders(proc_root: str = "/proc") -> dict:
    """{pid: [paths]} of processes with a /dev/nvidia* file open; unreadable fd tables are skipped."""
    holders = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return holders
    for name in names:
        if not name.isdigit():
            continue
        fd_dir = os.path.join(proc_root, name, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        paths = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(NVIDIA_DEVICE_PREFIX):
                paths.add(target)
        if paths:
            holders[int(name)] = sorted(paths)
    return holders
