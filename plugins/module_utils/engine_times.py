# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""When a unit's engine was forked and when it said it was ready: the engine's own load time.

Private to the llmops.inference collection; not a public API. Standard library plus systemd.py.
Commands run through a ``run_command(args) -> (rc, stdout, stderr)`` callable.

- fork: systemd's ``ExecMainStartTimestampMonotonic``, the moment it forked the unit's main process;
- ready: the journal entry in which the engine logs ``The server is fired up and ready to roll!`` (SGLang
  0.5.23 logs it from ``srt/entrypoints/http_server.py`` once its warm-up request has finished), the first one
  after the fork; where the journal cannot be searched, systemd's ``ActiveEnterTimestampMonotonic`` (the unit
  turns active when its start finishes, which with a ready gate means /health answered 200).

Monotonic times (CLOCK_MONOTONIC, which systemd, journald and Python's ``time.monotonic`` share) give the
durations; epoch times are derived from them with one reading of both clocks.
"""

from __future__ import annotations

import json
import time

from ansible_collections.llmops.inference.plugins.module_utils.systemd import SystemdError, show_unit

READY_MESSAGE = "The server is fired up and ready to roll!"
ENGINE_PROPERTIES = ("ActiveState", "MainPID", "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")


def _usec(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _ready_entry(run_command, unit: str, since_epoch: float, fork_usec: int) -> dict | None:
    """The first journal entry of ``unit`` with the ready message at or after the fork, or None."""
    rc, out, _err = run_command(
        [
            "journalctl",
            "--unit",
            unit,
            "--since",
            f"@{int(since_epoch)}",
            "--grep",
            READY_MESSAGE,
            "--output",
            "json",
            "--no-pager",
            "--quiet",
        ]
    )
    if rc != 0:
        return None
    for line in out.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if READY_MESSAGE in str(entry.get("MESSAGE", "")) and _usec(entry.get("__MONOTONIC_TIMESTAMP")) >= fork_usec:
            return entry
    return None


def engine_times(run_command, unit: str, clock=time.monotonic, wall=time.time, ready: bool = True) -> dict:
    """The unit's engine now: main PID, fork and ready times (epoch seconds) and fork-to-ready seconds
    (``ready=False``: without searching the journal, when only which process runs matters)."""
    try:
        state = show_unit(run_command, unit, ENGINE_PROPERTIES)
    except SystemdError as exc:
        return {"unit": unit, "error": str(exc)}
    props = state.properties
    now_mono, now_wall = clock(), wall()

    def epoch(usec: int) -> float | None:
        return now_wall - (now_mono - usec / 1e6) if usec > 0 else None

    fork_usec = _usec(props.get("ExecMainStartTimestampMonotonic"))
    active_usec = _usec(props.get("ActiveEnterTimestampMonotonic"))
    result = {
        "unit": state.name,
        "main_pid": state.main_pid,
        "active_state": state.active_state,
        "forked_at": epoch(fork_usec),
        "active_at": epoch(active_usec) if active_usec >= fork_usec else None,
        "ready_at": None,
        "fork_to_ready_s": None,
        "ready_source": None,
    }
    if not fork_usec or not state.main_pid or not ready:
        return result
    entry = _ready_entry(run_command, state.name, result["forked_at"] - 1, fork_usec)
    if entry is not None:
        ready_usec = _usec(entry.get("__MONOTONIC_TIMESTAMP"))
        result.update(
            ready_at=_usec(entry.get("__REALTIME_TIMESTAMP")) / 1e6 or epoch(ready_usec),
            fork_to_ready_s=(ready_usec - fork_usec) / 1e6,
            ready_source="engine log",
        )
    elif active_usec >= fork_usec and state.active_state == "active":
        result.update(ready_at=epoch(active_usec), fork_to_ready_s=(active_usec - fork_usec) / 1e6)
        result["ready_source"] = "unit active"
    return result


def same_engine(before: dict, after: dict) -> bool:
    """Whether two readings saw the same engine process (same main PID, forked at the same time)."""
    if not before or not after or before.get("error") or after.get("error"):
        return True
    forked, forked_after = before.get("forked_at"), after.get("forked_at")
    same_fork = forked is None or (forked_after is not None and abs(forked - forked_after) < 1)
    return before.get("main_pid") == after.get("main_pid") and same_fork


def journal_tail(run_command, unit: str, lines: int = 30) -> list:
    """The unit's last journal lines (empty when the journal cannot be read)."""
    rc, out, _err = run_command(["journalctl", "--unit", unit, "-n", str(lines), "--no-pager", "--quiet"])
    return out.splitlines() if rc == 0 else []
