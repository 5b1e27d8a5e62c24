"""gateway.py (GatewaySet) against fake gateway replicas over real HTTP: both dialects, waits, min_healthy, check mode,
bad input."""

from __future__ import annotations

import itertools
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from fake_gateway import closed_port_url, started_gateways

from ansible_collections.llmops.inference.plugins.module_utils.gateway import (
    OUT_OF_ROTATION,
    ChangeMode,
    GatewayAccess,
    GatewaySet,
    Polling,
)
from ansible_collections.llmops.inference.plugins.module_utils.gateway_result import (
    GatewaysUnavailable,
    MembershipIncomplete,
    RemovalRefused,
)

WORKER = "http://10.0.0.5:30000"
OTHER = "http://10.0.0.6:30000"


@pytest.fixture
def gateways():
    with started_gateways() as make:
        yield make


def gateway_set(*fakes, api_key=None, worker_api_key=None, timeout=2, wait_timeout=5) -> GatewaySet:
    urls = [fake if isinstance(fake, str) else fake.url for fake in fakes]
    access = GatewayAccess(api_key, timeout, worker_api_key=worker_api_key)
    return GatewaySet(urls, access, Polling(wait_timeout, poll_interval=0.02))


def test_bad_gateway_lists_are_refused_before_any_request(gateways):
    fake = gateways()
    with pytest.raises(ValueError, match="non-empty list"):
        GatewaySet([])
    with pytest.raises(ValueError, match="non-empty list"):
        GatewaySet(fake.url)
    with pytest.raises(ValueError, match="more than once"):
        GatewaySet([fake.url, fake.url + "/"])
    with pytest.raises(ValueError, match="gateways must be an absolute"):
        GatewaySet([fake.url, "gateway-2:30080"])
    with pytest.raises(ValueError, match="worker_url"):
        gateway_set(fake).add("not a url")
    assert fake.requests == []


# -- present ----------------------------------------------------------------------------------------------------------
def test_add_puts_the_worker_on_every_replica_and_waits_until_each_reports_it_healthy(gateways):
    first, second = gateways(add_delay=0.2), gateways(add_delay=0.4)
    second.register(OTHER)
    result = gateway_set(first, second).add(WORKER + "/")
    assert result.changed is True
    assert first.listed() == [WORKER]
    assert second.listed() == sorted([OTHER, WORKER])
    for fake in (first, second):
        posts = [body for method, path, body, _auth in fake.requests if (method, path) == ("POST", "/workers")]
        assert posts == [{"url": WORKER}]
    views = result.to_dict()["gateways"]
    assert [(view["action"], view["present"], view["healthy"], view["api"]) for view in views] == [
        ("added", True, True, "smg"),
        ("added", True, True, "smg"),
    ]
    assert result.diff == {
        "before": {first.url: [], second.url: [OTHER]},
        "after": {first.url: [WORKER], second.url: sorted([OTHER, WORKER])},
    }


def test_add_is_idempotent(gateways):
    first, second = gateways(), gateways()
    gateway_set(first, second).add(WORKER)
    again = gateway_set(first, second).add(WORKER)
    assert again.changed is False
    assert [view["action"] for view in again.to_dict()["gateways"]] == ["none", "none"]
    assert len(first.mutations()) == 1
    assert len(second.mutations()) == 1


def test_add_only_where_missing(gateways):
    first, second = gateways(), gateways()
    second.register(WORKER)
    result = gateway_set(first, second).add(WORKER)
    assert [view["action"] for view in result.to_dict()["gateways"]] == ["added", "none"]
    assert second.mutations() == []


def test_the_worker_api_key_goes_to_the_gateway_only_in_the_add_request(gateways):
    fake = gateways(api_key="gw-key")
    result = gateway_set(fake, api_key="gw-key", worker_api_key="gw-key").add(WORKER)
    post = next(entry for entry in fake.requests if entry[0] == "POST")
    assert post[2] == {"url": WORKER, "api_key": "gw-key"}
    assert all(request[3] == "Bearer gw-key" for request in fake.requests)
    assert "gw-key" not in repr(result.to_dict())
    assert result.warnings == []


