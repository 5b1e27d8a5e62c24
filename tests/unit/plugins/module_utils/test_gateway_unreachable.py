"""A gateway replica that cannot be reached: it never keeps a worker out of the replicas that work.

GatewaySet on FakeGateway replicas (real HTTP on loopback, smg's API), and the restart chain behind two replicas of
which the second dies at a chosen step (the scripted systemd of restart/restart_world.py), with
``gateway_unreachable`` fail and warn.
"""

from __future__ import annotations

import time

import pytest
from fake_gateway import FakeGateway
from restart_world import ADMIN_KEY, ME, OTHERS, PARAMS, GatewayWorld, fleet, step_names, validated

from ansible_collections.llmops.inference.plugins.module_utils.gateway import (
    ChangeMode,
    GatewayAccess,
    GatewaySet,
    Polling,
)
from ansible_collections.llmops.inference.plugins.module_utils.gateway_result import (
    GatewaysUnavailable,
    MembershipIncomplete,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    ChainInputError,
    parse_chain_options,
)


def gateway_set(replicas, sleep=time.sleep) -> GatewaySet:
    urls = [replica.url for replica in replicas]
    return GatewaySet(urls, GatewayAccess(ADMIN_KEY, timeout=2), Polling(poll_interval=0.05, sleep=sleep))


# -- GatewaySet --------------------------------------------------------------------------------------------------


def test_a_best_effort_add_puts_the_worker_back_where_it_can_and_names_the_replica_it_cannot_reach(replicas):
    fleet(replicas, workers=OTHERS)
    replicas[1].stop()
    result = gateway_set(replicas).add(ME, best_effort=True)

    assert replicas[0].listed() == sorted([ME, *OTHERS])
    assert [view.url for view in result.skipped] == [replicas[1].url]
    error = result.skipped[0].error
    assert error.unreachable is True and str(error).startswith(f"gateway {replicas[1].url}: cannot reach it")
    gateways = result.to_dict()["gateways"]
    assert gateways[0]["action"] == "added" and gateways[0]["healthy"] is True
    assert gateways[1]["action"] == "unreachable" and gateways[1]["problem"] == str(error)
    assert list(result.diff["after"]) == [replicas[0].url]


def test_a_best_effort_add_also_goes_past_a_replica_that_answers_but_cannot_be_used(replicas):
    fleet(replicas, workers=OTHERS)
    replicas[1].api_key = "another-key"  # answers 401 to ours
    result = gateway_set(replicas).add(ME, best_effort=True)

    assert replicas[0].listed() == sorted([ME, *OTHERS])
    assert result.skipped[0].error.unreachable is False
    assert "HTTP 401" in str(result.skipped[0].error)


def test_an_add_that_warns_leaves_an_unreachable_replica_aside_and_one_that_fails_changes_nothing(replicas):
    fleet(replicas, workers=OTHERS)
    replicas[1].stop()
    with pytest.raises(GatewaysUnavailable) as caught:
        gateway_set(replicas).add(ME)
    assert f"gateway {replicas[1].url}: cannot reach it" in str(caught.value)
    assert replicas[0].mutations() == []

    result = gateway_set(replicas).add(ME, ChangeMode(unreachable="warn"))
    assert replicas[0].listed() == sorted([ME, *OTHERS])
    assert [view.url for view in result.skipped] == [replicas[1].url]


def test_a_warned_add_still_fails_on_a_replica_that_answers_but_cannot_be_used(replicas):
    fleet(replicas, workers=OTHERS)
    replicas[1].api_key = "another-key"
    with pytest.raises(GatewaysUnavailable) as caught:
        gateway_set(replicas).add(ME, ChangeMode(unreachable="warn"))
    assert "HTTP 401" in str(caught.value)
    assert replicas[0].mutations() == []


