"""The engine's own load time: systemd's fork timestamp and the engine's ready line in the journal."""

from __future__ import annotations

import json

from ansible_collections.llmops.inference.plugins.module_utils.engine_times import (
    READY_MESSAGE,
    engine_times,
    journal_tail,
    same_engine,
)

SHOW = (
    "ActiveState=active\nMainPID=4242\n"
    "ExecMainStartTimestampMonotonic=100000000\nActiveEnterTimestampMonotonic=135000000\n"
)


def entry(message: str, monotonic_s: float, realtime_s: float) -> str:
    return json.dumps({"MESSAGE": message, "__MONOTONIC_TIMESTAMP": str(int(monotonic_s * 1e6)),
                       "__REALTIME_TIMESTAMP": str(int(realtime_s * 1e6))})  # fmt: skip


class Runner:
    def __init__(self, show=SHOW, journal=None, journal_rc=0):
        self.show, self.journal, self.journal_rc = show, journal or [], journal_rc
        self.calls = []

    def __call__(self, args, **_kwargs):
        self.calls.append(args)
        if args[0] == "systemctl":
            return 0, self.show, ""
        if "--grep" in args:
            return self.journal_rc, "\n".join(self.journal), "" if self.journal_rc == 0 else "no pattern matching"
        return 0, "line 1\nline 2\n", ""


def at(monotonic: float, wall: float):
    return {"clock": lambda: monotonic, "wall": lambda: wall}


def test_fork_from_systemd_and_ready_from_the_engines_log_line():
    journal = [
        entry(f"[2025-12-01 10:00:00] {READY_MESSAGE}", 90.0, 1990.0),  # the engine before, same second
        entry("[2025-12-01 10:00:31] Load weight end.", 120.0, 2020.0),
        entry(f"[2025-12-01 10:00:33] {READY_MESSAGE}", 133.5, 2033.5),
    ]
    runner = Runner(journal=journal)
    times = engine_times(runner, "sglang", **at(monotonic=200.0, wall=2100.0))
    assert times["main_pid"] == 4242 and times["active_state"] == "active"
    assert times["forked_at"] == 2000.0  # wall now - (monotonic now - fork)
    assert (times["ready_at"], times["fork_to_ready_s"], times["ready_source"]) == (2033.5, 33.5, "engine log")
    assert times["active_at"] == 2035.0
    grep = runner.calls[1]
    assert grep[:3] == ["journalctl", "--unit", "sglang.service"] and "@1999" in grep


def test_without_a_searchable_journal_ready_is_when_the_unit_turned_active():
    times = engine_times(Runner(journal_rc=1), "sglang.service", **at(200.0, 2100.0))
    assert (times["fork_to_ready_s"], times["ready_source"]) == (35.0, "unit active")


def test_which_process_runs_without_searching_the_journal():
    runner = Runner()
    times = engine_times(runner, "sglang", ready=False, **at(200.0, 2100.0))
    assert (times["main_pid"], times["forked_at"], times["ready_at"]) == (4242, 2000.0, None)
    assert len(runner.calls) == 1


def test_a_unit_without_an_engine_has_no_times():
    stopped = Runner(show="ActiveState=inactive\nMainPID=0\nExecMainStartTimestampMonotonic=0\n")
    times = engine_times(stopped, "sglang", **at(200.0, 2100.0))
    assert times["main_pid"] == 0 and times["forked_at"] is None and times["fork_to_ready_s"] is None
    assert len(stopped.calls) == 1


def test_same_engine_compares_the_main_pid_and_the_fork():
    before = {"main_pid": 1, "forked_at": 1000.0}
    assert same_engine(before, {"main_pid": 1, "forked_at": 1000.2})
    assert not same_engine(before, {"main_pid": 2, "forked_at": 1000.0})
    assert not same_engine(before, {"main_pid": 1, "forked_at": 1500.0})  # PID reused by a new start
    assert not same_engine(before, {"main_pid": 0, "forked_at": None})
    assert same_engine({"error": "no systemctl"}, before)


def test_journal_tail():
    assert journal_tail(Runner(), "sglang.service") == ["line 1", "line 2"]
