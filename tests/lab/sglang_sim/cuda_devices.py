"""The CUDA devices a process sees: the simulated GPUs filtered by CUDA_VISIBLE_DEVICES, as the CUDA driver does.

The parsing rules are PyTorch's reading of the driver's (torch/cuda/__init__.py `_parse_visible_devices`,
`_transform_uuid_to_ordinals`, pinned by test/test_cuda_nvml_based_avail.py `TestVisibleDeviceParses`):

- unset: every device; set but empty (or not starting with a number): none;
- ordinals are read like strtoul ("1gpu2" is 1, unary + and - allowed), a negative one ends the list, a
  repeated one makes the list empty, one past the last GPU ends the list;
- a list starting with "GPU-" (or "MIG-") holds UUID prefixes up to the first entry without that prefix
  (entries are not stripped); each must match exactly one device, else the list ends there; two entries
  naming the same device make the list empty.

MIG (NVIDIA MIG user guide, "CUDA Device Enumeration"): a GPU in MIG mode is used through one of its MIG
devices; a CUDA process enumerates a single MIG device (the first one visible), and no non-MIG GPU once a
MIG device is enumerated.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu_claims import Gpu, MigDevice, reserved_mib


@dataclass(frozen=True)
class CudaDevice:
    """One CUDA device: a whole GPU or a MIG device; `mig` is the MIG device index or None. `total_mib` is CUDA's
    total: the board's less the driver's reservation."""

    gpu: int
    mig: int | None
    uuid: str
    total_mib: int
    name: str

    @property
    def label(self) -> str:
        return str(self.gpu) if self.mig is None else f"{self.gpu}:{self.mig}"


def _strtoul(text: str) -> int:
    """The number a string starts with (one leading + or - allowed), or -1."""
    end = 0
    for position, char in enumerate(text):
        if not (char.isdigit() or (position == 0 and char in "+-")):
            break
        end = position + 1
    try:
        return int(text[:end]) if end else -1
    except ValueError:
        return -1


def parse_visible_devices(value: str | None) -> list[int] | list[str] | None:
    """Ordinals, or UUID prefixes, from CUDA_VISIBLE_DEVICES; None when it is unset."""
    if value is None:
        return None
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            ids: list[str] = []
            for element in value.split(","):
                if element in ids:
                    return []
                if not element.startswith(prefix):
                    break
                ids.append(element)
            return ids
    ordinals: list[int] = []
    for element in value.split(","):
        number = _strtoul(element.strip())
        if number in ordinals:
            return []
        if number < 0:
            break
        ordinals.append(number)
    return ordinals


def _whole(gpu: Gpu) -> CudaDevice:
    # CUDA's total leaves the driver's reservation out (cudaMemGetInfo on an H100 80GB: about 81100 of 81559 MiB).
    return CudaDevice(gpu.index, None, gpu.uuid, gpu.total_mib - reserved_mib(), gpu.name)


def _mig(device: MigDevice) -> CudaDevice:
    return CudaDevice(device.parent, device.index, device.uuid, device.total_mib, device.name)


def _by_prefix(prefixes: list[str], candidates: list[tuple[str, object]]) -> list:
    chosen: list = []
    for prefix in prefixes:
        matches = [item for uuid, item in candidates if uuid.startswith(prefix)]
        if len(matches) != 1:
            break
        if matches[0] in chosen:
            return []
        chosen.append(matches[0])
    return chosen


def visible_devices(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[CudaDevice]:
    """The CUDA devices, in CUDA's order, that a process with this CUDA_VISIBLE_DEVICES would see."""
    parsed = parse_visible_devices(cuda_visible_devices)
    if parsed is None:
        physical = list(gpus)
    elif parsed and isinstance(parsed[0], str) and parsed[0].startswith("MIG-"):
        migs = [(m.uuid, m) for gpu in gpus for m in gpu.mig]
        physical = _by_prefix(parsed, migs)
    elif parsed and isinstance(parsed[0], str):
        physical = _by_prefix(parsed, [(gpu.uuid, gpu) for gpu in gpus])
    else:
        physical = []
        for ordinal in parsed:
            if ordinal >= len(gpus):
                break
            physical.append(gpus[ordinal])
    devices = []
    for item in physical:
        if isinstance(item, MigDevice):
            devices.append(_mig(item))
        elif item.mig_enabled:
            devices.append(_mig(item.mig[0]))
        else:
            devices.append(_whole(item))
    first_mig = next((d for d in devices if d.mig is not None), None)
    return [first_mig] if first_mig is not None else devices
