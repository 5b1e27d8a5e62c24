# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU inventory: NVML through pynvml when importable, else `nvidia-smi`; holders of /dev/nvidia*.

Private to the llmops.inference collection; not a public API. Needs only the Python standard
library; pynvml (package nvidia-ml-py) is optional and imported only when NVML is queried.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

MIB = 1024 * 1024
BACKENDS = ("auto", "nvml", "nvidia-smi")
NVIDIA_DEVICE_PREFIX = "/dev/nvidia"
SMI_GPU_QUERY = ["--query-gpu=index,uuid,name,memory.used,memory.total", "--format=csv,noheader,nounits"]
SMI_APPS_QUERY = ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
# Drivers from R510 on report the driver's reservation apart (nvidia-smi's memory.used then leaves it out); an
# older nvidia-smi refuses the field, and its memory.used is all the memory in use.
SMI_RESERVED_QUERY = ["--query-gpu=uuid,memory.reserved", "--format=csv,noheader,nounits"]
SMI_LIST = ["-L"]
SMI_MISSING_VALUES = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "")
# NVML's NVML_VALUE_NOT_AVAILABLE for unsigned long long fields; older pynvml passes it through.
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
# NVML return codes (nvml.h; pynvml's NVML_ERROR_* constants) used when the pynvml module lacks them.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
# nvml.h's nvmlMemory_v2 (NVML_STRUCT_VERSION(Memory, 2)), for a pynvml that lacks the constant.
NVML_MEMORY_V2 = 0x02000028
NVML_DEVICE_MIG_ENABLE = 1
# `nvidia-smi -L`: "GPU 0: NAME (UUID: GPU-...)", and under a GPU in MIG mode
# "  MIG 1g.10gb     Device  0: (UUID: MIG-...)".
SMI_LIST_GPU = re.compile(r"^GPU (\d+): (.*) \(UUID: ([^)]+)\)\s*$")
SMI_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")
# MIG devices before driver R470 were named MIG-GPU-<GPU UUID>/<GPU instance>/<compute instance>.
LEGACY_MIG_NAME = re.compile(r"^MIG-(GPU-[^/]+)/(\d+)/(\d+)$", re.IGNORECASE)
SMI_MIG_MEMORY_UNKNOWN = "nvidia-smi reports no memory per MIG device; install nvidia-ml-py (pynvml) to read it"
SMI_MIG_PROCESSES_UNKNOWN = "nvidia-smi --query-compute-apps names the parent GPU of a process, not its MIG device"


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
    """A whole GPU, or a MIG device (its own memory and processes; ``index`` is its parent GPU's index).

    ``used_mib`` is all the memory in use, the driver's reservation included (NVML's v1 ``used``); ``reserved_mib``
    is that reservation (NVML v2's ``reserved``), None where the driver or the backend does not report it apart.
    ``errors`` lists the queries that failed for this device (``{"field", "error"}``); the field they fill is
    None (memory) or empty with ``processes_known`` false (processes).
    """

    index: int
    uuid: str
    name: str
    total_mib: int | None
    used_mib: int | None
    processes: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    processes_known: bool = True
    mig_enabled: bool = False
    mig_index: int | None = None
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    reserved_mib: int | None = None

    @property
    def in_use_mib(self) -> int | None:
        """Memory in use beyond the driver's reservation: what processes hold, memory the driver is still releasing,
        memory nobody can free. All of ``used_mib`` where the reservation is unknown; None where used is unknown."""
        if self.used_mib is None:
            return None
        return max(self.used_mib - (self.reserved_mib or 0), 0)

    @property
    def listed_mib(self) -> int | None:
        """What the listed processes hold (NVML's per-process accounting); None where the list or a figure is
        unknown."""
        figures = [holder.used_mib for holder in self.processes]
        if not self.processes_known or None in figures:
            return None
        return sum(figures)

    @property
    def free_mib(self) -> int | None:
        if self.total_mib is None or self.used_mib is None:
            return None
        return self.total_mib - self.used_mib

    @property
    def is_mig(self) -> bool:
        return self.mig_index is not None

    @property
    def can_run(self) -> bool:
        """Whether an engine can run on it: a MIG device, or a whole GPU not in MIG mode."""
        return self.is_mig or not self.mig_enabled

    @property
    def key(self) -> str:
        """The index of a whole GPU as a string, the UUID of a MIG device."""
        return self.uuid if self.is_mig else str(self.index)

    @property
    def display(self) -> str:
        return f"GPU {self.index} MIG device {self.mig_index}" if self.is_mig else f"GPU {self.index}"

    def pids(self) -> set:
        return {proc.pid for proc in self.processes}

    def add_error(self, name: str, error) -> None:
        self.errors.append({"field": name, "error": str(error) or type(error).__name__})

    def as_dict(self) -> dict:
        data = {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "used_mib": self.used_mib,
            "reserved_mib": self.reserved_mib,
            "total_mib": self.total_mib,
            "processes": [proc.as_dict() for proc in self.processes],
            "errors": [dict(error) for error in self.errors],
        }
        if self.mig_enabled:
            data["mig_enabled"] = True
        if self.is_mig:
            data.update(
                mig_index=self.mig_index,
                parent_uuid=self.parent_uuid,
                gpu_instance_id=self.gpu_instance_id,
                compute_instance_id=self.compute_instance_id,
            )
        return data


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


