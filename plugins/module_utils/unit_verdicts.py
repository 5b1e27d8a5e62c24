# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Verdicts on a systemd unit between two samples: not active, or restarted (a new MainPID, NRestarts moved).

Private to the llmops.inference collection; not a public API. Works on systemd.UnitState values.
"""

from __future__ import annotations

DEAD_STATES = ("failed", "inactive")


def unit_not_active_reason(state) -> str:
    detail = f"ActiveState={state.active_state}, SubState={state.sub_state}"
    if state.result and state.result != "success":
        detail += f", Result={state.result}"
    return f"unit {state.name} not active: {detail}, NRestarts {state.n_restarts}"


def last_main_pid(state) -> int:
    """MainPID, or after the main process exited the PID it had (systemd's ExecMainPID), when read."""
    try:
        return state.main_pid or int(state.properties.get("ExecMainPID") or 0)
    except (AttributeError, ValueError):
        return state.main_pid


def unit_restart_reason(before, after, elapsed_s: float) -> str | None:
    """The restart verdict between two samples of one unit, or None when it stayed put.

    A restart is a new MainPID replacing a live one, or a change of NRestarts (it rises with each automatic
    restart and drops to 0 on a manual start). A MainPID that merely went to 0 is an exit, judged by the
    unit's state instead.
    """
    replaced = bool(before.main_pid and after.main_pid and before.main_pid != after.main_pid)
    if not replaced and after.n_restarts == before.n_restarts:
        return None
    return (
        f"unit restarting: MainPID {last_main_pid(before)} -> {after.main_pid}, "
        f"NRestarts {before.n_restarts} -> {after.n_restarts} within {elapsed_s:.1f} s"
    )