def test_a_removal_that_warns_removes_the_worker_from_every_replica_it_reaches(replicas):
    fleet(replicas)
    replicas[1].stop()
    with pytest.raises(GatewaysUnavailable):
        gateway_set(replicas).remove(ME)
    assert replicas[0].mutations() == []

    result = gateway_set(replicas).remove(ME, ChangeMode(unreachable="warn"))
    assert replicas[0].listed() == sorted(OTHERS)
    assert [view.url for view in result.skipped] == [replicas[1].url]
    assert [view.url for view in result.views if view.changed] == [replicas[0].url]


def test_a_replica_that_dies_after_it_accepted_the_removal_is_left_aside_not_failed(replicas):
    fleet(replicas)
    replicas[1].drain_time = 60  # listed as draining until it dies

    def replica_dies(_seconds):
        if replicas[1].thread.is_alive():
            replicas[1].stop()

    result = gateway_set(replicas, sleep=replica_dies).remove(ME, until="gone")
    assert replicas[0].listed() == sorted(OTHERS)
    assert [view.url for view in result.views if view.changed] == [replica.url for replica in replicas]
    assert [view.url for view in result.skipped] == [replicas[1].url]
    assert result.skipped[0].error.unreachable is True


def test_a_replica_that_dies_during_an_add_that_must_reach_it_fails_the_add_and_says_where_it_changed(replicas):
    fleet(replicas, workers=OTHERS)
    replicas[1].add_delay = 60

    def replica_dies(_seconds):
        if replicas[1].thread.is_alive():
            replicas[1].stop()

    with pytest.raises(MembershipIncomplete) as caught:
        gateway_set(replicas, sleep=replica_dies).add(ME)
    assert f"gateway {replicas[1].url}: cannot reach it" in str(caught.value)
    assert "(changed so far: " in str(caught.value)


def test_a_replica_that_dies_during_a_best_effort_add_is_left_aside_and_the_others_are_waited_for(replicas):
    fleet(replicas, workers=OTHERS)
    replicas[1].add_delay = 60

    def replica_dies(_seconds):
        if replicas[1].thread.is_alive():
            replicas[1].stop()

    result = gateway_set(replicas, sleep=replica_dies).add(ME, best_effort=True)
    assert replicas[0].listed() == sorted([ME, *OTHERS])
    assert [view.url for view in result.skipped] == [replicas[1].url]
    assert [view.url for view in result.views if view.changed] == [replica.url for replica in replicas]


def test_unreachable_must_be_fail_or_warn(replicas):
    with pytest.raises(ValueError, match="unreachable must be 'fail' or 'warn', got 'ignore'"):
        gateway_set(replicas).add(ME, ChangeMode(unreachable="ignore"))


# -- the restart chain -------------------------------------------------------------------------------------------


def dies_at(world: GatewayWorld, verb: str, replica: FakeGateway) -> None:
    """The replica dies when the chain runs ``systemctl <verb>``: after the worker left it, before the re-add."""
    original = world.runner

    def runner(args):
        if args[:2] == ["systemctl", verb] and replica.thread.is_alive():
            replica.stop()
        return original(args)

    world.runner = runner


def test_a_replica_lost_after_the_removal_fails_the_host_only_once_the_worker_is_back_in_the_others(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas)
    dies_at(world, "start", replicas[1])
    result = world.run()

    assert result["gate"]["failed_step"] == "gateway_add" and result["healthy"] is False
    # Back, and healthy, on the replica that works: the others never lose it to the lost one.
    assert replicas[0].listed() == sorted([ME, *OTHERS])
    gateway = result["gateway"]
    assert gateway["unreachable"] == [replicas[1].url] and gateway["left_out"] == [replicas[1].url]
    assert gateway["added_to"] == [replicas[0].url] and gateway["in_gateways"] is False
    reason = result["gate"]["reason"]
    assert reason.startswith(f"the gate passed and {ME} healthy on 1 of 2 gateway(s): {replicas[0].url}, but 1 ")
    assert "(gateway_unreachable=fail)" in reason
    assert f"gateway {replicas[1].url}: cannot reach it" in reason
    first_line = result["msg"].splitlines()[0]
    assert first_line.startswith("sglang-t.service restart chain failed at gateway_add: ")
    assert first_line.endswith(f"({ME} is left out of its gateway(s): {replicas[1].url})")
    # The gate passed but the host failed: no known-good snapshot of it.
    assert "snapshot" not in step_names(result)