class _Nvml:
    """The pynvml calls for one device, each failing alone: an NVMLError degrades the field it fills."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.error_class = getattr(nvml, "NVMLError", Exception)

    def code(self, exc) -> int | None:
        return getattr(exc, "value", None)

    def constant(self, name: str, default: int) -> int:
        return getattr(self.nvml, name, default)

    def field(self, gpu: Gpu, name: str, call, *args, default=None):
        try:
            return call(*args)
        except self.error_class as exc:
            gpu.add_error(name, exc)
            return default

    def device(self, handle, index: int, uuid: str, **mig) -> Gpu:
        gpu = Gpu(index=index, uuid=uuid, name="unknown", total_mib=None, used_mib=None, **mig)
        name = self.field(gpu, "name", self.nvml.nvmlDeviceGetName, handle)
        if name is not None:
            gpu.name = _text(name)
        memory = self.field(gpu, "memory", self.nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            gpu.total_mib, gpu.used_mib = _bytes_to_mib(memory.total), _bytes_to_mib(memory.used)
            gpu.reserved_mib = self.reserved(gpu, handle)
        infos = self.field(gpu, "processes", self.nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        gpu.processes_known = infos is not None
        gpu.processes = _merge_processes(
            GpuProcess(int(info.pid), _bytes_to_mib(getattr(info, "usedGpuMemory", None))) for info in infos or ()
        )
        return gpu

    def reserved(self, gpu: Gpu, handle) -> int | None:
        """The driver's reservation (``nvmlDeviceGetMemoryInfo_v2``'s ``reserved``, part of v1's ``used``); None where
        the driver lacks v2 (before R510, whose total left the reservation out) or pynvml cannot pass a version
        (nvidia-ml-py before 11.510): all of ``used_mib`` counts then."""
        version = self.constant("nvmlMemory_v2", NVML_MEMORY_V2)
        try:
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except TypeError:
            return None
        except self.error_class as exc:
            absent = (
                self.constant("NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED),
                self.constant("NVML_ERROR_FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND),
                self.constant("NVML_ERROR_ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
            )
            if self.code(exc) not in absent:
                gpu.add_error("reserved", exc)
            return None
        return _bytes_to_mib(getattr(memory, "reserved", None))

    def mig_enabled(self, gpu: Gpu, handle) -> bool:
        """Whether ``gpu`` is in MIG mode; boards and drivers without MIG say NotSupported or lack the call."""
        get_mode = getattr(self.nvml, "nvmlDeviceGetMigMode", None)
        if get_mode is None:
            return False
        try:
            current = get_mode(handle)[0]
        except self.error_class as exc:
            absent = (
                self.constant("NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED),
                self.constant("NVML_ERROR_FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND),
            )
            if self.code(exc) not in absent:
                gpu.add_error("mig_mode", exc)
            return False
        return current == self.constant("NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, parent: Gpu, handle) -> list:
        """The MIG devices of a GPU in MIG mode; a slot without a device answers NotFound."""
        count = self.field(parent, "mig_devices", self.nvml.nvmlDeviceGetMaxMigDeviceCount, handle, default=0)
        not_found = self.constant("NVML_ERROR_NOT_FOUND", NVML_ERROR_NOT_FOUND)
        devices = []
        for slot in range(count):
            try:
                mig_handle = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                uuid = _text(self.nvml.nvmlDeviceGetUUID(mig_handle))
            except self.error_class as exc:
                if self.code(exc) != not_found:
                    parent.add_error(f"mig_device {slot}", exc)
                continue
            device = self.device(mig_handle, parent.index, uuid, mig_index=slot, parent_uuid=parent.uuid)
            device.gpu_instance_id = self.field(
                device, "gpu_instance_id", self.nvml.nvmlDeviceGetGpuInstanceId, mig_handle
            )
            device.compute_instance_id = self.field(
                device, "compute_instance_id", self.nvml.nvmlDeviceGetComputeInstanceId, mig_handle
            )
            devices.append(device)
        return devices


def query_nvml(nvml=None) -> list:
    """List GPUs, and the MIG devices of GPUs in MIG mode, through NVML. ``nvml`` is the pynvml module (injectable).

    Initialisation, the device count, a device handle or UUID failing raises GpuQueryError (``auto`` then tries
    nvidia-smi); any other query failing is recorded in that device's ``errors`` and leaves its field unknown.
    """
    nvml = nvml or import_pynvml()
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise GpuQueryError(f"NVML initialisation failed: {exc}") from None
    calls = _Nvml(nvml)
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = calls.device(handle, index, _text(nvml.nvmlDeviceGetUUID(handle)))
            gpus.append(gpu)
            if calls.mig_enabled(gpu, handle):
                gpu.mig_enabled = True
                gpus.extend(calls.mig_devices(gpu, handle))
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


def parse_smi_list(text: str) -> list:
    """MIG devices from ``nvidia-smi -L``: ``(parent index, parent UUID, parent name, device index, profile, UUID)``."""
    found = []
    parent = None
    for line in text.splitlines():
        gpu_line = SMI_LIST_GPU.match(line)
        if gpu_line:
            parent = (int(gpu_line.group(1)), gpu_line.group(3).strip(), gpu_line.group(2).strip())
            continue
        mig_line = SMI_LIST_MIG.match(line)
        if mig_line and parent is not None:
            found.append((*parent, int(mig_line.group(2)), mig_line.group(1), mig_line.group(3).strip()))
    return found


def _smi_mig_devices(gpus: list, listing: str) -> list:
    """``gpus`` with the MIG devices of ``nvidia-smi -L`` after their parents; their memory and processes unknown."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    children = {}
    for parent_index, parent_uuid, parent_name, slot, profile, uuid in parse_smi_list(listing):
        parent = by_uuid.get(parent_uuid)
        if parent is None:
            continue
        parent.mig_enabled = True
        device = Gpu(
            index=parent_index,
            uuid=uuid,
            name=f"{parent.name or parent_name} MIG {profile}",
            total_mib=None,
            used_mib=None,
            processes_known=False,
            mig_index=slot,
            parent_uuid=parent_uuid,
        )
        legacy = LEGACY_MIG_NAME.match(uuid)
        if legacy:
            device.gpu_instance_id, device.compute_instance_id = int(legacy.group(2)), int(legacy.group(3))
        device.add_error("memory", SMI_MIG_MEMORY_UNKNOWN)
        device.add_error("processes", SMI_MIG_PROCESSES_UNKNOWN)
        children.setdefault(parent_uuid, []).append(device)
    listed = []
    for gpu in gpus:
        listed.append(gpu)
        listed.extend(children.get(gpu.uuid, ()))
    return listed


