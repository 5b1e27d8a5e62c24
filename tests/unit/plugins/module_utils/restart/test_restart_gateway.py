"""The restart chain behind gateways: drain out of every replica, wait for in-flight requests, re-add after the gate.

The gateways are FakeGateway replicas (real HTTP on loopback, smg's API); systemd, the probe and the reaper are the
scripted stand-ins of restart_world.py. The engine's /metrics is a list of (running, queued) scrapes.
"""

from __future__ import annotations

import json

import pytest
from restart_world import (
    ADMIN_KEY,
    ME,
    MODEL,
    OTHERS,
    PARAMS,
    UNIT,
    GatewayWorld,
    Scrapes,
    World,
    failed_probe,
    fleet,
    step_names,
    validated,
)

from ansible_collections.llmops.inference.plugins.module_utils.in_flight import SOURCE_HTTP, InFlight
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    ChainInputError,
    parse_chain_options,
)


def test_the_worker_leaves_every_replica_before_the_stop_and_rejoins_each_after_the_gate(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas, Scrapes((2, 1), (1, 0), (0, 0), (0, 0)))
    result = world.run()

    assert result["healthy"] is True, result["msg"]
    assert step_names(result) == [
        "lock", "unit", "gateway_drain", "drain_wait", "stop", "reset_failed", "reap", "start", "gate",
        "gateway_add", "snapshot", "unlock",
    ]  # fmt: skip
    # At the stop, no replica listed the worker; the others kept serving on both.
    assert world.listed_at["stop"] == [sorted(OTHERS), sorted(OTHERS)]
    assert all(gateway.listed() == sorted([ME, *OTHERS]) for gateway in replicas)
    gateway = result["gateway"]
    assert gateway["removed_from"] == [replica.url for replica in replicas]
    assert gateway["added_to"] == [replica.url for replica in replicas]
    assert gateway["in_gateways"] is True
    # The wait ends at the first idle reading: the stop waits for SGLang's own drain of what the gauges miss.
    assert gateway["drain"]["idle"] is True and world.scrapes.calls == 3
    steps = {step["name"]: step for step in result["steps"]}
    assert steps["drain_wait"]["detail"].startswith(
        "waited on the scheduler gauges (sglang:http_requests_active not exported): no running and no queued "
        "request; the stop waits for SGLang's own drain"
    )
    assert steps["gateway_add"]["detail"] == f"{ME} healthy on all 2 gateway(s): {replicas[0].url}, {replicas[1].url}"
    assert result["msg"].endswith("and is back in its gateway(s)")
    # Each replica was told on its own: one DELETE and one POST per replica.
    for replica in replicas:
        assert [method for method, _path in replica.mutations()] == ["DELETE", "POST"]
        posted = [body for method, _path, body, _auth in replica.requests if method == "POST"]
        assert posted == [{"url": ME, "api_key": PARAMS["api_key"]}]
    assert ADMIN_KEY not in json.dumps(result)


def test_a_drain_budget_that_ends_is_said_in_the_steps_and_the_unit_is_stopped_anyway(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas, Scrapes((3, 2)))
    result = world.run(drain_timeout=4)

    assert result["healthy"] is True, result["msg"]
    drain = next(step for step in result["steps"] if step["name"] == "drain_wait")
    assert drain["status"] == "expired"
    assert drain["detail"].startswith(
        "drain budget of 4 s ended with 3 running and 2 queued request(s) (scheduler gauges) on the engine; the stop "
        "waits for SGLang's"
    )
    assert result["gateway"]["drain"] == {
        "idle": False, "waited_s": 4.0, "source": "scheduler gauges", "requests": 5, "running": 3, "queued": 2
    }  # fmt: skip
    assert "stop" in world.unit.verbs()


def test_the_drain_waits_on_http_requests_active_where_the_engine_exports_it(replicas):
    """The scheduler's gauges read 0 while requests sit in the tokenizer or were just admitted; the HTTP gauge counts
    them, so the wait goes on until it reads 0, and says what it waited on."""
    fleet(replicas)
    busy = InFlight(SOURCE_HTTP, 3, 0, 0)
    world = GatewayWorld(replicas, Scrapes(busy, busy, InFlight(SOURCE_HTTP, 0, 0, 0)))
    result = world.run()
    assert result["healthy"] is True, result["msg"]
    drain = next(step for step in result["steps"] if step["name"] == "drain_wait")
    assert drain["detail"].startswith("waited on sglang:http_requests_active: no HTTP request in flight on the engine")
    assert world.scrapes.calls == 3
    assert result["gateway"]["drain"]["source"] == "http_requests_active"
    assert result["gateway"]["drain"]["requests"] == 0


def test_an_engine_without_metrics_has_nothing_to_drain(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas, Scrapes(None))
    result = world.run()
    drain = next(step for step in result["steps"] if step["name"] == "drain_wait")
    assert drain["status"] == "ok" and "/metrics did not answer; the stop waits for SGLang's own" in drain["detail"]
    assert world.scrapes.calls == 1


