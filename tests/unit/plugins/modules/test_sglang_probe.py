from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.modules import sglang_probe

pytestmark = pytest.mark.usefixtures("target_side_ansible")


def run_module(capsys, args: dict) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        sglang_probe.main()
    return json.loads(capsys.readouterr().out)


class FakeProbe:
    """Stands in for SglangProbe: records its settings and returns a canned result."""

    result = {}
    seen = {}

    @classmethod
    def for_host(cls, settings, client, run_command, gpu_backend):
        FakeProbe.seen = {"settings": settings, "gpu_backend": gpu_backend}
        return cls()

    def run(self):
        FakeProbe.seen["ran"] = True
        return dict(FakeProbe.result)


@pytest.fixture
def fake_probe(monkeypatch):
    monkeypatch.setattr(sglang_probe, "SglangProbe", FakeProbe)
    FakeProbe.seen = {}
    FakeProbe.result = {"healthy": True, "failed_tier": None, "reason": None, "reset_message": None}
    return FakeProbe


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ({"progress_window": 0}, "progress_window"),
        ({"progress_window": -5}, "progress_window"),
        ({"soak_requests": -1}, "soak_requests"),
        ({"soak_max_new_tokens": 0}, "soak_max_new_tokens"),
        ({"unaccounted_threshold_mib": -1}, "unaccounted_threshold_mib"),
        ({"journal_lines": -1}, "journal_lines"),
    ],
)
def test_bad_new_options_fail_naming_the_option_and_probe_nothing(capsys, fake_probe, args, option):
    result = run_module(capsys, args)
    assert result["failed"] is True
    assert result["option"] == option
    assert result["msg"].startswith(option)
    assert fake_probe.seen == {}, "nothing may be probed after a validation error"


def test_new_options_reach_the_probe(capsys, fake_probe):
    run_module(capsys, {"progress_window": 7.5, "soak_requests": 4, "soak_max_new_tokens": 3})
    settings = fake_probe.seen["settings"]
    assert (settings.progress_window, settings.soak_requests, settings.soak_max_new_tokens) == (7.5, 4, 3)
    assert (settings.progress_require_metrics, settings.unaccounted_threshold_mib) == (False, 1024)
    run_module(capsys, {})
    assert fake_probe.seen["settings"].progress_window is None, "the progress tier is off unless asked for"


def test_a_host_needing_a_gpu_reset_says_so_in_the_message(capsys, fake_probe):
    fake_probe.result = {
        "healthy": False,
        "state": "needs_gpu_reset",
        "failed_tier": "unit",
        "reason": "unit sglang.service not active: ActiveState=inactive",
        "reset_message": "GPU 0 needs a reset or a reboot: 30000 MiB used that no listed process holds",
    }
    result = run_module(capsys, {"unit": "sglang", "fail_on_unhealthy": False})
    assert result["msg"] == (
        "sglang_probe: unit failed: unit sglang.service not active: ActiveState=inactive; "
        "GPU 0 needs a reset or a reboot: 30000 MiB used that no listed process holds"
    )
    assert result["state"] == "needs_gpu_reset"


def test_a_failed_tier_returns_the_units_journal_tail_redacted(capsys, fake_probe, monkeypatch):
    asked = []

    def journal_tail(run_command, unit, lines):
        asked.append((unit, lines))
        return ["smg starting", "args: --api-key gw-s3cret", "Authorization: Bearer gw-s3cret", "bind failed"]

    monkeypatch.setattr(sglang_probe, "journal_tail", journal_tail)
    fake_probe.result = {"healthy": False, "failed_tier": "health", "reason": "HTTP 503", "reset_message": None}
    args = {"unit": "smg", "api_key": "gw-s3cret", "journal_lines": 5, "fail_on_unhealthy": False}
    result = run_module(capsys, args)
    assert asked == [("smg.service", 5)]
    assert result["journal"][0] == "smg starting" and result["journal"][-1] == "bind failed"
    assert "gw-s3cret" not in json.dumps(result["journal"])

    fake_probe.result = {"healthy": True, "failed_tier": None, "reason": None, "reset_message": None}
    assert "journal" not in run_module(capsys, args), "a passing probe reads no journal"
    fake_probe.result = {"healthy": False, "failed_tier": "health", "reason": "HTTP 503", "reset_message": None}
    assert "journal" not in run_module(capsys, dict(args, journal_lines=0)), "journal_lines=0 reads none"
    assert len(asked) == 1
