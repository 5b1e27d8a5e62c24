# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The plan of a reap: the selected GPUs, the processes in scope that hold memory on them, and those the safety
rules exclude. Nothing is signalled here.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.gpu import select_gpus
from ansible_collections.llmops.inference.plugins.module_utils.module_support import refused_as
from ansible_collections.llmops.inference.plugins.module_utils.procs import ancestors, is_orphan, read_process
from ansible_collections.llmops.inference.plugins.module_utils.reap_options import (
    ReapError,
    ReapHost,
    ReapInputError,
    ReapOptions,
)
from ansible_collections.llmops.inference.plugins.module_utils.systemd import (
    SystemdError,
    list_running_units,
    show_unit,
)


@dataclass
class Holding:
    """What one process holds: GPU indices with memory, and /dev/nvidia* files."""

    gpus: list = field(default_factory=list)
    used_mib: int | None = None
    device_files: list = field(default_factory=list)


@dataclass
class Candidate:
    proc: object
    holding: Holding
    signals: list = field(default_factory=list)
    exited: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def as_dict(self) -> dict:
        return {
            "pid": self.proc.pid,
            "title": self.proc.title,
            "cmdline": self.proc.cmdline,
            "unit": self.proc.unit,
            "gpus": list(self.holding.gpus),
            "used_mib": self.holding.used_mib,
            "device_files": list(self.holding.device_files),
            "signals": list(self.signals),
            "exited": self.exited,
        }


@dataclass
class Plan:
    backend: str
    gpus: list
    candidates: list
    excluded: list
    unit_state: object = None
    warnings: list = field(default_factory=list)


def holdings(gpus: list, device_files: dict) -> dict:
    """{pid: Holding} from the selected GPUs' process lists and the /dev/nvidia* holders."""
    held = {}
    for gpu in gpus:
        for proc in gpu.processes:
            holding = held.setdefault(proc.pid, Holding())
            if gpu.index not in holding.gpus:
                holding.gpus.append(gpu.index)
            if proc.used_mib is not None:
                holding.used_mib = (holding.used_mib or 0) + proc.used_mib
    for pid, paths in device_files.items():
        held.setdefault(pid, Holding()).device_files = list(paths)
    return held


def _units(options: ReapOptions, host: ReapHost) -> tuple:
    """(target UnitState or None, {running unit: state}); refuses a running target unit."""
    if not host.booted():
        if options.unit:
            raise ReapInputError("unit", "systemd is not the init system on this host, so there are no units")
        return None, {}
    try:
        running = list_running_units(host.run_command)
        state = show_unit(host.run_command, options.unit) if options.unit else None
    except SystemdError as exc:
        raise ReapError(str(exc)) from None
    if state is not None and state.is_running and not options.allow_active:
        raise ReapInputError(
            "unit",
            f"{state.name} is {state.active_state} ({state.sub_state}); stop it first, "
            "or set allow_active: true to reap the processes of a running unit",
        )
    return state, running


def _in_scope(options: ReapOptions, proc, unit_name: str | None, proc_root: str) -> bool:
    if proc.pid in options.pids:
        return True
    filters = []
    if unit_name:
        filters.append(proc.in_unit(unit_name))
    if options.match is not None:
        filters.append(bool(options.match.search(proc.title) or options.match.search(proc.cmdline)))
    if options.orphans_only:
        filters.append(is_orphan(proc, proc_root))
    return bool(filters) and all(filters)


@dataclass
class _Guard:
    """What the safety rules protect besides PID 1 and kernel threads: the module's process and its ancestors, the
    processes of other running units (unless listed in pids)."""

    own_pid: int
    protected: set
    unit_name: str | None
    running: dict
    listed: tuple

    def exclusion(self, proc) -> str | None:
        """Why a process in scope must not be signalled, or None. These rules always apply."""
        reasons = (
            (proc.pid == 1, "PID 1 (the init system) is never signalled"),
            (proc.pid == self.own_pid, "the module's own process"),
            (proc.pid in self.protected, "an ancestor of the module's process"),
            (proc.is_kernel_thread, "kernel thread"),
        )
        for applies, reason in reasons:
            if applies:
                return reason
        if not proc.is_alive:
            return f"already exited (state {proc.state})"
        owner = proc.unit
        if owner and owner != self.unit_name and owner in self.running and proc.pid not in self.listed:
            return f"belongs to {self.running[owner]} unit {owner}; list its PID in pids to reap it anyway"
        return None


def _warnings(unit_state, gpus: list) -> list:
    warnings = []
    if unit_state is not None and unit_state.load_state not in ("loaded", ""):
        warnings.append(f"unit {unit_state.name} is not loaded (LoadState={unit_state.load_state})")
    for gpu in gpus:
        warnings.extend(
            f"{gpu.display} ({gpu.uuid}): {error['field']} unavailable ({error['error']})"
            + ("; the processes holding memory on it cannot be found" if error["field"] == "processes" else "")
            for error in gpu.errors
        )
    return warnings


def plan_reap(options: ReapOptions, host: ReapHost) -> Plan:
    """Look at the host: the target unit, the selected GPUs and who holds them; sort the holders in scope into
    candidates and exclusions."""
    unit_state, running = _units(options, host)
    unit_name = unit_state.name if unit_state else None
    backend, gpus = host.query(options.backend, host.run_command)
    with refused_as("gpus", ReapInputError):
        gpus = select_gpus(gpus, options.gpus)
    device_files = host.holders(host.proc_root) if options.include_device_holders else {}
    held = holdings(gpus, device_files)
    guard = _Guard(host.own_pid, set(ancestors(host.own_pid, host.proc_root)), unit_name, running, options.pids)
    candidates, excluded = [], []
    for pid in sorted(set(held) | set(options.pids)):
        proc = read_process(pid, host.proc_root)
        if proc is None:
            if pid in options.pids:
                excluded.append({"pid": pid, "reason": "no such process"})
            continue
        if not _in_scope(options, proc, unit_name, host.proc_root):
            continue
        reason = guard.exclusion(proc)
        if reason is None and pid not in held:
            reason = "holds no memory on the selected GPUs"
        if reason:
            excluded.append({"pid": pid, "reason": reason})
        else:
            candidates.append(Candidate(proc, held[pid]))
    return Plan(backend, gpus, candidates, excluded, unit_state, _warnings(unit_state, gpus))
