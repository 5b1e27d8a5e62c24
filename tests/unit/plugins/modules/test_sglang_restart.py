"""sglang_restart: the module's option errors, its fail/exit decision, warnings and diff (the chain is faked)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.modules import sglang_restart

pytestmark = pytest.mark.usefixtures("target_side_ansible")


def run_module(capsys, args: dict, check=False, diff=False) -> dict:
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises(SystemExit):
        sglang_restart.main()
    return json.loads(capsys.readouterr().out)


class FakeChain:
    result = {}
    seen = {}

    def __init__(self, options, runners):
        FakeChain.seen = {"options": options}

    def run(self, check_mode=False):
        FakeChain.seen["check_mode"] = check_mode
        return json.loads(json.dumps(FakeChain.result))


@pytest.fixture
def chain(monkeypatch):
    monkeypatch.setattr(sglang_restart, "RestartChain", FakeChain)
    FakeChain.seen = {}
    FakeChain.result = {
        "msg": "sglang-t.service passed its gate after 3.1 s (MainPID 4000)",
        "healthy": True,
        "gate": {"failed_step": None},
        "changed": True,
        "warnings": ["the probe has no soak option"],
        "diff": {"before": "ActiveState=active\n", "after": "ActiveState=active\n"},
    }
    return FakeChain


def test_passing_gate_exits_with_the_result_and_the_warnings(capsys, chain):
    result = run_module(capsys, {"unit": "sglang-t", "gpus": ["0", "1"]})
    assert result["healthy"] is True and result["changed"] is True
    assert "failed" not in result or result["failed"] is False
    assert [summary["event"]["msg"] for summary in result["warnings"]] == ["the probe has no soak option"]
    assert "diff" not in result
    options = chain.seen["options"]
    assert options.unit == "sglang-t.service" and options.gpus == ("0", "1")
    assert options.reap["grace"] == 10 and options.reap["threshold_mib"] == 1024 and options.stability_window == 5


def test_diff_is_returned_only_in_diff_mode(capsys, chain):
    result = run_module(capsys, {"unit": "sglang-t"}, check=True, diff=True)
    assert result["diff"]["before"] == "ActiveState=active\n"
    assert chain.seen["check_mode"] is True


def test_failed_gate_fails_unless_told_not_to(capsys, chain):
    chain.result.update(healthy=False, msg="sglang-t.service failed its gate: gpu tier: model not loaded")
    assert run_module(capsys, {"unit": "sglang-t"})["failed"] is True
    result = run_module(capsys, {"unit": "sglang-t", "fail_on_unhealthy": False})
    assert result.get("failed", False) is False and result["healthy"] is False


def test_a_failed_step_always_fails(capsys, chain):
    chain.result.update(
        healthy=False, gate={"failed_step": "reap"}, msg="restart chain failed at reap: GPU 1 needs a reset"
    )
    result = run_module(capsys, {"unit": "sglang-t", "fail_on_unhealthy": False})
    assert result["failed"] is True and "GPU 1 needs a reset" in result["msg"]


def test_bad_option_is_refused_naming_it(capsys, chain):
    result = run_module(capsys, {"unit": "sglang-t", "stability_window": -1})
    assert result["failed"] is True and result["option"] == "stability_window"
    assert chain.seen == {}


def test_api_key_is_no_log(capsys, chain):
    chain.result["msg"] = "key abc-123 seen"
    result = run_module(capsys, {"unit": "sglang-t", "api_key": "abc-123"})
    assert "abc-123" not in json.dumps(result)


def test_gateway_options_reach_the_chain_and_the_gateway_key_is_no_log(capsys, chain):
    chain.result["msg"] = "gateway key gw-k3y seen"
    args = {"unit": "sglang-t", "gateways": ["http://10.0.0.9:30080/", "http://10.0.0.10:30080"],
            "gateway_api_key": "gw-k3y", "gateway_worker_url": "http://10.0.0.5:30000", "gateway_min_healthy": 2,
            "drain_timeout": 45}  # fmt: skip
    result = run_module(capsys, args)
    assert "gw-k3y" not in json.dumps(result)
    options = chain.seen["options"]
    gateway = options.gateway
    assert gateway.urls == ("http://10.0.0.9:30080", "http://10.0.0.10:30080")
    assert (gateway.worker_url, gateway.min_healthy) == ("http://10.0.0.5:30000", 2)
    assert (gateway.drain_timeout, gateway.wait_timeout, gateway.api_key) == (45, 120, "gw-k3y")


def test_a_malformed_gateway_url_is_refused_before_the_chain_runs(capsys, chain):
    result = run_module(capsys, {"unit": "sglang-t", "gateways": ["gateway-1:30080"]})
    assert result["failed"] is True and result["option"] == "gateways"
    assert "gateways must be an absolute http:// or https:// URL" in result["msg"]
    assert chain.seen == {}
