"""Which all-reduce the tensor-parallel ranks use: SGLang's custom all-reduce, or NCCL's after it failed to set up.

SGLang 0.5.23 sets up its custom all-reduce for every TP group of 2 or more ranks unless
--disable-custom-all-reduce (srt/distributed/parallel_state.py:502). Both implementations on CUDA (v2 by default,
custom_all_reduce_v2.py:591, and the legacy one, custom_all_reduce.py:87) first call
can_use_custom_all_reduce_with_nvlink, which skips world sizes other than 2, 4, 6 and 8 and then reads
CUDA_VISIBLE_DEVICES with int() (device_communicators/custom_all_reduce_utils.py:476-477). A GPU UUID there raises
ValueError; parallel_state.py:503-517 catches it, logs "Setup Custom allreduce failed with ..." on every rank, and the
ranks all-reduce through NCCL, which costs decode throughput (the sim's knob --sim-nccl-allreduce-cost).
"""

from __future__ import annotations

SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES
SETUP_FAILED = (
    "Setup Custom allreduce failed with %s. To silence this warning, specify --disable-custom-all-reduce explicitly."
)


def setup_error(tp_size: int, disabled: bool, cuda_visible_devices: str | None) -> str | None:
    """The text of the exception the custom all-reduce's setup raises, or None when it does not fail."""
    if tp_size < 2 or disabled or tp_size not in SUPPORTED_WORLD_SIZES or not cuda_visible_devices:
        return None
    for entry in cuda_visible_devices.split(","):
        try:
            int(entry)
        except ValueError as exc:
            return str(exc)
    return None


def uses_nccl(tp_size: int, disabled: bool, cuda_visible_devices: str | None) -> bool:
    """Whether the TP ranks all-reduce through NCCL: custom all-reduce disabled, unsupported, or failed to set up."""
    if tp_size < 2:
        return False
    return (
        disabled
        or tp_size not in SUPPORTED_WORLD_SIZES
        or setup_error(tp_size, disabled, cuda_visible_devices) is not None
    )
