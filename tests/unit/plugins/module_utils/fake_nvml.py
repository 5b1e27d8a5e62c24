"""A stand-in for the pynvml module with pynvml 13.615's call names, error class and constants, MIG included."""

from __future__ import annotations

import types

MIB = 1024 * 1024


def nvml_proc(pid, used):
    return types.SimpleNamespace(pid=pid, usedGpuMemory=used)


NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND = 3, 4, 6, 13
ARGUMENT_VERSION_MISMATCH = 25
NVML_MEMORY_V2 = 0x02000028
ERROR_TEXT = {
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    NOT_FOUND: "Not Found",
    FUNCTION_NOT_FOUND: "Function Not Found",
}


class FakeNVMLError(Exception):
    """Shaped like pynvml's NVMLError: the NVML return code in ``value``, NVML's text as ``str()``."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return ERROR_TEXT.get(self.value, "Unknown Error")


class Device:
    """One device of FakeNvml: a whole GPU, or a MIG device (``gi``/``ci`` set). ``fail`` maps a query to an error."""

    def __init__(
        self, name, uuid, total_mib, used_mib, processes=(), mig=None, fail=None, gi=None, ci=None, reserved_mib=None
    ):
        self.name, self.uuid = name, uuid
        self.total, self.used = total_mib * MIB, used_mib * MIB
        self.reserved = reserved_mib  # the driver's reservation, part of used_mib (v1); None: no v2 query
        self.processes = [nvml_proc(pid, mib * MIB) for pid, mib in processes]
        self.mig = mig  # None: no MIG support; else {slot: Device} of a GPU in MIG mode
        self.fail = fail or {}
        self.gi, self.ci = gi, ci

    def answer(self, query, value):
        if query in self.fail:
            raise FakeNVMLError(self.fail[query])
        return value


class FakeNvml(types.SimpleNamespace):
    """The pynvml calls gpu.py makes, with pynvml 13.615's names, error class and constants."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = FUNCTION_NOT_FOUND
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = ARGUMENT_VERSION_MISMATCH
    nvmlMemory_v2 = NVML_MEMORY_V2

    def __init__(self, devices, count_error=None):
        super().__init__(calls=[])
        self.devices = devices
        self.count_error = count_error

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        if self.count_error:
            raise FakeNVMLError(self.count_error)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetName(self, handle):
        return handle.answer("name", handle.name.encode())

    def nvmlDeviceGetUUID(self, handle):
        return handle.answer("uuid", handle.uuid)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is None:
            return handle.answer("memory", types.SimpleNamespace(total=handle.total, used=handle.used))
        if version != NVML_MEMORY_V2:
            raise FakeNVMLError(ARGUMENT_VERSION_MISMATCH)
        if handle.reserved is None:
            raise FakeNVMLError(FUNCTION_NOT_FOUND)  # a driver before R510: no nvmlDeviceGetMemoryInfo_v2
        reserved = handle.reserved * MIB
        return handle.answer(
            "memory_v2", types.SimpleNamespace(total=handle.total, reserved=reserved, used=handle.used - reserved)
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return handle.answer("processes", handle.processes)

    def nvmlDeviceGetMigMode(self, handle):
        if handle.mig is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return handle.answer("mig_mode", [1, 1] if handle.mig else [0, 0])

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return handle.answer("mig_count", 7)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        if index not in handle.mig:
            raise FakeNVMLError(NOT_FOUND)
        return handle.mig[index]

    def nvmlDeviceGetGpuInstanceId(self, handle):
        return handle.answer("gi", handle.gi)

    def nvmlDeviceGetComputeInstanceId(self, handle):
        return handle.answer("ci", handle.ci)


MIG_A = "MIG-5c4a2d61-0000-5000-8000-00000000000a"
MIG_B = "MIG-5c4a2d61-0000-5000-8000-00000000000b"


def mig_host():
    """GPU 0 in MIG mode, MIG devices in slots 0 (a 3g.40gb, 30000 MiB held) and 2 (an idle 1g.10gb); GPU 1 whole."""
    mig = {
        0: Device("NVIDIA H100 80GB HBM3 MIG 3g.40gb", MIG_A, 40192, 30013, [(4242, 30000)], gi=1, ci=0),
        2: Device("NVIDIA H100 80GB HBM3 MIG 1g.10gb", MIG_B, 9856, 13, gi=9, ci=0),
    }
    return [
        Device("NVIDIA H100 80GB HBM3", "GPU-aaaa", 81559, 30026, [(4242, 30000)], mig=mig),
        Device("NVIDIA H100 80GB HBM3", "GPU-bbbb", 81559, 1, mig={}),
    ]