def test_one_replica_down_fails_before_anything_is_stopped(replicas):
    fleet(replicas)
    replicas[1].stop()
    world = GatewayWorld(replicas)
    result = world.run()

    assert result["gate"]["failed_step"] == "gateway_drain" and result["healthy"] is False
    assert result["gate"]["reason"].startswith("1 of 2 gateway(s) cannot be used, nothing was changed:")
    assert f"gateway {replicas[1].url}: cannot reach it" in result["gate"]["reason"]
    assert result["gate"]["reason"].endswith("; the engine was not stopped")
    assert world.unit.verbs() == []
    assert replicas[0].mutations() == [] and replicas[0].listed() == sorted([ME, *OTHERS])
    assert result["service"]["journal"] == []
    assert ("release", PARAMS["lock"]["path"], "tok-1") in world.locks.calls


def test_removing_the_last_healthy_worker_of_the_model_is_refused_before_the_stop(replicas):
    fleet(replicas, workers=(ME,))
    world = GatewayWorld(replicas)
    result = world.run()

    assert result["gate"]["failed_step"] == "gateway_drain"
    assert result["gate"]["reason"].startswith(f"refusing to remove {ME} from any gateway (min_healthy=1):")
    assert (
        f"it would leave 0 healthy worker(s) of model {MODEL} (needs 1; healthy others: none)"
        in result["gate"]["reason"]
    )
    assert world.unit.verbs() == []
    assert all(replica.mutations() == [] and replica.listed() == [ME] for replica in replicas)
    assert result["gateway"]["in_gateways"] is True


def test_with_an_unhealthy_peer_the_refusal_names_the_healthy_workers_left(replicas):
    fleet(replicas, workers=(ME, OTHERS[0]))
    for replica in replicas:
        replica.register(OTHERS[1], healthy=False)
    result = GatewayWorld(replicas).run(gateway_min_healthy=2)
    assert result["gate"]["failed_step"] == "gateway_drain"
    assert f"healthy others: {OTHERS[0]})" in result["gate"]["reason"] and "needs 2" in result["gate"]["reason"]


def test_with_three_workers_a_restart_of_one_proceeds(replicas):
    fleet(replicas)
    result = GatewayWorld(replicas).run(gateway_min_healthy=1)
    assert result["healthy"] is True, result["msg"]


def test_a_failed_gate_leaves_the_worker_out_of_every_replica_and_says_so(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas, probe=[failed_probe("generate", "no tokens within 60 s")])
    result = world.run()

    assert result["healthy"] is False and result["gate"]["failed_tier"] == "generate"
    assert all(replica.listed() == sorted(OTHERS) for replica in replicas)
    assert result["gateway"]["in_gateways"] is False and result["gateway"]["added_to"] == []
    added = next(step for step in result["steps"] if step["name"] == "gateway_add")
    assert added["status"] == "skipped" and added["detail"].startswith(f"{ME} left out of ")
    first_line = result["msg"].splitlines()[0]
    assert first_line.endswith(f"({ME} is left out of its gateway(s): {replicas[0].url}, {replicas[1].url})")
    assert all([method for method, _path in replica.mutations()] == ["DELETE"] for replica in replicas)


def test_a_failed_start_leaves_the_worker_out_and_says_so(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas)
    original = world.runner

    def refusing(args):
        if args[:2] == ["systemctl", "start"]:
            return 1, "", "Unit sglang-t.service is masked."
        return original(args)

    world.runner = refusing
    result = world.run()
    assert result["gate"]["failed_step"] == "start"
    assert result["gateway"]["in_gateways"] is False
    assert "is left out of its gateway(s)" in result["msg"].splitlines()[0]
    assert all(replica.listed() == sorted(OTHERS) for replica in replicas)


def test_a_worker_already_out_of_the_gateways_is_added_after_the_gate(replicas):
    fleet(replicas, workers=OTHERS)
    result = GatewayWorld(replicas).run()
    assert result["healthy"] is True, result["msg"]
    assert result["gateway"]["removed_from"] == []
    assert all(replica.listed() == sorted([ME, *OTHERS]) for replica in replicas)


def test_check_mode_says_where_it_would_remove_and_add_and_changes_nothing(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas)
    result = world.run(check_mode=True)

    assert result["gate"]["failed_step"] is None, result["msg"]
    drain = next(step for step in result["steps"] if step["name"] == "gateway_drain")
    assert drain["status"] == "planned"
    assert drain["detail"] == f"would remove {ME} from 2 of 2 gateway(s): {replicas[0].url}, {replicas[1].url}"
    plan = result["plan"]["gateway"]
    assert plan["remove"] == drain["detail"]
    assert plan["add"].startswith(f"after a passing gate, add {ME} to {replicas[0].url}, {replicas[1].url}")
    assert all(replica.mutations() == [] for replica in replicas)
    assert world.unit.verbs() == [] and world.scrapes.calls == 0


