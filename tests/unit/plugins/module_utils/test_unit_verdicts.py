"""Verdicts on a unit between two samples: why it is not active, and whether it restarted."""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.systemd import UnitState
from ansible_collections.llmops.inference.plugins.module_utils.unit_verdicts import (
    last_main_pid,
    unit_not_active_reason,
    unit_restart_reason,
)


def unit(**fields) -> UnitState:
    return UnitState(name="sglang.service", **fields)


def test_the_not_active_reason_names_the_state_and_a_result_other_than_success():
    failed = unit(active_state="failed", sub_state="failed", result="exit-code", n_restarts=5)
    assert unit_not_active_reason(failed) == (
        "unit sglang.service not active: ActiveState=failed, SubState=failed, Result=exit-code, NRestarts 5"
    )
    stopped = unit(active_state="inactive", sub_state="dead", result="success")
    assert unit_not_active_reason(stopped) == (
        "unit sglang.service not active: ActiveState=inactive, SubState=dead, NRestarts 0"
    )


def test_the_last_main_pid_falls_back_to_exec_main_pid_after_the_main_process_exited():
    assert last_main_pid(unit(main_pid=4000, properties={"ExecMainPID": "3999"})) == 4000
    assert last_main_pid(unit(main_pid=0, properties={"ExecMainPID": "4000"})) == 4000
    assert last_main_pid(unit(main_pid=0, properties={"ExecMainPID": "not a pid"})) == 0
    assert last_main_pid(unit(main_pid=0)) == 0


def test_a_new_main_pid_or_a_moved_restart_counter_is_a_restart():
    before = unit(main_pid=1234, n_restarts=3)
    assert unit_restart_reason(before, unit(main_pid=1301, n_restarts=5), 2.04) == (
        "unit restarting: MainPID 1234 -> 1301, NRestarts 3 -> 5 within 2.0 s"
    )
    # a manual start resets the counter: a restart even though MainPID only went away
    assert unit_restart_reason(before, unit(main_pid=0, n_restarts=0), 0.5) == (
        "unit restarting: MainPID 1234 -> 0, NRestarts 3 -> 0 within 0.5 s"
    )


def test_an_exit_without_a_new_main_pid_is_not_a_restart():
    before = unit(main_pid=1234, n_restarts=3)
    assert unit_restart_reason(before, unit(main_pid=1234, n_restarts=3), 9.0) is None
    assert unit_restart_reason(before, unit(main_pid=0, n_restarts=3), 9.0) is None
    assert unit_restart_reason(unit(main_pid=0), unit(main_pid=1301), 1.0) is None