def test_differing_gateway_and_worker_keys_are_warned_about(gateways):
    fake = gateways(api_key="gw-key")
    result = gateway_set(fake, api_key="gw-key", worker_api_key="engine-key").add(WORKER)
    assert len(result.warnings) == 1
    assert "forwards each client's Authorization header" in result.warnings[0]


def test_check_mode_add_reports_what_would_change_and_changes_nothing(gateways):
    first, second = gateways(), gateways()
    second.register(WORKER)
    result = gateway_set(first, second).add(WORKER, ChangeMode(check_mode=True))
    assert result.changed is True
    assert [view["action"] for view in result.to_dict()["gateways"]] == ["would add", "none"]
    assert result.diff["after"] == {first.url: [WORKER], second.url: [WORKER]}
    assert first.mutations() == [] and second.mutations() == []
    assert first.listed() == []


def test_an_add_that_never_becomes_healthy_times_out_naming_the_gateway(gateways):
    good, bad = gateways(), gateways()
    bad.unhealthy.add(WORKER)
    with pytest.raises(MembershipIncomplete) as raised:
        gateway_set(good, bad, wait_timeout=0.3).add(WORKER)
    message = str(raised.value)
    assert f"gateway {bad.url}: listed but not healthy (status not_ready)" in message
    assert f"gateway {good.url}:" not in message
    assert "is not healthy on every gateway after 0.3 s" in message
    assert f"changed so far: {good.url}, {bad.url}" in message
    assert raised.value.result.changed is True


def test_a_pending_add_is_waited_for_and_reported_while_pending(gateways):
    fake = gateways(add_delay=30)
    with pytest.raises(MembershipIncomplete) as raised:
        gateway_set(fake, wait_timeout=0.2).add(WORKER)
    assert f"gateway {fake.url}: add still processing" in str(raised.value)


def test_a_failed_add_job_stops_the_wait_at_once_with_the_gateways_reason(gateways):
    fake = gateways(add_delay=30)
    fake.failing_adds[WORKER] = "http health check failed for explicitly configured worker URL"
    with pytest.raises(MembershipIncomplete) as raised:
        gateway_set(fake, wait_timeout=30).add(WORKER)
    assert f"gateway {fake.url}: the add job failed: http health check failed" in str(raised.value)


def test_an_add_already_in_progress_is_joined_not_repeated(gateways):
    fake = gateways(add_delay=0.3)
    # The gateway's clock counts its requests, so that the add in progress is still pending at the module's first look
    # however slow the machine, and ends a few requests later.
    requests = itertools.count()
    fake.clock = lambda: next(requests)
    fake.pending["7d0c1e32-0000-4000-8000-000000000001"] = (WORKER, 3, None)
    result = gateway_set(fake).add(WORKER)
    view = result.to_dict()["gateways"][0]
    assert (view["action"], view["changed"], view["healthy"]) == ("add pending", False, True)
    assert result.changed is False


# -- absent -----------------------------------------------------------------------------------------------------------
def test_remove_takes_the_worker_off_every_replica_and_waits_until_it_is_gone(gateways):
    first, second = gateways(drain_time=0.3), gateways(drain_time=0.1)
    for fake in (first, second):
        fake.register(WORKER)
        fake.register(OTHER)
    result = gateway_set(first, second).remove(WORKER)
    assert result.changed is True
    assert first.listed() == [OTHER] and second.listed() == [OTHER]
    assert [view["action"] for view in result.to_dict()["gateways"]] == ["removed", "removed"]
    assert all(view["present"] is False for view in result.to_dict()["gateways"])
    assert result.diff["before"][first.url] == sorted([OTHER, WORKER])
    assert result.diff["after"][first.url] == [OTHER]