def test_check_mode_reports_a_refusal_as_a_real_run_would(replicas):
    fleet(replicas, workers=(ME,))
    result = GatewayWorld(replicas).run(check_mode=True)
    assert result["gate"]["failed_step"] == "gateway_drain" and "refusing to remove" in result["gate"]["reason"]


def test_a_wrong_gateway_key_is_a_clear_error_and_nothing_is_stopped(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas)
    result = world.run(gateway_api_key="not-the-key")
    assert result["gate"]["failed_step"] == "gateway_drain"
    assert "2 of 2 gateway(s) cannot be used, nothing was changed" in result["gate"]["reason"]
    assert "GET /workers answered HTTP 401: the gateway refused api_key" in result["gate"]["reason"]
    assert "not-the-key" not in json.dumps(result)
    assert world.unit.verbs() == []


def test_without_gateways_the_chain_has_no_gateway_field():
    result = World().run()
    assert result["gateway"] is None
    assert next(step for step in result["steps"] if step["name"] == "gateway_drain")["status"] == "skipped"


@pytest.mark.parametrize(
    ("overrides", "option", "message"),
    [
        ({"gateways": ["10.0.0.9:30080"]}, "gateways", "gateways must be an absolute http:// or https:// URL"),
        ({"gateways": "http://10.0.0.9:30080"}, "gateways", "gateways must be a list of gateway URLs"),
        ({"gateways": ["http://gw:1/x"]}, "gateways", "without a path"),
        ({"gateways": ["http://gw:1", "http://GW:1/"]}, "gateways", "gateways lists http://gw:1 more than once"),
        ({"gateways": ["http://gw:1"], "gateway_worker_url": "ftp://w"}, "gateway_worker_url", "gateway_worker_url"),
        ({"gateway_min_healthy": -1}, "gateway_min_healthy", "gateway_min_healthy must be at least 0"),
        ({"drain_timeout": -2}, "drain_timeout", "drain_timeout must be at least 0"),
    ],
)
def test_bad_gateway_options_name_themselves(overrides, option, message):
    with pytest.raises(ChainInputError) as caught:
        parse_chain_options({**validated(PARAMS), **overrides})
    assert caught.value.option == option
    assert message in str(caught.value)


def test_the_worker_url_defaults_to_the_gates_url():
    options = parse_chain_options(validated({**PARAMS, "gateways": ["http://gw:30080"]}))
    assert options.gateway.worker_url == PARAMS["url"]
    assert parse_chain_options(validated(PARAMS)).gateway.worker_url is None
    assert UNIT == options.unit


def test_a_worker_still_draining_on_a_replica_is_stopped_without_waiting_for_the_replica_to_drop_it(replicas):
    fleet(replicas)
    replicas[1].drain_time = 6.0  # smg lists a removed worker as draining (unhealthy, unrouted) for about 5 s
    world = GatewayWorld(replicas)
    replicas[1].clock = world.clock
    result = world.run()

    assert result["healthy"] is True, result["msg"]
    steps = {step["name"]: step for step in result["steps"]}
    assert steps["gateway_drain"]["elapsed_s"] < 1.0
    # At the stop the second replica still listed it, draining; the re-add waited until that entry was gone.
    assert world.listed_at["stop"] == [sorted(OTHERS), sorted([ME, *OTHERS])]
    assert all(gateway.listed() == sorted([ME, *OTHERS]) for gateway in replicas)
    assert [method for method, _path in replicas[1].mutations()] == ["DELETE", "POST"]
    assert result["gateway"]["draining_on"] == [replicas[1].url]
    assert result["gateway"]["in_gateways"] is True


def test_a_removal_that_never_ends_fails_the_re_add_after_the_gate_and_says_so(replicas):
    fleet(replicas)
    replicas[1].drain_time = 3600
    world = GatewayWorld(replicas)
    replicas[1].clock = world.clock
    result = world.run(gateway_wait_timeout=2)

    assert result["gate"]["failed_step"] == "gateway_add"
    assert f"{ME} is not done draining on every gateway after 2 s" in result["gate"]["reason"]
    assert f"gateway {replicas[1].url}: still draining from its earlier removal" in result["gate"]["reason"]
    assert result["gateway"]["in_gateways"] is False


def test_a_removal_that_does_not_take_stops_the_chain_before_the_stop_and_says_where_it_is_out(replicas):
    fleet(replicas)
    replicas[1].keeps_routing.add(ME)  # the replica accepts the removal but keeps routing to the worker
    world = GatewayWorld(replicas)
    result = world.run(gateway_wait_timeout=2)

    assert result["gate"]["failed_step"] == "gateway_drain"
    assert f"{ME} is not out of rotation on every gateway after 2 s" in result["gate"]["reason"]
    out_of = f"{replicas[0].url}, {replicas[1].url}"
    assert result["gate"]["reason"].endswith(
        f"; the engine was not stopped; it is out of {out_of} until a restart passes"
    )
    assert world.unit.verbs() == []
    assert result["gateway"]["in_gateways"] is False
