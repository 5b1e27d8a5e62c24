# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The wait of a reap for the GPU memory its processes held to be released, and the memory nobody can free.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.gpu_memory import (
    memory_without_live_holder,
    unlisted_mib,
)
from ansible_collections.llmops.inference.plugins.module_utils.procs import read_process, wait_for
from ansible_collections.llmops.inference.plugins.module_utils.reap_options import ReapHost, ReapOptions
from ansible_collections.llmops.inference.plugins.module_utils.reap_plan import Plan

MEMORY_POLL_S = 0.2
# Used memory that no listed process holds may grow by this much over a reap without being waited for (NVML's
# per-process figures and the device's used memory are read at different moments).
RELEASE_SLACK_MIB = 64
# Why memory is not released yet: a reaped PID still listed, memory the driver is still releasing, a GPU above
# released_below_mib, a /dev/nvidia* file still open.
LISTED, RELEASING, ABOVE_FLOOR, DEVICE_FILES = "listed", "releasing", "above_floor", "device_files"


@dataclass
class Held:
    """Memory not yet released: on which GPU (UUID, None for a device file), whose (PID or None), why, in words."""

    uuid: str | None
    pid: int | None
    kind: str
    text: str


@dataclass
class Release:
    """How a wait for released memory ended: the GPUs at its end, what was still held (Held), the memory nobody can free
    (``lasting``: it stayed ``kill_timeout`` seconds), memory still being released after that, and a timeout."""

    gpus: list = field(default_factory=list)
    held: list = field(default_factory=list)
    stuck: list = field(default_factory=list)
    lasting: bool = False
    late: list = field(default_factory=list)
    timed_out: bool = False


def mib_text(value) -> str:
    return "?" if value is None else str(value)


