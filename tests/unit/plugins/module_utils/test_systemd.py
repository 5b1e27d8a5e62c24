from __future__ import annotations

import pytest

from ansible_collections.llmops.inference.plugins.module_utils import systemd

SHOW_FAILED = """Id=sglang-qwen.service
LoadState=loaded
ActiveState=activating
SubState=auto-restart
Result=exit-code
MainPID=0
NRestarts=17
ControlGroup=/system.slice/sglang-qwen.service
ExecMainStatus=1
Environment=A=1 B=2
"""


def runner(answers: dict):
    calls = []

    def run(args):
        calls.append(args)
        return answers[args[1]]

    run.calls = calls
    return run


def test_parse_show_keeps_equals_signs_in_values():
    props = systemd.parse_show(SHOW_FAILED)
    assert props["Environment"] == "A=1 B=2"
    assert props["NRestarts"] == "17"


def test_show_unit_builds_a_unit_state():
    run = runner({"show": (0, SHOW_FAILED, "")})
    state = systemd.show_unit(run, "sglang-qwen")
    assert run.calls[0][:3] == ["systemctl", "show", "sglang-qwen.service"]
    assert "--property=Id,LoadState,ActiveState,SubState,Result,MainPID,NRestarts,ControlGroup" in run.calls[0][3]
    assert (state.name, state.active_state, state.sub_state, state.result) == (
        "sglang-qwen.service",
        "activating",
        "auto-restart",
        "exit-code",
    )
    assert (state.main_pid, state.n_restarts, state.exec_main_status) == (0, 17, 1)
    assert state.control_group == "/system.slice/sglang-qwen.service"
    assert state.is_running and not state.is_active
    assert state.as_dict()["n_restarts"] == 17


def test_unit_state_tolerates_missing_and_empty_properties():
    state = systemd.UnitState.from_properties("old.service", {"ActiveState": "active", "ExecMainStatus": ""})
    assert state.name == "old.service"
    assert state.is_active and state.is_running
    assert (state.n_restarts, state.main_pid, state.exec_main_status) == (0, 0, None)


@pytest.mark.parametrize(
    ("active_state", "running"),
    [("active", True), ("activating", True), ("deactivating", True), ("inactive", False), ("failed", False)],
)
def test_is_running_states(active_state, running):
    assert systemd.UnitState("x.service", active_state=active_state).is_running is running


def test_show_unit_failure_raises_with_the_command():
    run = runner({"show": (1, "", "Failed to connect to bus")})
    with pytest.raises(systemd.SystemdError, match=r"systemctl show x\.service failed.*Failed to connect to bus"):
        systemd.show_unit(run, "x.service")


@pytest.mark.parametrize(
    ("name", "normal"), [("foo", "foo.service"), ("foo.service", "foo.service"), ("session-2.scope", "session-2.scope")]
)
def test_normalize_unit_name(name, normal):
    assert systemd.normalize_unit_name(name) == normal


LIST_UNITS = """ssh.service                loaded active   running OpenBSD Secure Shell server
\u25cf t-crash.service          loaded failed   failed  crashy
t-reap.service             loaded inactive dead    reap test
sglang-qwen.service        loaded activating auto-restart SGLang
session-4.scope            loaded active   running Session 4 of User root
"""


def test_list_units_skips_status_bullets():
    units = systemd.parse_list_units(LIST_UNITS)
    assert units == {
        "ssh.service": "active",
        "t-crash.service": "failed",
        "t-reap.service": "inactive",
        "sglang-qwen.service": "activating",
        "session-4.scope": "active",
    }


def test_list_running_units():
    run = runner({"list-units": (0, LIST_UNITS, "")})
    assert set(systemd.list_running_units(run)) == {"ssh.service", "sglang-qwen.service", "session-4.scope"}
    assert "--type=service,scope" in run.calls[0]


def test_systemd_booted(tmp_path):
    assert not systemd.systemd_booted(str(tmp_path))
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    assert systemd.systemd_booted(str(tmp_path))
