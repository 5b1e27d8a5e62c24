# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Process inventory from /proc: parent, state, title, cgroup -> systemd unit, signals, polling waits.

Private to the llmops.inference collection; not a public API. Needs only the Python standard library.
Every reader takes ``proc_root`` so tests can point it at a fake /proc tree.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

PF_KTHREAD = 0x00200000  # include/linux/sched.h
KTHREADD_PID = 2
MAX_POLL_INTERVAL = 0.2
UNIT_SUFFIXES = (".service", ".scope")
# kernel/cgroup/cgroup.c (proc_cgroup_show): a zombie whose cgroup was removed before it was reaped.
DELETED_CGROUP_SUFFIX = " (deleted)"
# Subreapers (PR_SET_CHILD_SUBREAPER) cannot be read from /proc for another process. The usual
# subreaper on a systemd host is a per-user manager (`systemd --user`), so a parent whose
# command is `systemd` is taken as one.
SUBREAPER_TITLES = ("systemd",)


@dataclass
class ProcessInfo:
    """One process as seen in /proc."""

    pid: int
    ppid: int
    state: str
    comm: str
    cmdline: str
    title: str
    cgroup: str
    unit: str | None
    is_kernel_thread: bool
    start_time: int = 0
    units: tuple = ()

    @property
    def is_alive(self) -> bool:
        """False for zombies and dead tasks: they hold no memory any more."""
        return self.state not in ("Z", "X", "x")

    def in_unit(self, unit: str) -> bool:
        """True when ``unit`` is any component of the cgroup path (the unit or a sub-cgroup of it)."""
        return unit in self.units


@dataclass
class StatFields:
    pid: int
    comm: str
    state: str
    ppid: int
    flags: int
    start_time: int


def parse_stat(text: str) -> StatFields:
    """Parse /proc/PID/stat. ``comm`` may hold spaces and ')', so fields are read after the last ')'."""
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    rest = text[close_paren + 1 :].split()
    return StatFields(
        pid=int(text[:open_paren].strip()),
        comm=text[open_paren + 1 : close_paren],
        state=rest[0],
        ppid=int(rest[1]),
        flags=int(rest[6]),
        start_time=int(rest[19]) if len(rest) > 19 else 0,
    )


def units_in_cgroup_path(path: str) -> tuple:
    """All `*.service` / `*.scope` components of a cgroup path, outermost first."""
    return tuple(part for part in path.split("/") if part.endswith(UNIT_SUFFIXES))


def unit_from_cgroup_path(path: str) -> str | None:
    """The innermost `*.service` or `*.scope` component of a cgroup path, or None."""
    units = units_in_cgroup_path(path)
    return units[-1] if units else None


def unit_from_cgroup_file(text: str) -> tuple:
    """Return ``(cgroup_path, unit)`` from the text of /proc/PID/cgroup.

    Handles cgroup v1 (``N:name=systemd:/path``), v2 (``0::/path``) and hybrid hosts (both lines;
    the ``name=systemd`` hierarchy wins because that is where systemd tracks units there).
    """
    systemd_path = None
    unified_path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "name=systemd" in controllers.split(","):
            systemd_path = path
        elif hierarchy == "0" and controllers == "":
            unified_path = path
    path = systemd_path if systemd_path is not None else (unified_path or "")
    if path.endswith(DELETED_CGROUP_SUFFIX):
        path = path[: -len(DELETED_CGROUP_SUFFIX)]
    return path, unit_from_cgroup_path(path)


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return None


