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

import os
import re
import signal
import time
from copy import deepcopy
from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.gpu import (
    BACKENDS,
    GpuQueryError,
    device_holders,
    memory_without_live_holder,
    query_gpus,
    reset_message,
    select_gpus,
    stuck_entry,
    unlisted_mib,
)
from ansible_collections.llmops.inference.plugins.module_utils.module_support import PrefixedOptionError, refused_as
from ansible_collections.llmops.inference.plugins.module_utils.procs import (
    ancestors,
    is_alive,
    is_orphan,
    read_process,
    send_signal,
    signal_name,
    signal_number,
    wait_for,
)
from ansible_collections.llmops.inference.plugins.module_utils.systemd import (
    SystemdError,
    list_running_units,
    show_unit,
    systemd_booted,
)

EXIT_POLL_S = 0.1
MEMORY_POLL_S = 0.2
# Used memory that no listed process holds may grow by this much over a reap without being waited for (NVML's
# per-process figures and the device's used memory are read at different moments).
RELEASE_SLACK_MIB = 64
# Why memory is not released yet: a reaped PID still listed, memory the driver is still releasing, a GPU above
# released_below_mib, a /dev/nvidia* file still open.
LISTED, RELEASING, ABOVE_FLOOR, DEVICE_FILES = "listed", "releasing", "above_floor", "device_files"
DEFAULT_KILL_TIMEOUT = 10.0
DEFAULT_UNACCOUNTED_THRESHOLD_MIB = 1024


class ReapInputError(PrefixedOptionError):
    """An option is invalid; nothing was signalled. The message starts with the option's name."""


class ReapError(Exception):
    """Reaping could not finish; ``result`` holds what was done so far."""

    def __init__(self, message: str, result: dict | None = None):
        self.result = result or {}
        super().__init__(message)


@dataclass
class ReapOptions:
    unit: str | None = None
    allow_active: bool = False
    match: re.Pattern | None = None
    orphans_only: bool = False
    pids: tuple = ()
    gpus: tuple = ()
    include_device_holders: bool = False
    backend: str = "auto"
    signal: int = signal.SIGTERM
    grace: float = 10.0
    wait_released: bool = True
    released_below_mib: int | None = None
    timeout: float = 60.0
    kill_timeout: float = DEFAULT_KILL_TIMEOUT
    unaccounted_threshold_mib: int = DEFAULT_UNACCOUNTED_THRESHOLD_MIB
    fail_on_unreapable: bool = True


def _non_negative(params: dict, option: str, default: float) -> float:
    value = params.get(option)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ReapInputError(option, f"must be a number of seconds >= 0, got {value!r}") from None
    if number < 0:
        raise ReapInputError(option, f"must be >= 0 seconds, got {value!r}")
    return number


def _mib_option(params: dict, option: str, default: int) -> int:
    value = params.get(option)
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ReapInputError(option, f"must be a whole number of MiB >= 0, got {value!r}") from None
    if isinstance(value, bool) or number < 0:
        raise ReapInputError(option, f"must be a whole number of MiB >= 0, got {value!r}")
    return number


def _pids(value) -> tuple:
    pids = []
    for item in value or ():
        try:
            pid = int(str(item).strip())
        except ValueError:
            raise ReapInputError("pids", f"{item!r} is not a process ID; give positive integers") from None
        if pid <= 0:
            raise ReapInputError("pids", f"{pid} is not a process ID; give positive integers")
        if pid == 1:
            raise ReapInputError("pids", "PID 1 (the init system) is never reaped; remove it from the list")
        if pid not in pids:
            pids.append(pid)
    return tuple(pids)