def query_nvidia_smi(run_command=None, binary: str = "nvidia-smi") -> list:
    """List GPUs (``--query-gpu``), their processes (``--query-compute-apps``) and MIG devices (``-L``)."""
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
    _smi_reserved(by_uuid, run_command, binary)
    for uuid, proc in parse_smi_apps(outputs[1]):
        if uuid in by_uuid:
            by_uuid[uuid].processes.append(proc)
    for gpu in gpus:
        gpu.processes = _merge_processes(gpu.processes)
    listing = _mig_listing(run_command, binary)
    return _smi_mig_devices(gpus, listing) if listing is not None else gpus


def _smi_reserved(by_uuid: dict, run_command, binary: str) -> None:
    """Set each GPU's reservation from ``memory.reserved``, adding it back to ``used_mib`` (which then leaves it out).

    An nvidia-smi that refuses the field (drivers before R510) leaves the GPUs as they are: its memory.used is all
    the memory in use.
    """
    for uuid, reserved in _smi_reservations(run_command, binary).items():
        gpu = by_uuid.get(uuid)
        if gpu is None:
            continue
        gpu.reserved_mib = reserved
        if gpu.used_mib is not None:
            gpu.used_mib += reserved


# The reservation per (binary, runner): it is fixed while the driver is loaded, and a module polls memory many times.
_RESERVATIONS = {}


