# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPUs and MIG devices through NVML (pynvml, package nvidia-ml-py, imported only when NVML is queried).

Private to the llmops.inference collection; not a public API. Needs only the Python standard library besides pynvml.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.gpu import (
    MIB,
    Gpu,
    GpuProcess,
    GpuQueryError,
    merge_processes,
)

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


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _bytes_to_mib(value) -> int | None:
    if value is None or value == NVML_VALUE_NOT_AVAILABLE:
        return None
    return int(value) // MIB


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
        gpu.processes = merge_processes(
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
