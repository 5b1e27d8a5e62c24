"""The NVIDIA driver's NVML read through ctypes, call by call, each answer kept raw (bytes, error names).

The collection reads NVML through pynvml (plugins/module_utils/gpu.py); this module asks the library directly so
that the kit records what the driver itself answers: both memory layouts (v1 ``used``, v2 ``reserved``), the
process list with its PIDs, and which queries a board refuses. Standard library only. Struct layouts follow
NVIDIA's nvml.h (``nvmlMemory_t``, ``nvmlMemory_v2_t``, ``nvmlProcessInfo_t``, ``nvmlPciInfo_t``).
"""

from __future__ import annotations

import ctypes

MIB = 1024 * 1024
LIBRARY = "libnvidia-ml.so.1"

SUCCESS = 0
INSUFFICIENT_SIZE = 7
# nvml.h's nvmlReturn_t names, for the record (nvmlErrorString's texts differ between drivers).
ERROR_NAMES = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_ENABLED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    999: "UNKNOWN",
}


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


# NVML_STRUCT_VERSION(Memory, 2): sizeof(nvmlMemory_v2_t) | 2 << 24
MEMORY_V2_VERSION = ctypes.sizeof(MemoryV2) | (2 << 24)


class ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class NvmlError(Exception):
    def __init__(self, call: str, code: int):
        self.call, self.code = call, code
        super().__init__(f"{call}: {error_name(code)}")


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"ERROR_{code}")


def _mib(value: int) -> int | None:
    return None if value in (2**64 - 1, None) else int(value) // MIB


class Nvml:
    """One NVML session (``open`` ... ``close``); each method raises NvmlError naming the call and its error."""

    def __init__(self, path: str = LIBRARY):
        self.lib = ctypes.CDLL(path)

    def _call(self, name: str, *args) -> None:
        try:
            function = getattr(self.lib, name)
        except AttributeError:
            raise NvmlError(name, 13) from None
        code = function(*args)
        if code != SUCCESS:
            raise NvmlError(name, code)

    def open(self) -> None:
        self._call("nvmlInit_v2")

    def close(self) -> None:
        try:
            self._call("nvmlShutdown")
        except NvmlError:
            pass  # nothing left to report after a failed session

    def _string(self, name: str, *args, size: int = 96) -> str:
        buffer = ctypes.create_string_buffer(size)
        self._call(name, *args, buffer, ctypes.c_uint(size))
        return buffer.value.decode("utf-8", "replace")

    def driver_version(self) -> str:
        return self._string("nvmlSystemGetDriverVersion")

    def cuda_driver_version(self) -> int:
        value = ctypes.c_int()
        self._call("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(value))
        return value.value

    def count(self) -> int:
        value = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(value))
        return value.value

    def handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def handle_by_uuid(self, uuid: str) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByUUID", ctypes.c_char_p(uuid.encode()), ctypes.byref(handle))
        return handle

    def uuid(self, handle) -> str:
        return self._string("nvmlDeviceGetUUID", handle)

    def name(self, handle) -> str:
        return self._string("nvmlDeviceGetName", handle)

    def index(self, handle) -> int:
        value = ctypes.c_uint()
        self._call("nvmlDeviceGetIndex", handle, ctypes.byref(value))
        return value.value

    def memory(self, handle) -> dict:
        memory = Memory()
        self._call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        return {"total_mib": _mib(memory.total), "free_mib": _mib(memory.free), "used_mib": _mib(memory.used)}

    def used_mib(self, handle) -> int:
        memory = Memory()
        self._call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        return int(memory.used) // MIB

    def memory_v2(self, handle) -> dict:
        memory = MemoryV2(version=MEMORY_V2_VERSION)
        self._call("nvmlDeviceGetMemoryInfo_v2", handle, ctypes.byref(memory))
        return {
            "total_mib": _mib(memory.total),
            "reserved_mib": _mib(memory.reserved),
            "free_mib": _mib(memory.free),
            "used_mib": _mib(memory.used),
        }

    def _processes(self, name: str, handle) -> list:
        count = ctypes.c_uint(0)
        function_args = (handle, ctypes.byref(count), None)
        try:
            self._call(name, *function_args)
            return []
        except NvmlError as exc:
            if exc.code != INSUFFICIENT_SIZE:
                raise
        size = count.value + 8  # processes may start between the two calls
        infos = (ProcessInfo * size)()
        count = ctypes.c_uint(size)
        self._call(name, handle, ctypes.byref(count), infos)
        found = []
        for info in infos[: count.value]:
            found.append(
                {
                    "pid": int(info.pid),
                    "used_mib": _mib(info.usedGpuMemory),
                    "gpu_instance_id": int(info.gpuInstanceId),
                    "compute_instance_id": int(info.computeInstanceId),
                }
            )
        return found

    def compute_processes(self, handle) -> list:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def graphics_processes(self, handle) -> list:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)

    def mig_mode(self, handle) -> dict:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        self._call("nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending))
        return {"current": current.value, "pending": pending.value}

    def pci_bus_id(self, handle) -> str:
        info = PciInfo()
        self._call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(info))
        return info.busId.decode("ascii", "replace")

    def utilization(self, handle) -> dict:
        value = Utilization()
        self._call("nvmlDeviceGetUtilizationRates", handle, ctypes.byref(value))
        return {"gpu": value.gpu, "memory": value.memory}

    def process_name(self, pid: int) -> str:
        return self._string("nvmlSystemGetProcessName", ctypes.c_uint(pid), size=256)


def queries(nvml: Nvml, handle) -> dict:
    """Each query the collection or an operator relies on: ``{name: {"ok": value} | {"error": NAME}}``."""
    calls = {
        "name": nvml.name,
        "uuid": nvml.uuid,
        "index": nvml.index,
        "memory_v1": nvml.memory,
        "memory_v2": nvml.memory_v2,
        "compute_processes_v3": nvml.compute_processes,
        "graphics_processes_v3": nvml.graphics_processes,
        "mig_mode": nvml.mig_mode,
        "pci_bus_id": nvml.pci_bus_id,
        "utilization": nvml.utilization,
    }
    answers = {}
    for name, call in calls.items():
        try:
            answers[name] = {"ok": call(handle)}
        except NvmlError as exc:
            answers[name] = {"error": error_name(exc.code)}
    return answers