def _smi_reservations(run_command, binary: str) -> dict:
    key = (binary, run_command)
    if key not in _RESERVATIONS:
        rc, out, _err = run_command([binary, *SMI_RESERVED_QUERY])
        found = {}
        for line in out.splitlines() if rc == 0 else ():
            fields = [part.strip() for part in line.split(",")]
            reserved = _smi_value(fields[1]) if len(fields) == 2 else None
            if reserved is not None:
                found[fields[0]] = reserved
        _RESERVATIONS[key] = found
    return _RESERVATIONS[key]


# `nvidia-smi -L` per (binary, runner): MIG devices change only when an administrator changes them, and a module
# polls memory many times in one run; nvidia-smi takes a while to start on a real host.
_MIG_LISTINGS = {}


def _mig_listing(run_command, binary: str):
    key = (binary, run_command)
    if key not in _MIG_LISTINGS:
        rc, listing, _err = run_command([binary, *SMI_LIST])
        if rc != 0:
            return None
        _MIG_LISTINGS[key] = listing
    return _MIG_LISTINGS[key]


def query_gpus(backend: str = "auto", run_command=None, nvml=None) -> tuple:
    """Return ``(backend_used, gpus)``; ``auto`` tries NVML first, then nvidia-smi.

    ``gpus`` lists every whole GPU, each followed by its MIG devices when it is in MIG mode.
    """
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


def _describe(gpu: Gpu) -> str:
    return f"{gpu.index} MIG {gpu.mig_index} ({gpu.uuid})" if gpu.is_mig else f"{gpu.index} ({gpu.uuid})"


def _find_gpu(gpus: list, selector) -> Gpu | None:
    if isinstance(selector, bool):
        return None
    text = str(selector).strip()
    if isinstance(selector, int) or text.isdigit():
        return next((gpu for gpu in gpus if not gpu.is_mig and gpu.index == int(text)), None)
    wanted = text.lower()
    for gpu in gpus:
        if gpu.uuid.lower() == wanted:
            return gpu
    legacy = LEGACY_MIG_NAME.match(text)
    if legacy:
        parent, instance, compute = legacy.group(1).lower(), int(legacy.group(2)), int(legacy.group(3))
        for gpu in gpus:
            if (
                gpu.is_mig
                and (gpu.parent_uuid or "").lower() == parent
                and (gpu.gpu_instance_id, gpu.compute_instance_id) == (instance, compute)
            ):
                return gpu
    return None


def select_gpus(gpus: list, selectors) -> list:
    """Pick devices by index (int or numeric string: a whole GPU), GPU- UUID or MIG- UUID; empty selectors mean all
    whole GPUs (a GPU in MIG mode counts once, with the memory of all its MIG devices).

    Raises ValueError naming the first selector that matches no device.
    """
    if not selectors:
        return [gpu for gpu in gpus if not gpu.is_mig]
    chosen = []
    for selector in selectors:
        gpu = _find_gpu(gpus, selector)
        if gpu is None:
            known = ", ".join(_describe(g) for g in gpus) or "none"
            raise ValueError(f"unknown GPU {selector!r}; known GPUs: {known}")
        if gpu not in chosen:
            chosen.append(gpu)
    return sorted(chosen, key=lambda gpu: (gpu.index, -1 if gpu.mig_index is None else gpu.mig_index))


def runnable_gpus(gpus: list) -> list:
    """The devices an engine can run on: MIG devices, and whole GPUs not in MIG mode."""
    return [gpu for gpu in gpus if gpu.can_run]


def _mib_text(value) -> str:
    return "unknown" if value is None else str(value)


