# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reap the processes that hold GPU memory: scope, safety rules, signals, and the wait for release.

Private to the llmops.inference collection; not a public API (the logic of the nvidia_reap module).

Scope: a process is in scope when its PID is listed in ``pids``, or when it passes every one of the
other selectors that are set (``unit`` AND ``match`` AND ``orphans_only``). Candidates are the
in-scope processes that hold memory on the selected GPUs (or a /dev/nvidia* file, when asked),
minus the safety exclusions, which always apply and are reported in ``excluded``.

Unreapable: a candidate still alive ``kill_timeout`` seconds after SIGKILL, and memory on the selected GPUs
that no live process holds (a zombie or a gone PID the driver still lists, or used memory no listed process
accounts for) once it has lasted ``kill_timeout`` seconds. Only a GPU reset or a reboot frees either; the
result lists them in ``unreapable`` with their evidence.
"""

from __future__ import annotations

import dataclasses
import signal
from copy import deepcopy

from ansible_collections.llmops.inference.plugins.module_utils.gpu import GpuQueryError
from ansible_collections.llmops.inference.plugins.module_utils.gpu_memory import reset_message, stuck_entry
from ansible_collections.llmops.inference.plugins.module_utils.procs import (
    is_alive,
    read_process,
    signal_name,
    wait_for,
)
from ansible_collections.llmops.inference.plugins.module_utils.reap_options import (
    ReapError,
    ReapHost,
    ReapInputError,
    ReapOptions,
    parse_options,
)
from ansible_collections.llmops.inference.plugins.module_utils.reap_plan import Candidate, Plan, plan_reap
from ansible_collections.llmops.inference.plugins.module_utils.reap_release import ReleaseWatch, mib_text

__all__ = ["GpuReaper", "ReapError", "ReapHost", "ReapInputError", "parse_options"]

EXIT_POLL_S = 0.1


def render_gpus(gpus: list) -> str:
    """Text for diff mode: one line per GPU, one indented line per holder."""
    lines = []
    for gpu in gpus:
        reserved = "" if gpu.reserved_mib is None else f" ({gpu.reserved_mib} reserved by the driver)"
        lines.append(
            f"{gpu.display} {gpu.uuid}: {mib_text(gpu.used_mib)} / {mib_text(gpu.total_mib)} MiB used{reserved}"
        )
        lines.extend(f"  pid {proc.pid}: {mib_text(proc.used_mib)} MiB" for proc in gpu.processes)
    return "\n".join(lines) + "\n"


def _used_total(gpus: list) -> int | None:
    values = [gpu.used_mib for gpu in gpus]
    return None if any(value is None for value in values) else sum(values)


class GpuReaper:
    """Plans and carries out one reap. Every effect goes through ``host`` (injectable, for tests)."""

    def __init__(self, options: ReapOptions, run_command, host: ReapHost | None = None):
        self.options = options
        self.host = dataclasses.replace(host or ReapHost(), run_command=run_command)

    def plan(self) -> Plan:
        return plan_reap(self.options, self.host)

    def _alive(self, candidate: Candidate) -> bool:
        alive = is_alive(candidate.pid, self.host.proc_root, candidate.proc.start_time)
        candidate.exited = not alive
        return alive

    def _signal(self, candidate: Candidate, signum: int) -> None:
        """Signal a candidate that is still the same process (its start time guards against PID reuse)."""
        if not self._alive(candidate):
            return
        try:
            delivered = self.host.kill(candidate.pid, signum)
        except PermissionError:
            raise ReapError(
                f"not permitted to signal pid {candidate.pid} ({candidate.proc.title}); run as root"
            ) from None
        if delivered:
            candidate.signals.append(signal_name(signum))
        else:
            candidate.exited = True

    def _all_exited(self, candidates: list) -> bool:
        return not [c for c in candidates if self._alive(c)]

    def run(self, check_mode: bool = False) -> dict:
        """Plan, then (outside check mode) signal, wait, and verify; return the module result.

        Raises ReapInputError for bad options (nothing signalled), ReapError when reaping could not
        finish, or when memory nobody can free is left (unless ``fail_on_unreapable`` is false); its
        ``result`` then holds what was done.
        """
        started = self.host.clock()
        try:
            plan = self.plan()
        except GpuQueryError as exc:
            raise ReapError(str(exc)) from None
        result = {
            "backend": plan.backend,
            "excluded": plan.excluded,
            "unkillable": [],
            "unreapable": [],
            "reset_gpus": [],
            "gpus_before": [gpu.as_dict() for gpu in plan.gpus],
            "warnings": list(plan.warnings),
        }
        if plan.unit_state is not None:
            result["unit_state"] = plan.unit_state.as_dict()
        failure = None
        if check_mode:
            gpus_after, shown_after = plan.gpus, _without(plan.gpus, {c.pid for c in plan.candidates})
            result["unreapable"] = ReleaseWatch(self.options, self.host, plan).lasting_stuck()
            result["warnings"].extend(
                f"pid {c.pid} ({c.proc.title}) is in uninterruptible sleep (state D) and may survive SIGKILL"
                for c in plan.candidates
                if c.proc.state == "D"
            )
        else:
            try:
                gpus_after, failure = self._reap(plan, result)
            except (GpuQueryError, ReapError) as exc:
                gpus_after, failure = plan.gpus, str(exc)
            shown_after = gpus_after
        failure = self._judge_unreapable(result, failure, check_mode)
        before_total, after_total = _used_total(plan.gpus), _used_total(gpus_after)
        result.update(
            changed=bool(plan.candidates) if check_mode else any(c.signals for c in plan.candidates),
            reaped=[c.as_dict() for c in plan.candidates],
            gpus_after=[gpu.as_dict() for gpu in gpus_after],
            released_mib=None if None in (before_total, after_total) else max(before_total - after_total, 0),
            elapsed_s=round(self.host.clock() - started, 3),
            diff={
                "before_header": "GPU memory before",
                "after_header": "GPU memory after",
                "before": render_gpus(plan.gpus),
                "after": render_gpus(shown_after),
            },
        )
        if failure:
            raise ReapError(failure, result)
        return result

    def _judge_unreapable(self, result: dict, failure: str | None, check_mode: bool) -> str | None:
        """Name the GPUs to reset; the memory nobody can free fails the reap (in check mode, or with
        fail_on_unreapable false, it is a warning). Returns the failure message, or None."""
        unreapable = result["unreapable"]
        result["reset_gpus"] = sorted({entry["gpu"] for entry in unreapable if entry["gpu"] is not None})
        if not unreapable:
            return failure
        message = reset_message(unreapable)
        if check_mode or not self.options.fail_on_unreapable:
            result["warnings"].append(message)
            return failure
        if failure is None:
            return message
        return failure if message in failure else f"{message}; {failure}"

    def _survivor_entries(self, plan: Plan, candidate: Candidate, proc, alive_s: float) -> list:
        """Unreapable entries for a candidate still alive after SIGKILL: one per GPU it holds memory on."""
        memory = {
            gpu.uuid: (gpu, held.used_mib) for gpu in plan.gpus for held in gpu.processes if held.pid == candidate.pid
        }
        base = f"pid {candidate.pid} {candidate.proc.title!r} (state {proc.state}, parent {proc.ppid}) still alive "
        base += f"{alive_s:.1f} s after SIGKILL"
        entries = []
        for gpu, mib in memory.values():
            entries.append(stuck_entry(gpu, candidate.pid, mib, f"{base}, holding {mib_text(mib)} MiB", proc))
        if not entries:
            files = ", ".join(candidate.holding.device_files) or "no GPU memory listed"
            entries.append(
                {
                    "gpu": None,
                    "uuid": None,
                    "pid": candidate.pid,
                    "state": proc.state,
                    "ppid": proc.ppid,
                    "title": proc.title,
                    "mib": None,
                    "evidence": f"{base}, with {files} open",
                }
            )
        return entries

    def _wait_exits(self, candidates: list, timeout: float) -> bool:
        return wait_for(lambda: self._all_exited(candidates), timeout, EXIT_POLL_S, self.host.clock, self.host.sleep)

    def _signal_all(self, candidates: list) -> float | None:
        """Send the signal, and SIGKILL to those still alive after grace. Returns when SIGKILL went out, or None."""
        options = self.options
        for candidate in candidates:
            self._signal(candidate, options.signal)
        if not candidates:
            return None
        if options.signal == signal.SIGKILL:
            return self.host.clock()
        if self._wait_exits(candidates, options.grace):
            return None
        for candidate in candidates:
            self._signal(candidate, signal.SIGKILL)
        return self.host.clock()

    def _unkillable(self, plan: Plan, result: dict, killed_at: float | None) -> set:
        """The candidates still alive after the wait for their exit, recorded as unkillable and unreapable."""
        unkillable = set()
        for candidate in plan.candidates:
            proc = read_process(candidate.pid, self.host.proc_root)
            if not candidate.exited and proc is not None:
                unkillable.add(candidate.pid)
                result["unkillable"].append({"pid": candidate.pid, "title": candidate.proc.title, "state": proc.state})
                alive_s = self.host.clock() - (killed_at if killed_at is not None else self.host.clock())
                result["unreapable"].extend(self._survivor_entries(plan, candidate, proc, alive_s))
        if result["unkillable"]:
            listed = ", ".join(f"{entry['pid']} (state {entry['state']})" for entry in result["unkillable"])
            result["warnings"].append(f"still alive after SIGKILL: {listed}")
        return unkillable

    def _reap(self, plan: Plan, result: dict) -> tuple:
        """Signal, escalate, wait for exits and release. Returns (GPUs after, failure message or None)."""
        options = self.options
        candidates = plan.candidates
        killed_at = self._signal_all(candidates)
        deadline = self.host.clock() + options.timeout
        if candidates:
            self._wait_exits(
                candidates, options.timeout if killed_at is None else min(options.timeout, options.kill_timeout)
            )
        unkillable = self._unkillable(plan, result, killed_at)
        watch = ReleaseWatch(options, self.host, plan)
        if not options.wait_released:
            return watch.current_gpus(), None
        release = watch.wait(max(deadline - self.host.clock(), 0), unkillable)
        if release.lasting:
            result["unreapable"].extend(release.stuck)
        result["warnings"].extend(
            f"{text}, {options.kill_timeout:g} s on (below unaccounted_threshold_mib, so not judged unreapable)"
            for text in release.late
        )
        return release.gpus, _not_released(release, options.timeout)


def _not_released(release, timeout: float) -> str | None:
    """The failure of a wait for release that timed out, naming what is still held; None otherwise."""
    if not release.timed_out:
        return None
    # Memory nobody can free that has not stayed kill_timeout yet is named as not released, not as unreapable.
    named = {entry.uuid for entry in release.held}
    unconfirmed = [] if release.lasting else [e for e in release.stuck if e["uuid"] not in named]
    reasons = [entry.text for entry in release.held] + [entry["evidence"] for entry in unconfirmed]
    if not reasons:
        return None
    return f"GPU memory not released within timeout {timeout:g}s: " + "; ".join(reasons)


def _without(gpus: list, pids: set) -> list:
    """GPUs as they would look once ``pids`` released their memory (the check-mode prediction)."""
    predicted = deepcopy(gpus)
    for gpu in predicted:
        freed = sum(proc.used_mib or 0 for proc in gpu.processes if proc.pid in pids)
        gpu.processes = [proc for proc in gpu.processes if proc.pid not in pids]
        if gpu.used_mib is not None:
            gpu.used_mib -= freed
    return predicted
