# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU devices as the collection sees them (whole GPUs and MIG devices), and picking them by index or UUID.

Private to the llmops.inference collection; not a public API. Needs only the Python standard library (the unit's
gate runs it on the host outside Ansible). The queries that fill these records are in gpu_query.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1024 * 1024
# MIG devices before driver R470 were named MIG-GPU-<GPU UUID>/<GPU instance>/<compute instance>.
LEGACY_MIG_NAME = re.compile(r"^MIG-(GPU-[^/]+)/(\d+)/(\d+)$", re.IGNORECASE)


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


def merge_processes(processes) -> list:
    """One entry per PID (NVML may list a PID once per context); memory summed, unknown stays None."""
    merged = {}
    for proc in processes:
        if proc.pid not in merged:
            merged[proc.pid] = GpuProcess(proc.pid, proc.used_mib)
        elif proc.used_mib is not None:
            known = merged[proc.pid].used_mib
            merged[proc.pid].used_mib = proc.used_mib + (known or 0)
    return sorted(merged.values(), key=lambda proc: proc.pid)


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