def stuck_entry(gpu: Gpu, pid, mib, evidence: str, proc=None) -> dict:
    """One piece of memory nobody can free, as the modules report it (``gpu`` is the physical GPU's index)."""
    where = f" on MIG device {gpu.mig_index} ({gpu.uuid})" if gpu.is_mig else ""
    return {
        "gpu": gpu.index,
        "uuid": gpu.uuid,
        "pid": pid,
        "state": proc.state if proc is not None else None,
        "ppid": proc.ppid if proc is not None else None,
        "title": proc.title if proc is not None else None,
        "mib": mib,
        "evidence": evidence + where,
    }


def unlisted_mib(gpu: Gpu) -> int | None:
    """MiB in use on ``gpu`` beyond the driver's reservation that no listed process holds (memory being released,
    memory nobody can free); None where the process list or a figure is unknown. Where the driver does not report
    its reservation apart, the reservation is part of it."""
    listed = gpu.listed_mib
    if listed is None or gpu.in_use_mib is None:
        return None
    return gpu.in_use_mib - listed


def memory_without_live_holder(gpus: list, read_process, threshold_mib: int) -> list:
    """Memory on ``gpus`` that no live process holds, which only a GPU reset or a reboot frees once it lasts.

    ``read_process(pid)`` returns an object with ``state``, ``ppid``, ``title`` and ``is_alive``, or None when the
    PID does not exist. Reported: a listed holder that no longer exists, a listed holder that is a zombie (its
    memory stays when a thread of it is stuck in the driver), and memory in use beyond the driver's reservation that
    no listed process accounts for, more than ``threshold_mib`` (skipped where the process list or a figure is
    unknown, and on a GPU in MIG mode, whose MIG devices are checked instead). A process of another PID namespace
    looks like the first or the last.
    """
    found = []
    for gpu in gpus:
        for holder in gpu.processes:
            proc = read_process(holder.pid)
            memory = f"{_mib_text(holder.used_mib)} MiB"
            if proc is None:
                evidence = f"pid {holder.pid} no longer exists, yet the driver lists it holding {memory}"
                found.append(stuck_entry(gpu, holder.pid, holder.used_mib, evidence))
            elif not proc.is_alive:
                evidence = (
                    f"pid {holder.pid} {proc.title!r} is a zombie (state {proc.state}, parent {proc.ppid}) "
                    f"holding {memory}"
                )
                found.append(stuck_entry(gpu, holder.pid, holder.used_mib, evidence, proc))
        unaccounted = None if gpu.mig_enabled else unlisted_mib(gpu)
        if unaccounted is not None and unaccounted > threshold_mib:
            reserved = "" if gpu.reserved_mib is None else f" beyond the driver's {gpu.reserved_mib} MiB reservation"
            evidence = f"{unaccounted} MiB used{reserved} that no listed process holds (more than {threshold_mib} MiB)"
            found.append(stuck_entry(gpu, None, unaccounted, evidence))
    return found


def reset_message(entries: list) -> str:
    """``GPU 0 needs a reset or a reboot: <evidence>, <evidence>; GPU 1 needs ...`` (a host-wide clause for no GPU)."""
    by_gpu = {}
    for entry in entries:
        by_gpu.setdefault(entry["gpu"], []).append(entry["evidence"])
    clauses = []
    for index in sorted(by_gpu, key=lambda value: (value is None, value)):
        who = "the host" if index is None else f"GPU {index}"
        clauses.append(f"{who} needs a reset or a reboot: {', '.join(by_gpu[index])}")
    return "; ".join(clauses)


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


def cuda_visible_devices(selectors, devices) -> list:
    """``CUDA_VISIBLE_DEVICES`` for an engine given ``selectors``: whole GPUs by index, MIG devices by UUID.

    ``devices`` are the devices the selectors name, in their order, as ``Gpu.as_dict()`` reports them (the
    sglang_info module's ``gpus.devices``). SGLang reads the list with ``int()`` to set up its custom all-reduce
    (custom_all_reduce_utils.py) and falls back to NCCL's, slower, on a GPU UUID; a unit sets
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, under which CUDA's indexes are NVML's. A MIG device has no index CUDA reads.
    Where ``devices`` does not match the selectors one for one (not known yet), the selectors are returned as they are.
    """
    shown = [str(selector).strip() for selector in selectors or ()]
    devices = list(devices or ())
    if len(devices) != len(shown):
        return shown
    return [device["uuid"] if device.get("mig_index") is not None else str(device["index"]) for device in devices]
