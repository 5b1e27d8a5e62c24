# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which GPU backend lists the devices: NVML when importable, else `nvidia-smi`.

Private to the llmops.inference collection; not a public API. Needs only the Python standard library.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.gpu import GpuQueryError
from ansible_collections.llmops.inference.plugins.module_utils.gpu_nvml import query_nvml
from ansible_collections.llmops.inference.plugins.module_utils.gpu_smi import query_nvidia_smi

BACKENDS = ("auto", "nvml", "nvidia-smi")


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