class ReleaseWatch:
    """Watches the selected GPUs of a reap's plan until what its candidates held is released."""

    def __init__(self, options: ReapOptions, host: ReapHost, plan: Plan):
        self.options = options
        self.host = host
        self.plan = plan

    def current_gpus(self) -> list:
        """The selected GPUs as they are now."""
        wanted = {gpu.uuid for gpu in self.plan.gpus}
        return [gpu for gpu in self.host.query(self.plan.backend, self.host.run_command)[1] if gpu.uuid in wanted]

    def _held(self, reaped_pids: set, releasing: dict) -> tuple:
        """(current selected GPUs, [Held]) for memory not yet released.

        ``releasing`` maps a GPU's UUID to ``(MiB used that no listed process held before the reap, {reaped PID:
        MiB it held there})``: the driver frees a process's memory some time after the process is gone, and NVML
        lists live processes only, so until then the memory shows as used with no process listed.
        """
        gpus = self.current_gpus()
        held = []
        for gpu in gpus:
            for proc in gpu.processes:
                if proc.pid in reaped_pids:
                    text = f"pid {proc.pid} still holds {mib_text(proc.used_mib)} MiB on {gpu.display}"
                    held.append(Held(gpu.uuid, proc.pid, LISTED, text))
            before, reaped = releasing.get(gpu.uuid, (None, {}))
            now = unlisted_mib(gpu)
            if before is not None and now is not None and now - before > RELEASE_SLACK_MIB:
                pids = ", ".join(f"{pid} ({mib_text(mib)} MiB)" for pid, mib in sorted(reaped.items()))
                text = (
                    f"{gpu.display} still uses {now - before} MiB more than its listed processes hold: memory of "
                    f"reaped pid {pids} the driver has not released yet"
                )
                held.append(Held(gpu.uuid, None, RELEASING, text))
            below = self.options.released_below_mib
            if below is not None and (gpu.in_use_mib is None or gpu.in_use_mib > below):
                holders = ", ".join(str(proc.pid) for proc in gpu.processes) or "no listed process"
                reserved = f" beyond the driver's {gpu.reserved_mib} MiB reservation" if gpu.reserved_mib else ""
                text = (
                    f"{gpu.display} uses {mib_text(gpu.in_use_mib)} MiB{reserved} > released_below_mib {below} "
                    f"(holders: {holders})"
                )
                held.append(Held(gpu.uuid, None, ABOVE_FLOOR, text))
        if self.options.include_device_holders:
            open_files = self.host.holders(self.host.proc_root)
            held.extend(
                Held(None, pid, DEVICE_FILES, f"pid {pid} still has {', '.join(open_files[pid])} open")
                for pid in reaped_pids & set(open_files)
            )
        return gpus, held

    def _stuck(self, gpus: list) -> list:
        return memory_without_live_holder(
            gpus, lambda pid: read_process(pid, self.host.proc_root), self.options.unaccounted_threshold_mib
        )

    def lasting_stuck(self) -> list:
        """Memory without a live holder on the selected GPUs that is still there ``kill_timeout`` seconds on (memory
        the driver is releasing after its holder exited goes sooner); for check mode, which signals nothing."""
        found = self._stuck(self.plan.gpus)

        def released() -> bool:
            found[:] = self._stuck(self.current_gpus())
            return not found

        if found:
            wait_for(released, self.options.kill_timeout, MEMORY_POLL_S, self.host.clock, self.host.sleep)
        return found

    def _pids_to_watch(self, candidates: list) -> set:
        """The candidates' PIDs, minus any now taken by a different process (a reused PID)."""
        watched = set()
        for candidate in candidates:
            proc = read_process(candidate.pid, self.host.proc_root)
            if proc is None or proc.start_time == candidate.proc.start_time:
                watched.add(candidate.pid)
        return watched

    def _releasing_baseline(self) -> dict:
        """Per GPU a candidate held memory on: (MiB used that no listed process held, {candidate PID: MiB})."""
        pids = {candidate.pid for candidate in self.plan.candidates}
        baseline = {}
        for gpu in self.plan.gpus:
            reaped = {proc.pid: proc.used_mib for proc in gpu.processes if proc.pid in pids}
            if reaped:
                baseline[gpu.uuid] = (unlisted_mib(gpu), reaped)
        return baseline

    def wait(self, timeout: float, unkillable: set) -> Release:
        """Poll until the reaped memory is released: no reaped PID listed, and the GPUs' used memory down to what
        their listed processes hold (as before the reap). Memory nobody can free (zombies, gone PIDs, used memory no
        process accounts for) ends the wait once it has stayed ``kill_timeout`` seconds, and only then counts as
        unreapable: the driver's release lags a process's exit."""
        release = Release()
        baseline = self._releasing_baseline()
        started = self.host.clock()

        def settled() -> bool:
            release.gpus, release.held = self._held(self._pids_to_watch(self.plan.candidates), baseline)
            release.stuck = self._stuck(release.gpus)
            release.lasting = self.host.clock() - started >= self.options.kill_timeout
            stuck_pids = {entry["pid"] for entry in release.stuck} | unkillable
            stuck_gpus = {entry["uuid"] for entry in release.stuck} | self._gpus_of(unkillable)

            def explained(entry: Held) -> bool:
                return entry.pid in stuck_pids or (entry.pid is None and entry.uuid in stuck_gpus)

            pending = [entry for entry in release.held if not explained(entry)]
            # Less than unaccounted_threshold_mib that stays: a figure NVML gets wrong is no reason to wait out timeout.
            release.late = [entry.text for entry in pending if entry.kind == RELEASING] if release.lasting else []
            if any(entry.kind != RELEASING or not release.lasting for entry in pending):
                return False
            return not release.stuck or release.lasting

        release.timed_out = not wait_for(settled, timeout, MEMORY_POLL_S, self.host.clock, self.host.sleep)
        return release

    def _gpus_of(self, pids: set) -> set:
        return {gpu.uuid for gpu in self.plan.gpus for proc in gpu.processes if proc.pid in pids}