def test_with_warn_a_replica_lost_after_the_removal_is_a_warning_and_the_restart_passes(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas)
    dies_at(world, "start", replicas[1])
    chain = world.chain(gateway_unreachable="warn")
    result = chain.run()

    assert result["healthy"] is True and result["gate"]["failed_step"] is None, result["msg"]
    assert replicas[0].listed() == sorted([ME, *OTHERS])
    gateway = result["gateway"]
    assert gateway["unreachable"] == [replicas[1].url] and gateway["in_gateways"] is True
    assert gateway["detail"].startswith(f"{ME} healthy on 1 of 2 gateway(s): {replicas[0].url}; 1 gateway(s) left")
    assert any(replicas[1].url in warning and "cannot reach it" in warning for warning in result["warnings"])
    assert step_names(result)[-2:] == ["snapshot", "unlock"]


def test_with_warn_a_replica_down_before_the_restart_is_left_aside_and_the_worker_drains_from_the_others(replicas):
    fleet(replicas)
    replicas[1].stop()
    world = GatewayWorld(replicas)
    result = world.run(gateway_unreachable="warn")

    assert result["healthy"] is True, result["msg"]
    # At the stop, the replica that works no longer routed to the worker.
    assert world.listed_at["stop"][0] == sorted(OTHERS)
    assert replicas[0].listed() == sorted([ME, *OTHERS])
    gateway = result["gateway"]
    assert gateway["removed_from"] == [replicas[0].url] and gateway["unreachable"] == [replicas[1].url]
    drain = next(step for step in result["steps"] if step["name"] == "gateway_drain")
    assert f"1 gateway(s) left aside (the removal went on without it): gateway {replicas[1].url}" in drain["detail"]


def test_with_fail_a_replica_down_before_the_restart_still_refuses_before_anything_is_stopped(replicas):
    fleet(replicas)
    replicas[1].stop()
    world = GatewayWorld(replicas)
    result = world.run(gateway_unreachable="fail")
    assert result["gate"]["failed_step"] == "gateway_drain"
    assert result["gate"]["reason"].endswith("; the engine was not stopped")
    assert world.unit.verbs() == [] and replicas[0].mutations() == []


def test_gateway_unreachable_defaults_to_fail():
    options = {**PARAMS, "gateways": ["http://gw:30080"], "gateway_unreachable": "warn"}
    assert parse_chain_options(validated(options)).gateway.unreachable == "warn"
    assert parse_chain_options(validated({**PARAMS, "gateways": ["http://gw:30080"]})).gateway.unreachable == "fail"


def test_a_bad_gateway_unreachable_names_itself():
    with pytest.raises(ChainInputError) as caught:
        # AnsibleModule refuses it first (choices); the chain's own check names it the same way.
        parse_chain_options({**validated(PARAMS), "gateways": ["http://gw:30080"], "gateway_unreachable": "ignore"})
    assert caught.value.option == "gateway_unreachable"
    assert "gateway_unreachable must be fail or warn, got 'ignore'" in str(caught.value)


def test_with_warn_a_replica_that_answers_but_refuses_the_re_add_still_fails_the_host(replicas):
    fleet(replicas)
    world = GatewayWorld(replicas)
    original = world.runner

    def key_rotated(args):
        if args[:2] == ["systemctl", "start"]:
            replicas[1].api_key = "rotated-key"
        return original(args)

    world.runner = key_rotated
    result = world.run(gateway_unreachable="warn")

    assert result["gate"]["failed_step"] == "gateway_add"
    assert replicas[0].listed() == sorted([ME, *OTHERS])
    assert "gateway_unreachable=" not in result["gate"]["reason"] and "HTTP 401" in result["gate"]["reason"]
    assert result["gateway"]["left_out"] == [replicas[1].url] and result["gateway"]["unreachable"] == []