def test_remove_is_idempotent(gateways):
    fake = gateways()
    fake.register(OTHER)
    result = gateway_set(fake).remove(WORKER)
    assert result.changed is False
    assert fake.mutations() == []


def test_min_healthy_refuses_before_removing_from_any_gateway(gateways):
    roomy, last = gateways(), gateways()
    roomy.register(WORKER)
    roomy.register(OTHER)
    last.register(WORKER)
    with pytest.raises(RemovalRefused) as raised:
        gateway_set(roomy, last).remove(WORKER, min_healthy=1)
    message = str(raised.value)
    assert message.startswith(f"refusing to remove {WORKER} from any gateway (min_healthy=1): gateway {last.url}:")
    assert "would leave 0 healthy worker(s) of model org/model (needs 1; healthy others: none)" in message
    assert roomy.url not in message
    assert roomy.mutations() == [] and last.mutations() == []


def test_min_healthy_counts_healthy_workers_of_the_same_model_only(gateways):
    fake = gateways()
    fake.register(WORKER, model="qwen")
    fake.register(OTHER, model="llama")
    fake.register("http://10.0.0.7:30000", model="qwen", healthy=False, status="not_ready")
    fake.register("http://10.0.0.8:30000", model="qwen", status="draining")
    with pytest.raises(RemovalRefused, match=r"0 healthy worker\(s\) of model qwen"):
        gateway_set(fake).remove(WORKER)
    fake.register("http://10.0.0.9:30000", model="qwen")
    result = gateway_set(fake).remove(WORKER, min_healthy=1)
    assert result.changed is True


def test_min_healthy_two_needs_two_others(gateways):
    fake = gateways()
    for url in (WORKER, OTHER, "http://10.0.0.7:30000"):
        fake.register(url)
    with pytest.raises(RemovalRefused, match=r"would leave 2 healthy worker\(s\) of model org/model \(needs 3"):
        gateway_set(fake).remove(WORKER, min_healthy=3)
    assert gateway_set(fake).remove(WORKER, min_healthy=2).changed is True


def test_an_unhealthy_worker_may_be_removed_even_when_it_is_the_last(gateways):
    fake = gateways()
    fake.register(WORKER, healthy=False, status="not_ready")
    assert gateway_set(fake).remove(WORKER, min_healthy=1).changed is True
    assert fake.listed() == []


def test_min_healthy_zero_removes_the_last_worker(gateways):
    fake = gateways()
    fake.register(WORKER)
    assert gateway_set(fake).remove(WORKER, min_healthy=0).changed is True


def test_min_healthy_must_be_a_count(gateways):
    fake = gateways()
    with pytest.raises(ValueError, match="min_healthy must be an integer >= 0"):
        gateway_set(fake).remove(WORKER, min_healthy=-1)


def test_check_mode_remove_refuses_the_same_way_and_otherwise_changes_nothing(gateways):
    fake = gateways()
    fake.register(WORKER)
    with pytest.raises(RemovalRefused):
        gateway_set(fake).remove(WORKER, ChangeMode(check_mode=True))
    fake.register(OTHER)
    result = gateway_set(fake).remove(WORKER, ChangeMode(check_mode=True))
    assert result.changed is True
    assert result.to_dict()["gateways"][0]["action"] == "would remove"
    assert result.diff["after"] == {fake.url: [OTHER]}
    assert fake.mutations() == []
    assert fake.listed() == sorted([OTHER, WORKER])


def test_a_removal_that_does_not_finish_in_time_names_the_gateway(gateways):
    fake = gateways(drain_time=30)
    fake.register(WORKER)
    fake.register(OTHER)
    with pytest.raises(MembershipIncomplete) as raised:
        gateway_set(fake, wait_timeout=0.2).remove(WORKER)
    assert f"gateway {fake.url}: still listed (status draining)" in str(raised.value)


