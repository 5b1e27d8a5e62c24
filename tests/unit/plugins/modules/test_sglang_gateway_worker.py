"""The sglang_gateway_worker module's thin layer against fake gateways: options, results, diff, failures, secrets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.modules import sglang_gateway_worker

# The fake gateway lives beside the module_utils tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "module_utils"))
from fake_gateway import closed_port_url, started_gateways

pytestmark = pytest.mark.usefixtures("target_side_ansible")
WORKER = "http://10.0.0.5:30000"
OTHER = "http://10.0.0.6:30000"


@pytest.fixture
def fakes():
    with started_gateways() as make:
        yield make


def run_module(capsys, args: dict) -> dict:
    args = {"poll_interval": 0.02, "wait_timeout": 5, **args}
    with patch_module_args(args), pytest.raises(SystemExit):
        sglang_gateway_worker.main()
    return json.loads(capsys.readouterr().out)


def test_present_adds_everywhere_then_is_idempotent(capsys, fakes):
    first, second = fakes(), fakes()
    args = {"gateways": [first.url, second.url], "worker_url": WORKER}
    added = run_module(capsys, args)
    assert added["changed"] is True
    assert added["msg"] == f"{WORKER} added to 2 of 2 gateway(s)"
    assert [gateway["healthy"] for gateway in added["gateways"]] == [True, True]
    again = run_module(capsys, args)
    assert again["changed"] is False
    assert again["msg"] == f"{WORKER} already on all 2 gateway(s)"


def test_absent_with_diff_and_check_mode(capsys, fakes):
    fake = fakes()
    fake.register(WORKER)
    fake.register(OTHER)
    args = {"gateways": [fake.url], "worker_url": WORKER, "state": "absent", "_ansible_diff": True}
    checked = run_module(capsys, dict(args, _ansible_check_mode=True))
    assert checked["changed"] is True
    assert checked["msg"] == f"{WORKER} would be removed from 1 of 1 gateway(s)"
    assert checked["diff"] == {"before": {fake.url: sorted([OTHER, WORKER])}, "after": {fake.url: [OTHER]}}
    assert fake.mutations() == []
    removed = run_module(capsys, args)
    assert removed["changed"] is True
    assert removed["diff"]["after"] == {fake.url: [OTHER]}
    assert fake.listed() == [OTHER]


def test_min_healthy_refusal_fails_without_changes(capsys, fakes):
    fake = fakes()
    fake.register(WORKER)
    result = run_module(capsys, {"gateways": [fake.url], "worker_url": WORKER, "state": "absent"})
    assert result["failed"] is True
    assert result["changed"] is False
    assert result["msg"].startswith(f"refusing to remove {WORKER} from any gateway (min_healthy=1)")
    assert len(result["refused"]) == 1
    assert fake.mutations() == []


def test_an_unusable_gateway_fails_naming_it(capsys, fakes):
    good = fakes()
    down = closed_port_url()
    result = run_module(capsys, {"gateways": [good.url, down], "worker_url": WORKER})
    assert result["failed"] is True and result["changed"] is False
    assert result["unavailable"] == [result["msg"].split("nothing was changed: ", 1)[1]]
    assert down in result["msg"]
    assert good.mutations() == []


def test_a_wrong_key_is_named_and_no_key_leaks(capsys, fakes):
    fake = fakes(api_key="right-key")
    result = run_module(
        capsys, {"gateways": [fake.url], "worker_url": WORKER, "api_key": "wrong-key", "worker_api_key": "engine-key"}
    )
    assert result["failed"] is True
    assert "HTTP 401: the gateway refused api_key" in result["msg"]
    assert "wrong-key" not in json.dumps(result) and "engine-key" not in json.dumps(result)


def test_the_worker_key_reaches_the_add_and_not_the_result(capsys, fakes):
    fake = fakes(api_key="k1")
    result = run_module(capsys, {"gateways": [fake.url], "worker_url": WORKER, "api_key": "k1", "worker_api_key": "k1"})
    assert result["changed"] is True
    post = next(body for method, _path, body, _auth in fake.requests if method == "POST")
    assert post["api_key"] == "k1"
    assert "k1" not in json.dumps({key: value for key, value in result.items() if key != "invocation"})


def test_a_timeout_reports_what_changed(capsys, fakes):
    fake = fakes()
    fake.unhealthy.add(WORKER)
    result = run_module(capsys, {"gateways": [fake.url], "worker_url": WORKER, "wait_timeout": 0.2})
    assert result["failed"] is True
    assert result["changed"] is True
    assert f"gateway {fake.url}: listed but not healthy (status not_ready)" in result["msg"]
    assert result["gateways"][0]["waiting_for"] == "listed but not healthy (status not_ready)"


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        ({"worker_url": "10.0.0.5:30000"}, "worker_url", "absolute http:// or https:// URL"),
        ({"gateways": []}, "gateways", "non-empty list"),
        ({"gateways": ["http://a:1", "http://a:1/"]}, "gateways", "more than once"),
        ({"gateways": ["gw:30080"]}, "gateways", "gateways must be an absolute"),
        ({"min_healthy": -1}, "min_healthy", "min_healthy must be an integer >= 0"),
        ({"timeout": 0}, "timeout", "timeout must be greater than 0"),
        ({"wait_timeout": -1}, "wait_timeout", "wait_timeout must be 0 or more"),
    ],
)
def test_bad_options_are_named_and_nothing_is_asked(capsys, fakes, args, option, words):
    fake = fakes()
    result = run_module(capsys, {"gateways": [fake.url], "worker_url": WORKER, **args})
    assert result["failed"] is True
    assert result["option"] == option
    assert words in result["msg"]
    assert fake.requests == []


# The unreachable option: fail (the default) or warn.
@pytest.mark.parametrize("state", ["present", "absent"])
def test_an_unreachable_gateway_fails_by_default_and_nothing_changes(capsys, fakes, state):
    good = fakes()
    good.register(OTHER)
    if state == "absent":
        good.register(WORKER)
    down = closed_port_url()
    result = run_module(capsys, {"gateways": [good.url, down], "worker_url": WORKER, "state": state})
    assert result["failed"] is True and result["changed"] is False
    assert f"gateway {down}: cannot reach it" in result["msg"]
    assert good.mutations() == []


@pytest.mark.parametrize(
    ("state", "listed", "verb"), [("present", [OTHER, WORKER], "added to"), ("absent", [OTHER], "removed from")]
)
def test_with_warn_an_unreachable_gateway_is_left_aside_and_named(capsys, fakes, state, listed, verb):
    good = fakes()
    good.register(OTHER)
    if state == "absent":
        good.register(WORKER)
    down = closed_port_url()
    args = {"gateways": [good.url, down], "worker_url": WORKER, "state": state, "unreachable": "warn"}
    result = run_module(capsys, args)
    assert result.get("failed") is not True, result
    assert result["changed"] is True
    assert good.listed() == sorted(listed)
    assert result["msg"] == f"{WORKER} {verb} 1 of 2 gateway(s); left aside (cannot be reached): {down}"
    aside = result["gateways"][1]
    assert aside["action"] == "unreachable" and aside["problem"].startswith(f"gateway {down}: cannot reach it")
    assert any(down in summary["event"]["msg"] for summary in result["warnings"])


def test_with_warn_a_gateway_that_refuses_the_key_still_fails(capsys, fakes):
    good = fakes()
    refusing = fakes(api_key="another-key")
    args = {"gateways": [good.url, refusing.url], "worker_url": WORKER, "unreachable": "warn"}
    result = run_module(capsys, args)
    assert result["failed"] is True and "HTTP 401" in result["msg"]
    assert good.mutations() == []
