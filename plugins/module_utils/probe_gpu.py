# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The probe's gpu tier (the unit's processes hold memory on the expected GPUs), and the memory on an unhealthy host
that only a GPU reset frees.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.gpu import runnable_gpus, select_gpus
from ansible_collections.llmops.inference.plugins.module_utils.gpu_memory import memory_without_live_holder
from ansible_collections.llmops.inference.plugins.module_utils.probe_base import ProbeBase, TierFailure
from ansible_collections.llmops.inference.plugins.module_utils.probe_report import Attempt
from ansible_collections.llmops.inference.plugins.module_utils.procs import wait_for

# How long memory without a live holder must stay before an unhealthy host is reported as needing a GPU reset:
# it also shows for a moment after a holder exits, until the driver releases it.
UNREAPABLE_CONFIRM_S = 2.0
UNREAPABLE_POLL_S = 0.2


class GpuTier(ProbeBase):
    """The gpu tier of SglangProbe."""

    def _held_mib(self, gpu, pids) -> int:
        """The unit's processes' memory on ``gpu`` (NVML's per-process accounting); without a unit, or where the
        figures are unavailable (e.g. some containers), the memory in use beyond the driver's reservation."""
        if pids is None or not gpu.processes_known:
            return gpu.in_use_mib or 0
        mine = [proc for proc in gpu.processes if proc.pid in pids]
        if any(proc.used_mib is None for proc in mine):
            return gpu.in_use_mib or 0
        return sum(proc.used_mib for proc in mine)

    def _expected_gpus(self, gpus: list) -> tuple:
        """``(devices that must each hold memory, how many of them must)``; without a list, the devices an engine
        can run on (MIG devices of a GPU in MIG mode, else whole GPUs)."""
        settings = self.settings
        if settings.gpu_selectors:
            try:
                chosen = select_gpus(gpus, settings.gpu_selectors)
            except ValueError as exc:
                raise TierFailure(f"expected_gpus: {exc}") from None
            return chosen, len(chosen)
        devices = runnable_gpus(gpus)
        if settings.gpu_count:
            if settings.gpu_count > len(devices):
                raise TierFailure(f"expected {settings.gpu_count} GPUs but the host has {len(devices)}")
            return devices, settings.gpu_count
        if not devices:
            raise TierFailure("no GPUs found")
        return devices, len(devices)

    def _check_gpu(self, attempt: Attempt) -> str:
        try:
            gpus = self.gpu_reader()
        except Exception as exc:
            raise TierFailure(f"cannot list GPUs: {exc}") from None
        unit = self.settings.unit
        pids = set(self.unit_pids(unit)) if unit else None
        held = {gpu.key: self._held_mib(gpu, pids) for gpu in gpus}
        attempt.gpu_memory_mib = {gpu.key: held[gpu.key] for gpu in gpus}
        attempt.gpu_errors = [{"gpu": gpu.index, "uuid": gpu.uuid, **error} for gpu in gpus for error in gpu.errors]
        candidates, needed = self._expected_gpus(gpus)
        # With a count, the GPUs the unit uses most must do (CUDA_VISIBLE_DEVICES may pick any of them).
        ranked = sorted(candidates, key=lambda gpu: (-held[gpu.key], gpu.index, gpu.mig_index or 0))[:needed]
        ranked.sort(key=lambda gpu: (gpu.index, -1 if gpu.mig_index is None else gpu.mig_index))
        minimum = self.settings.min_gpu_memory_mib
        for gpu in ranked:
            if held[gpu.key] < minimum:
                raise TierFailure(self._gpu_reason(gpu, held[gpu.key], attempt))
        return ", ".join(f"{held[gpu.key]} MiB on {gpu.display}" for gpu in ranked)

    def _gpu_reason(self, gpu, held: int, attempt: Attempt) -> str:
        unknown = "" if gpu.processes_known else " (its process list is unavailable, so all of its used memory counts)"
        if not self.settings.unit:
            return f"{gpu.display} has {held} MiB used: model not loaded"
        state = attempt.unit_state
        who = "unit active but its processes" if state is not None and state.is_active else "the unit's processes"
        total = f" ({gpu.in_use_mib} MiB used on the GPU in all)" if gpu.in_use_mib not in (None, held) else ""
        return f"{who} hold {held} MiB on {gpu.display}{total}{unknown}: model not loaded"

    def _unreapable(self) -> list:
        """On an unhealthy host, GPU memory that no live process holds and that stays (a reset or a reboot frees it).

        Looks at the expected GPUs (all the devices an engine can run on without a list), only when the ``gpu``
        tier was requested; waits up to UNREAPABLE_CONFIRM_S for memory the driver is still releasing.
        """
        if "gpu" not in self.settings.tiers or self.gpu_reader is None:
            return []
        found = []

        def released() -> bool:
            try:
                gpus = self.gpu_reader()
                chosen = select_gpus(gpus, self.settings.gpu_selectors) if self.settings.gpu_selectors else None
            except Exception:
                found.clear()
                return True  # the gpu tier reports a listing that fails
            found[:] = memory_without_live_holder(
                runnable_gpus(gpus) if chosen is None else chosen,
                self.process_reader,
                self.settings.unaccounted_threshold_mib,
            )
            return not found

        wait_for(released, UNREAPABLE_CONFIRM_S, UNREAPABLE_POLL_S, self.clock, self.sleep)
        return found
