from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.module_utils.reaper import ReapError
from ansible_collections.llmops.inference.plugins.modules import nvidia_reap

pytestmark = pytest.mark.usefixtures("target_side_ansible")


def run_module(capsys, args: dict) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        nvidia_reap.main()
    return json.loads(capsys.readouterr().out)


class FakeReaper:
    """Stands in for GpuReaper: records how it was called and returns a canned result or raises a canned error."""

    result = {}
    error = ReapError("unused", {})
    fails = False
    seen = {}

    def __init__(self, options, run_command):
        FakeReaper.seen = {"options": options, "run_command": run_command}

    def run(self, check_mode=False):
        FakeReaper.seen["check_mode"] = check_mode
        if FakeReaper.fails:
            raise FakeReaper.error
        return dict(FakeReaper.result)


@pytest.fixture
def fake_reaper(monkeypatch):
    monkeypatch.setattr(nvidia_reap, "GpuReaper", FakeReaper)
    FakeReaper.seen = {}
    FakeReaper.fails = False
    FakeReaper.result = {
        "changed": True,
        "reaped": [{"pid": 101}],
        "warnings": ["still alive after SIGKILL: 101 (state D)"],
        "diff": {"before": "GPU 0\n", "after": "GPU 0\n"},
    }
    return FakeReaper


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "unit: no scope selector given"),
        ({"unit": "t-reap.service", "grace": -1}, "grace: must be >= 0 seconds"),
        ({"unit": "t-reap.service", "timeout": -3}, "timeout: must be >= 0 seconds"),
        ({"match": "[sglang"}, "match: '[sglang' is not a valid regular expression"),
        ({"pids": [1, 42]}, "pids: PID 1 (the init system) is never reaped"),
        ({"pids": [0]}, "pids: 0 is not a process ID"),
    ],
)
def test_bad_input_fails_naming_the_option(capsys, fake_reaper, args, message):
    result = run_module(capsys, args)
    assert result["failed"] is True
    assert result["changed"] is False
    assert result["msg"].startswith(message)
    assert result["option"] == message.split(":")[0]
    assert fake_reaper.seen == {}, "nothing may run after a validation error"


def test_success_passes_check_mode_and_hides_diff_unless_asked(capsys, fake_reaper):
    result = run_module(capsys, {"unit": "t-reap.service", "match": "^sglang::", "_ansible_check_mode": True})
    assert fake_reaper.seen["check_mode"] is True
    assert fake_reaper.seen["options"].unit == "t-reap.service"
    assert result["changed"] is True
    assert "diff" not in result
    warnings = [summary["event"]["msg"] for summary in result["warnings"]]
    assert warnings == ["still alive after SIGKILL: 101 (state D)"]


def test_diff_mode_returns_the_memory_diff(capsys, fake_reaper):
    result = run_module(capsys, {"pids": [101], "_ansible_diff": True})
    assert result["diff"] == {"before": "GPU 0\n", "after": "GPU 0\n"}


def test_reap_error_fails_with_the_partial_result(capsys, fake_reaper):
    fake_reaper.fails = True
    fake_reaper.error = ReapError(
        "GPU memory not released within timeout 3s: pid 101 still holds 40000 MiB on GPU 0",
        {"changed": True, "reaped": [{"pid": 101, "exited": True}], "warnings": [], "diff": {}},
    )
    result = run_module(capsys, {"pids": [101]})
    assert result["failed"] is True
    assert result["changed"] is True
    assert "pid 101 still holds" in result["msg"]
    assert result["reaped"] == [{"pid": 101, "exited": True}]


def test_unreapable_options_reach_the_reaper(capsys, fake_reaper):
    run_module(capsys, {"unit": "t-reap.service", "kill_timeout": 4, "unaccounted_threshold_mib": 2048})
    options = fake_reaper.seen["options"]
    assert (options.kill_timeout, options.unaccounted_threshold_mib, options.fail_on_unreapable) == (4.0, 2048, True)
    run_module(capsys, {"unit": "t-reap.service", "fail_on_unreapable": False})
    assert fake_reaper.seen["options"].fail_on_unreapable is False
    assert fake_reaper.seen["options"].kill_timeout == 10.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"unit": "t-reap.service", "kill_timeout": 0}, "kill_timeout: must be > 0 seconds"),
        ({"unit": "t-reap.service", "unaccounted_threshold_mib": -1}, "unaccounted_threshold_mib: must be a whole"),
    ],
)
def test_bad_unreapable_options_fail_naming_the_option(capsys, fake_reaper, args, message):
    result = run_module(capsys, args)
    assert result["msg"].startswith(message)
    assert fake_reaper.seen == {}


def test_unreapable_memory_fails_with_the_reset_message_and_the_evidence(capsys, fake_reaper):
    entry = {
        "gpu": 0,
        "uuid": "GPU-a",
        "pid": 101,
        "state": "D",
        "ppid": 1,
        "title": "t",
        "mib": 40000,
        "evidence": "x",
    }
    fake_reaper.fails = True
    fake_reaper.error = ReapError(
        "GPU 0 needs a reset or a reboot: x",
        {"changed": True, "unreapable": [entry], "reset_gpus": [0], "warnings": [], "diff": {}},
    )
    result = run_module(capsys, {"unit": "t-reap.service"})
    assert result["failed"] is True
    assert result["msg"] == "GPU 0 needs a reset or a reboot: x"
    assert (result["unreapable"], result["reset_gpus"]) == ([entry], [0])