def parse_options(params: dict) -> ReapOptions:
    """Validate the options that need no look at the host; raise ReapInputError naming the option."""
    pids = _pids(params.get("pids"))
    unit = (params.get("unit") or "").strip() or None
    pattern = params.get("match")
    match = None
    if pattern not in (None, ""):
        try:
            match = re.compile(pattern)
        except re.error as exc:
            raise ReapInputError("match", f"{pattern!r} is not a valid regular expression: {exc}") from None
    orphans_only = bool(params.get("orphans_only"))
    if not (unit or match or orphans_only or pids):
        raise ReapInputError(
            "unit",
            "no scope selector given; set at least one of unit, match, orphans_only (true) or pids",
        )
    backend = params.get("backend") or "auto"
    if backend not in BACKENDS:
        raise ReapInputError("backend", f"{backend!r} is not one of {', '.join(BACKENDS)}")
    with refused_as("signal", ReapInputError):
        signum = signal_number(params.get("signal") or "SIGTERM")
    below = params.get("released_below_mib")
    if below is not None and int(below) < 0:
        raise ReapInputError("released_below_mib", f"must be >= 0 MiB, got {below!r}")
    kill_timeout = _non_negative(params, "kill_timeout", DEFAULT_KILL_TIMEOUT)
    if kill_timeout <= 0:
        raise ReapInputError("kill_timeout", f"must be > 0 seconds, got {params.get('kill_timeout')!r}")
    unaccounted = _mib_option(params, "unaccounted_threshold_mib", DEFAULT_UNACCOUNTED_THRESHOLD_MIB)
    return ReapOptions(
        unit=unit,
        allow_active=bool(params.get("allow_active")),
        match=match,
        orphans_only=orphans_only,
        pids=pids,
        gpus=tuple(params.get("gpus") or ()),
        include_device_holders=bool(params.get("include_device_holders")),
        backend=backend,
        signal=signum,
        grace=_non_negative(params, "grace", 10.0),
        wait_released=params.get("wait_released", True) is not False,
        released_below_mib=None if below is None else int(below),
        timeout=_non_negative(params, "timeout", 60.0),
        kill_timeout=kill_timeout,
        unaccounted_threshold_mib=unaccounted,
        fail_on_unreapable=params.get("fail_on_unreapable", True) is not False,
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


def render_gpus(gpus: list) -> str:
    """Text for diff mode: one line per GPU, one indented line per holder."""
    lines = []
    for gpu in gpus:
        reserved = "" if gpu.reserved_mib is None else f" ({gpu.reserved_mib} reserved by the driver)"
        lines.append(f"{gpu.display} {gpu.uuid}: {_mib(gpu.used_mib)} / {_mib(gpu.total_mib)} MiB used{reserved}")
        lines.extend(f"  pid {proc.pid}: {_mib(proc.used_mib)} MiB" for proc in gpu.processes)
    return "\n".join(lines) + "\n"


def _mib(value) -> str:
    return "?" if value is None else str(value)


def _used_total(gpus: list) -> int | None:
    values = [gpu.used_mib for gpu in gpus]
    return None if any(value is None for value in values) else sum(values)


class GpuReaper:
    """Plans and carries out one reap. Every effect goes through injectable callables, for tests."""

    def __init__(
        self,
        options: ReapOptions,
        run_command,
        *,
        proc_root: str = "/proc",
        own_pid: int | None = None,
        kill=send_signal,
        clock=time.monotonic,
        sleep=time.sleep,
        query=query_gpus,
        holders=device_holders,
        booted=systemd_booted,
    ):
        self.options = options
        self.run_command = run_command
        self.proc_root = proc_root
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.kill = kill
        self.clock = clock
        self.sleep = sleep
        self.query = query
        self.holders = holders
        self.booted = booted

    # -- planning ------------------------------------------------------------------------------

    def _query_selected(self) -> tuple:
        backend, gpus = self.query(self.options.backend, self.run_command)
        with refused_as("gpus", ReapInputError):
            selected = select_gpus(gpus, self.options.gpus)
        return backend, selected

    def _units(self) -> tuple:
        """(target UnitState or None, {running unit: state}); refuses a running target unit."""
        if not self.booted():
            if self.options.unit:
                raise ReapInputError("unit", "systemd is not the init system on this host, so there are no units")
            return None, {}
        try:
            running = list_running_units(self.run_command)
            state = show_unit(self.run_command, self.options.unit) if self.options.unit else None
        except SystemdError as exc:
            raise ReapError(str(exc)) from None
        if state is not None and state.is_running and not self.options.allow_active:
            raise ReapInputError(
                "unit",
                f"{state.name} is {state.active_state} ({state.sub_state}); stop it first, "
                "or set allow_active: true to reap the processes of a running unit",
            )
        return state, running

    def _in_scope(self, proc, unit_name: str | None) -> bool:
        if proc.pid in self.options.pids:
            return True
        filters = []
        if unit_name:
            filters.append(proc.in_unit(unit_name))
        if self.options.match is not None:
            filters.append(bool(self.options.match.search(proc.title) or self.options.match.search(proc.cmdline)))
        if self.options.orphans_only:
            filters.append(is_orphan(proc, self.proc_root))
        return bool(filters) and all(filters)

    def _exclusion(self, proc, unit_name: str | None, running: dict, protected: set) -> str | None:
        """Why a process in scope must not be signalled, or None. These rules always apply."""
        if proc.pid == 1:
            return "PID 1 (the init system) is never signalled"
        if proc.pid == self.own_pid:
            return "the module's own process"
        if proc.pid in protected:
            return "an ancestor of the module's process"
        if proc.is_kernel_thread:
            return "kernel thread"
        if not proc.is_alive:
            return f"already exited (state {proc.state})"
        owner = proc.unit
        if owner and owner != unit_name and owner in running and proc.pid not in self.options.pids:
            return f"belongs to {running[owner]} unit {owner}; list its PID in pids to reap it anyway"
        return None

    def plan(self) -> Plan:
        unit_state, running = self._units()
        unit_name = unit_state.name if unit_state else None
        backend, gpus = self._query_selected()
        device_files = self.holders(self.proc_root) if self.options.include_device_holders else {}
        held = holdings(gpus, device_files)
        protected = set(ancestors(self.own_pid, self.proc_root))
        warnings = []
        if unit_state is not None and unit_state.load_state not in ("loaded", ""):
            warnings.append(f"unit {unit_name} is not loaded (LoadState={unit_state.load_state})")
        for gpu in gpus:
            warnings.extend(
                f"{gpu.display} ({gpu.uuid}): {error['field']} unavailable ({error['error']})"
                + ("; the processes holding memory on it cannot be found" if error["field"] == "processes" else "")
                for error in gpu.errors
            )
        candidates, excluded = [], []
        for pid in sorted(set(held) | set(self.options.pids)):
            proc = read_process(pid, self.proc_root)
            if proc is None:
                if pid in self.options.pids:
                    excluded.append({"pid": pid, "reason": "no such process"})
                continue
            if not self._in_scope(proc, unit_name):
                continue
            reason = self._exclusion(proc, unit_name, running, protected)
            if reason is None and pid not in held:
                reason = "holds no memory on the selected GPUs"
            if reason:
                excluded.append({"pid": pid, "reason": reason})
            else:
                candidates.append(Candidate(proc, held[pid]))
        return Plan(backend, gpus, candidates, excluded, unit_state, warnings)

    # -- acting --------------------------------------------------------------------------------

    def _alive(self, candidate: Candidate) -> bool:
        alive = is_alive(candidate.pid, self.proc_root, candidate.proc.start_time)
        candidate.exited = not alive
        return alive

    def _signal(self, candidate: Candidate, signum: int) -> None:
        """Signal a candidate that is still the same process (its start time guards against PID reuse)."""
        if not self._alive(candidate):
            return
        try:
            delivered = self.kill(candidate.pid, signum)
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

    def _current_gpus(self, plan: Plan) -> list:
        """The selected GPUs as they are now."""
        wanted = {gpu.uuid for gpu in plan.gpus}
        return [gpu for gpu in self.query(plan.backend, self.run_command)[1] if gpu.uuid in wanted]

    def _held(self, plan: Plan, reaped_pids: set, releasing: dict) -> tuple:
        """(current selected GPUs, [Held]) for memory not yet released.

        ``releasing`` maps a GPU's UUID to ``(MiB used that no listed process held before the reap, {reaped PID:
        MiB it held there})``: the driver frees a process's memory some time after the process is gone, and NVML
        lists live processes only, so until then the memory shows as used with no process listed.
        """
        gpus = self._current_gpus(plan)
        held = []
        for gpu in gpus:
            for proc in gpu.processes:
                if proc.pid in reaped_pids:
                    text = f"pid {proc.pid} still holds {_mib(proc.used_mib)} MiB on {gpu.display}"
                    held.append(Held(gpu.uuid, proc.pid, LISTED, text))
            before, reaped = releasing.get(gpu.uuid, (None, {}))
            now = unlisted_mib(gpu)
            if before is not None and now is not None and now - before > RELEASE_SLACK_MIB:
                pids = ", ".join(f"{pid} ({_mib(mib)} MiB)" for pid, mib in sorted(reaped.items()))
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
                    f"{gpu.display} uses {_mib(gpu.in_use_mib)} MiB{reserved} > released_below_mib {below} "
                    f"(holders: {holders})"
                )
                held.append(Held(gpu.uuid, None, ABOVE_FLOOR, text))
        if self.options.include_device_holders:
            open_files = self.holders(self.proc_root)
            held.extend(
                Held(None, pid, DEVICE_FILES, f"pid {pid} still has {', '.join(open_files[pid])} open")
                for pid in reaped_pids & set(open_files)
            )
        return gpus, held

    def _stuck(self, gpus: list) -> list:
        return memory_without_live_holder(
            gpus, lambda pid: read_process(pid, self.proc_root), self.options.unaccounted_threshold_mib
        )

    def _lasting_stuck(self, plan: Plan) -> list:
        """Memory without a live holder on the selected GPUs that is still there ``kill_timeout`` seconds on (memory
        the driver is releasing after its holder exited goes sooner); for check mode, which signals nothing."""
        found = self._stuck(plan.gpus)

        def released() -> bool:
            found[:] = self._stuck(self._current_gpus(plan))
            return not found

        if found:
            wait_for(released, self.options.kill_timeout, MEMORY_POLL_S, self.clock, self.sleep)
        return found

    def _pids_to_watch(self, candidates: list) -> set:
        """The candidates' PIDs, minus any now taken by a different process (a reused PID)."""
        watched = set()
        for candidate in candidates:
            proc = read_process(candidate.pid, self.proc_root)
            if proc is None or proc.start_time == candidate.proc.start_time:
                watched.add(candidate.pid)
        return watched

    @staticmethod
    def _releasing_baseline(plan: Plan) -> dict:
        """Per GPU a candidate held memory on: (MiB used that no listed process held, {candidate PID: MiB})."""
        pids = {candidate.pid for candidate in plan.candidates}
        baseline = {}
        for gpu in plan.gpus:
            reaped = {proc.pid: proc.used_mib for proc in gpu.processes if proc.pid in pids}
            if reaped:
                baseline[gpu.uuid] = (unlisted_mib(gpu), reaped)
        return baseline

    def _wait_released(self, plan: Plan, timeout: float, unkillable: set) -> Release:
        """Poll until the reaped memory is released: no reaped PID listed, and the GPUs' used memory down to what
        their listed processes hold (as before the reap). Memory nobody can free (zombies, gone PIDs, used memory no
        process accounts for) ends the wait once it has stayed ``kill_timeout`` seconds, and only then counts as
        unreapable: the driver's release lags a process's exit."""
        release = Release()
        baseline = self._releasing_baseline(plan)
        started = self.clock()

        def settled() -> bool:
            release.gpus, release.held = self._held(plan, self._pids_to_watch(plan.candidates), baseline)
            release.stuck = self._stuck(release.gpus)
            release.lasting = self.clock() - started >= self.options.kill_timeout
            stuck_pids = {entry["pid"] for entry in release.stuck} | unkillable
            stuck_gpus = {entry["uuid"] for entry in release.stuck} | self._gpus_of(plan, unkillable)

            def explained(entry: Held) -> bool:
                return entry.pid in stuck_pids or (entry.pid is None and entry.uuid in stuck_gpus)

            pending = [entry for entry in release.held if not explained(entry)]
            # Less than unaccounted_threshold_mib that stays: a figure NVML gets wrong is no reason to wait out timeout.
            release.late = [entry.text for entry in pending if entry.kind == RELEASING] if release.lasting else []
            if any(entry.kind != RELEASING or not release.lasting for entry in pending):
                return False
            return not release.stuck or release.lasting

        release.timed_out = not wait_for(settled, timeout, MEMORY_POLL_S, self.clock, self.sleep)
        return release

    def _gpus_of(self, plan: Plan, pids: set) -> set:
        return {gpu.uuid for gpu in plan.gpus for proc in gpu.processes if proc.pid in pids}

    def run(self, check_mode: bool = False) -> dict:
        """Plan, then (outside check mode) signal, wait, and verify; return the module result.

        Raises ReapInputError for bad options (nothing signalled), ReapError when reaping could not
        finish, or when memory nobody can free is left (unless ``fail_on_unreapable`` is false); its
        ``result`` then holds what was done.
        """
        started = self.clock()
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
            result["unreapable"] = self._lasting_stuck(plan)
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
        unreapable = result["unreapable"]
        result["reset_gpus"] = sorted({entry["gpu"] for entry in unreapable if entry["gpu"] is not None})
        if unreapable:
            message = reset_message(unreapable)
            if check_mode or not self.options.fail_on_unreapable:
                result["warnings"].append(message)
            elif failure is None:
                failure = message
            elif message not in failure:
                failure = f"{message}; {failure}"
        before_total, after_total = _used_total(plan.gpus), _used_total(gpus_after)
        result.update(
            changed=bool(plan.candidates) if check_mode else any(c.signals for c in plan.candidates),
            reaped=[c.as_dict() for c in plan.candidates],
            gpus_after=[gpu.as_dict() for gpu in gpus_after],
            released_mib=None if None in (before_total, after_total) else max(before_total - after_total, 0),
            elapsed_s=round(self.clock() - started, 3),
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

    def _survivor_entries(self, plan: Plan, candidate: Candidate, proc, alive_s: float) -> list:
        """Unreapable entries for a candidate still alive after SIGKILL: one per GPU it holds memory on."""
        memory = {
            gpu.uuid: (gpu, held.used_mib) for gpu in plan.gpus for held in gpu.processes if held.pid == candidate.pid
        }
        base = f"pid {candidate.pid} {candidate.proc.title!r} (state {proc.state}, parent {proc.ppid}) still alive "
        base += f"{alive_s:.1f} s after SIGKILL"
        entries = []
        for gpu, mib in memory.values():
            entries.append(stuck_entry(gpu, candidate.pid, mib, f"{base}, holding {_mib(mib)} MiB", proc))
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

    def _reap(self, plan: Plan, result: dict) -> tuple:
        """Signal, escalate, wait for exits and release. Returns (GPUs after, failure message or None)."""
        options = self.options
        candidates = plan.candidates
        for candidate in candidates:
            self._signal(candidate, options.signal)
        killed_at = self.clock() if candidates and options.signal == signal.SIGKILL else None
        if candidates and options.signal != signal.SIGKILL:
            exited = wait_for(lambda: self._all_exited(candidates), options.grace, EXIT_POLL_S, self.clock, self.sleep)
            if not exited:
                for candidate in candidates:
                    self._signal(candidate, signal.SIGKILL)
                killed_at = self.clock()
        deadline = self.clock() + options.timeout
        if candidates:
            exit_wait = options.timeout if killed_at is None else min(options.timeout, options.kill_timeout)
            wait_for(lambda: self._all_exited(candidates), exit_wait, EXIT_POLL_S, self.clock, self.sleep)
        unkillable = set()
        for candidate in candidates:
            proc = read_process(candidate.pid, self.proc_root)
            if not candidate.exited and proc is not None:
                unkillable.add(candidate.pid)
                result["unkillable"].append({"pid": candidate.pid, "title": candidate.proc.title, "state": proc.state})
                alive_s = self.clock() - (killed_at if killed_at is not None else self.clock())
                result["unreapable"].extend(self._survivor_entries(plan, candidate, proc, alive_s))
        if result["unkillable"]:
            listed = ", ".join(f"{entry['pid']} (state {entry['state']})" for entry in result["unkillable"])
            result["warnings"].append(f"still alive after SIGKILL: {listed}")
        if not options.wait_released:
            return self._current_gpus(plan), None
        release = self._wait_released(plan, max(deadline - self.clock(), 0), unkillable)
        if release.lasting:
            result["unreapable"].extend(release.stuck)
        result["warnings"].extend(
            f"{text}, {options.kill_timeout:g} s on (below unaccounted_threshold_mib, so not judged unreapable)"
            for text in release.late
        )
        if release.timed_out:
            # Memory nobody can free that has not stayed kill_timeout yet is named as not released, not as unreapable.
            named = {entry.uuid for entry in release.held}
            unconfirmed = [] if release.lasting else [e for e in release.stuck if e["uuid"] not in named]
            reasons = [entry.text for entry in release.held] + [entry["evidence"] for entry in unconfirmed]
            if reasons:
                return release.gpus, f"GPU memory not released within timeout {options.timeout:g}s: " + "; ".join(
                    reasons
                )
        return release.gpus, None


def _without(gpus: list, pids: set) -> list:
    """GPUs as they would look once ``pids`` released their memory (the check-mode prediction)."""
    predicted = deepcopy(gpus)
    for gpu in predicted:
        freed = sum(proc.used_mib or 0 for proc in gpu.processes if proc.pid in pids)
        gpu.processes = [proc for proc in gpu.processes if proc.pid not in pids]
        if gpu.used_mib is not None:
            gpu.used_mib -= freed
    return predicted