def test_out_of_rotation_returns_while_the_gateway_still_lists_the_worker_as_draining(gateways):
    fake = gateways(drain_time=30)
    fake.register(WORKER)
    fake.register(OTHER)
    result = gateway_set(fake, wait_timeout=0.5).remove(WORKER, until=OUT_OF_ROTATION)
    view = result.to_dict()["gateways"][0]
    assert (view["changed"], view["present"], view["status"], view["healthy"]) == (True, True, "draining", False)
    assert fake.listed() == sorted([OTHER, WORKER])


def test_out_of_rotation_waits_while_a_gateway_still_routes_to_the_worker(gateways):
    fake = gateways()
    fake.register(WORKER)
    fake.register(OTHER)
    fake.keeps_routing.add(WORKER)
    with pytest.raises(MembershipIncomplete) as raised:
        gateway_set(fake, wait_timeout=0.2).remove(WORKER, until=OUT_OF_ROTATION)
    assert f"{WORKER} is not out of rotation on every gateway after 0.2 s" in str(raised.value)
    assert f"gateway {fake.url}: still listed (status ready)" in str(raised.value)


def test_an_unknown_until_is_refused_before_any_change(gateways):
    fake = gateways()
    fake.register(WORKER)
    fake.register(OTHER)
    with pytest.raises(ValueError, match="until must be 'gone' or 'out of rotation', got 'soon'"):
        gateway_set(fake).remove(WORKER, until="soon")
    assert fake.mutations() == []


def test_an_add_over_a_removal_still_draining_waits_until_the_old_entry_is_gone(gateways):
    fake = gateways(drain_time=0.5)
    fake.register(WORKER)
    fake.register(OTHER)
    gateway_set(fake).remove(WORKER, until=OUT_OF_ROTATION)
    planned = gateway_set(fake).add(WORKER, ChangeMode(check_mode=True))
    assert planned.to_dict()["gateways"][0]["action"] == "would add"
    result = gateway_set(fake).add(WORKER)
    view = result.to_dict()["gateways"][0]
    assert (view["action"], view["healthy"], view["status"]) == ("added", True, "ready")
    assert [method for method, _path in fake.mutations()] == ["DELETE", "POST"]


def test_an_add_over_a_removal_that_never_ends_names_the_gateway(gateways):
    fake = gateways(drain_time=30)
    fake.register(WORKER)
    fake.register(OTHER)
    gateway_set(fake).remove(WORKER, until=OUT_OF_ROTATION)
    with pytest.raises(MembershipIncomplete) as raised:
        gateway_set(fake, wait_timeout=0.2).add(WORKER)
    assert f"{WORKER} is not done draining on every gateway after 0.2 s" in str(raised.value)
    assert f"gateway {fake.url}: still draining from its earlier removal" in str(raised.value)
    assert [method for method, _path in fake.mutations()] == ["DELETE"]


def test_without_wait_the_request_is_made_and_the_current_state_reported(gateways):
    fake = gateways(drain_time=30)
    fake.register(WORKER)
    fake.register(OTHER)
    result = gateway_set(fake).remove(WORKER, ChangeMode(wait=False))
    view = result.to_dict()["gateways"][0]
    assert (view["changed"], view["present"], view["status"]) == (True, True, "draining")


# -- gateways that cannot be used -------------------------------------------------------------------------------------
def test_an_unreachable_replica_stops_everything_before_any_change(gateways):
    good = gateways()
    down = closed_port_url()
    with pytest.raises(GatewaysUnavailable) as raised:
        gateway_set(good, down).add(WORKER)
    message = str(raised.value)
    assert message.startswith("1 of 2 gateway(s) cannot be used, nothing was changed: ")
    assert f"gateway {down}: cannot reach it (GET /workers:" in message
    assert good.mutations() == []