def read_process(pid: int, proc_root: str = "/proc") -> ProcessInfo | None:
    """Read one process; None when it does not exist (or vanished while being read)."""
    base = os.path.join(proc_root, str(pid))
    stat_text = _read_text(os.path.join(base, "stat"))
    if not stat_text:
        return None
    try:
        stat = parse_stat(stat_text)
    except (ValueError, IndexError):
        return None
    raw_cmdline = _read_text(os.path.join(base, "cmdline")) or ""
    argv = [arg for arg in raw_cmdline.rstrip("\0").split("\0") if arg] if raw_cmdline else []
    cgroup_text = _read_text(os.path.join(base, "cgroup"))
    if cgroup_text is None:  # exited after its stat was read
        return None
    cgroup_path, unit = unit_from_cgroup_file(cgroup_text)
    is_kernel_thread = bool(stat.flags & PF_KTHREAD) or KTHREADD_PID in (pid, stat.ppid)
    return ProcessInfo(
        pid=pid,
        ppid=stat.ppid,
        state=stat.state,
        comm=stat.comm,
        cmdline=" ".join(argv),
        title=argv[0].strip() if argv else stat.comm,
        cgroup=cgroup_path,
        unit=unit,
        is_kernel_thread=is_kernel_thread,
        start_time=stat.start_time,
        units=units_in_cgroup_path(cgroup_path),
    )


def list_pids(proc_root: str = "/proc") -> list:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return sorted(int(name) for name in names if name.isdigit())


def list_processes(proc_root: str = "/proc") -> list:
    """Every process readable right now (processes that exit while listed are left out)."""
    found = (read_process(pid, proc_root) for pid in list_pids(proc_root))
    return [proc for proc in found if proc is not None]


def pids_of_unit(unit: str, proc_root: str = "/proc") -> list:
    """PIDs whose cgroup lies in ``unit``'s cgroup (also after the unit stopped, for leftovers)."""
    return [proc.pid for proc in list_processes(proc_root) if proc.in_unit(unit)]


def ancestors(pid: int, proc_root: str = "/proc") -> list:
    """Parent, grandparent, ... up to the namespace's init, nearest first."""
    chain = []
    seen = {pid}
    current = read_process(pid, proc_root)
    while current is not None and current.ppid > 0 and current.ppid not in seen:
        chain.append(current.ppid)
        seen.add(current.ppid)
        current = read_process(current.ppid, proc_root)
    return chain


def is_orphan(proc: ProcessInfo, proc_root: str = "/proc") -> bool:
    """Parent is PID 1, or a subreaper (approximated as a systemd manager; see SUBREAPER_TITLES)."""
    if proc.ppid == 1:
        return True
    parent = read_process(proc.ppid, proc_root)
    if parent is None:
        return False
    return os.path.basename(parent.title) in SUBREAPER_TITLES or parent.comm in SUBREAPER_TITLES


def is_alive(pid: int, proc_root: str = "/proc", start_time: int | None = None) -> bool:
    """True while ``pid`` exists and is not a zombie. With ``start_time``, a reused PID counts as gone."""
    proc = read_process(pid, proc_root)
    if proc is None or not proc.is_alive:
        return False
    return start_time is None or proc.start_time == start_time


def signal_number(value) -> int:
    """Accept 'SIGTERM', 'TERM', 'sigterm', 15 or '15'; raise ValueError for anything else."""
    text = str(value).strip()
    if text.isdigit():
        number = int(text)
        valid = {int(sig) for sig in signal.Signals}
        if number in valid:
            return number
        raise ValueError(f"unknown signal number {number}")
    name = text.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ValueError(f"unknown signal {value!r}; use a name such as SIGTERM or SIGINT") from None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def send_signal(pid: int, sig: int) -> bool:
    """Send ``sig``; False when the process no longer exists. PermissionError propagates."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate, timeout: float, interval: float = 0.1, clock=time.monotonic, sleep=time.sleep) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed; return its last verdict.

    The one polling helper of the collection: the interval is capped at 0.2 s, and the predicate
    is checked once more at the deadline, so a condition that turns true late is not missed.
    """
    interval = min(max(interval, 0.01), MAX_POLL_INTERVAL)
    deadline = clock() + max(timeout, 0)
    while True:
        if predicate():
            return True
        remaining = deadline - clock()
        if remaining <= 0:
            return False
        sleep(min(interval, remaining))