def test_every_unusable_replica_is_named(gateways):
    good, other = gateways(), gateways("other")
    down = closed_port_url()
    good.register(WORKER)
    with pytest.raises(GatewaysUnavailable) as raised:
        gateway_set(down, good, other).remove(WORKER, min_healthy=0)
    assert len(raised.value.errors) == 2
    assert {error.gateway for error in raised.value.errors} == {down, other.url}
    assert good.mutations() == []


def test_a_wrong_api_key_is_a_clear_error_and_changes_nothing(gateways):
    keyed, open_gateway = gateways(api_key="right"), gateways()
    with pytest.raises(GatewaysUnavailable) as raised:
        gateway_set(open_gateway, keyed, api_key="wrong").add(WORKER)
    message = str(raised.value)
    assert (
        f"gateway {keyed.url}: GET /workers answered HTTP 401: the gateway refused api_key (Invalid API key)" in message
    )
    assert "wrong" not in message
    assert open_gateway.mutations() == [] and keyed.mutations() == []


def test_a_missing_api_key_is_named(gateways):
    keyed = gateways(api_key="right")
    with pytest.raises(GatewaysUnavailable, match="the gateway needs an API key \\(set api_key\\)"):
        gateway_set(keyed).check()


def test_a_gateway_that_does_not_answer_in_time_is_named():
    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self):
            release.wait(5)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(GatewaysUnavailable, match=f"gateway {url}: no answer to GET /workers within 0.2 s"):
            gateway_set(url, timeout=0.2).check()
    finally:
        release.set()
        thread.join()
        server.server_close()


# -- the older router -------------------------------------------------------------------------------------------------
def test_the_older_router_dialect_adds_lists_and_removes(gateways):
    legacy, smg = gateways("legacy"), gateways("smg")
    legacy.register(OTHER)
    smg.register(OTHER)
    added = gateway_set(legacy, smg).add(WORKER)
    assert [view["api"] for view in added.to_dict()["gateways"]] == ["legacy", "smg"]
    assert legacy.listed() == [OTHER, WORKER]
    assert ("POST", "/add_worker?url=http%3A%2F%2F10.0.0.5%3A30000") in legacy.mutations()
    removed = gateway_set(legacy, smg).remove(WORKER)
    assert removed.changed is True
    assert legacy.listed() == [OTHER]
    assert ("POST", "/remove_worker?url=http%3A%2F%2F10.0.0.5%3A30000") in legacy.mutations()


def test_the_older_router_counts_every_listed_worker_as_healthy_for_min_healthy(gateways):
    legacy = gateways("legacy")
    legacy.register(WORKER)
    with pytest.raises(RemovalRefused, match=r"0 healthy worker\(s\) of its model"):
        gateway_set(legacy).remove(WORKER)


def test_the_older_routers_refusal_to_add_is_reported(gateways):
    legacy = gateways("legacy")
    legacy.unhealthy.add(WORKER)
    with pytest.raises(MembershipIncomplete) as raised:
        gateway_set(legacy).add(WORKER)
    assert f"gateway {legacy.url}: POST /add_worker answered HTTP 400: Timeout 5s waiting for worker" in str(
        raised.value
    )
    assert "(nothing was changed)" in str(raised.value)


def test_a_worker_key_cannot_reach_the_older_router_and_says_so(gateways):
    legacy = gateways("legacy")
    result = gateway_set(legacy, worker_api_key="k").add(WORKER)
    assert any("sglang-router before 0.2" in warning for warning in result.warnings)


def test_a_worker_listed_with_a_trailing_slash_or_capitals_is_the_same_worker(gateways):
    fake = gateways()
    fake.register("HTTP://10.0.0.5:30000/")
    fake.register(OTHER)
    assert gateway_set(fake).add(WORKER).changed is False
    removed = gateway_set(fake).remove(WORKER)
    assert removed.changed is True
    assert fake.listed() == [OTHER]
