"""RestartChain's phases (one step of a group restart of a multi-node engine) and the gate of a rank >= 1.

Driven through the fake world of restart_world.py, as the whole chain's tests are.
"""

from __future__ import annotations

import pytest
from restart_world import PARAMS, UNIT, Start, World, step_names, validated

from ansible_collections.llmops.inference.plugins.module_utils.restart.chain import FOLLOWER_EXIT_S
from ansible_collections.llmops.inference.plugins.module_utils.restart.gate import GATE_TIERS, RANK_TIERS
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    ChainInputError,
    parse_chain_options,
)


def ends_at(world: World, seconds: float) -> World:
    """The running engine of ``world`` ends on its own (exit 0) ``seconds`` from now, as a rank >= 1 does after
    rank 0's ShutdownReq."""
    world.unit.run.exit0_after_ready = 10.0 + seconds  # it has run (ready) since -10 s
    return world


# -- stop ------------------------------------------------------------------------------------------------


def test_the_stop_phase_drains_and_reaps_and_leaves_the_unit_stopped():
    world = World()
    result = world.run(phase="stop")
    assert result["gate"]["failed_step"] is None, result["msg"]
    assert result["healthy"] is None and result["changed"] is True
    assert result["phase"] == "stop" and result["node_rank"] == 0
    assert step_names(result) == ["lock", "unit", "gateway_drain", "stop", "reset_failed", "reap", "unlock"]
    assert world.unit.verbs() == ["stop", "reset-failed"]
    assert result["service"]["stop_mode"] == "drain"
    assert world.probe.calls == [] and world.store.saves == []
    assert result["msg"] == f"{UNIT} (node_rank 0) phase stop: stopped (drain) and reaped after 0.0 s"
    assert result["service"]["active_state"] == "inactive"
    assert result["diff"]["after"].startswith("ActiveState=inactive\n")


def test_a_rank_that_ends_after_rank_0s_stop_is_not_killed():
    world = ends_at(World(), 3.0)
    result = world.run(phase="stop", node_rank=1)
    assert result["gate"]["failed_step"] is None, result["msg"]
    assert step_names(result)[:4] == ["lock", "unit", "gateway_drain", "follow_rank0"]
    assert "ended after rank 0's stop" in result["steps"][3]["detail"]
    assert 3.0 <= world.clock.now < 3.5, "polled until it ended"
    assert world.unit.verbs() == ["reset-failed"]
    assert result["service"]["stop_mode"] == "none"


def test_a_rank_that_ended_and_waits_for_its_automatic_restart_has_ended_and_its_restart_is_cancelled():
    """Restart=always on a rank >= 1: rank 0's ShutdownReq ends it with exit 0 and systemd holds it in auto-restart.
    That is the end of its run, not a restart loop: no SIGKILL, and the stop cancels the pending restart."""
    world = ends_at(World(restart_always=True), 3.0)
    result = world.run(phase="stop", node_rank=1)
    assert result["gate"]["failed_step"] is None, result["msg"]
    assert "ended after rank 0's stop (auto-restart: its automatic restart is pending)" in result["steps"][3]["detail"]
    assert 3.0 <= world.clock.now < 3.5, "polled until it ended"
    assert world.unit.verbs() == ["stop", "reset-failed"]
    assert result["service"]["stop_mode"] == "ended"
    assert "ended cleanly on rank 0's ShutdownReq" in result["steps"][4]["detail"]
    assert result["service"]["active_state"] == "inactive"


def test_a_rank_that_still_runs_after_rank_0s_stop_is_killed_not_drained():
    world = World()
    result = world.run(phase="stop", node_rank=1)
    assert result["gate"]["failed_step"] is None, result["msg"]
    assert f"still active {FOLLOWER_EXIT_S:g} s after rank 0's stop" in result["steps"][3]["detail"]
    assert world.unit.verbs() == ["kill", "stop", "reset-failed"]
    assert ["systemctl", "kill", "--signal=SIGKILL", UNIT] in world.unit.calls
    assert result["service"]["stop_mode"] == "kill"
    assert "serves no request" in result["steps"][4]["detail"]


def test_a_rank_in_its_restart_loop_is_killed_without_waiting_for_rank_0():
    world = World("loop")
    result = world.run(phase="stop", node_rank=1)
    assert "follow_rank0" not in step_names(result)
    assert world.unit.verbs()[:2] == ["kill", "stop"] and world.clock.now < 1.0


def test_a_rank_restarted_on_its_own_is_killed_at_once():
    """phase all on a rank >= 1: nothing else stops it, so the chain does not wait for rank 0."""
    world = World()
    result = world.run(node_rank=1)
    assert "follow_rank0" not in step_names(result)
    assert world.unit.verbs()[:2] == ["kill", "stop"]


# -- start -----------------------------------------------------------------------------------------------


def test_the_start_phase_queues_the_start_of_a_stopped_unit_and_gates_nothing():
    world = World("inactive", need_reload=True)
    result = world.run(phase="start")
    assert result["gate"]["failed_step"] is None, result["msg"]
    assert result["healthy"] is None and result["changed"] is True
    assert step_names(result) == ["lock", "unit", "daemon_reload", "start", "unlock"]
    assert world.unit.verbs() == ["daemon-reload", "start"]
    assert world.probe.calls == []


def test_the_start_phase_refuses_a_running_unit():
    world = World()
    result = world.run(phase="start")
    assert result["gate"]["failed_step"] == "start"
    assert "the start phase starts a stopped unit" in result["gate"]["reason"]
    assert world.unit.verbs() == []


# -- gate ------------------------------------------------------------------------------------------------


def started(world: World, start: Start | None = None) -> World:
    """The unit as the start phase left it: stopped, then its start queued."""
    world.unit.starts = [start or Start()]
    world.unit(["systemctl", "stop", UNIT])
    world.unit(["systemctl", "start", "--no-block", UNIT])
    world.unit.calls.clear()
    return world


def test_the_gate_phase_gates_the_start_of_the_start_phase_and_saves_the_snapshot():
    world = started(World("inactive"))
    result = world.run(phase="gate")
    assert result["healthy"] is True, result["msg"]
    assert step_names(result) == ["lock", "unit", "gate", "snapshot", "unlock"]
    assert world.unit.verbs() == []
    assert world.probe.calls[0].get("tiers") is None, "rank 0 gets every tier"
    assert world.store.saves and result["gate"]["soak"] == 0


def test_the_gate_of_a_rank_above_0_probes_the_unit_its_gpus_and_its_health_server_only():
    world = started(World("inactive"))
    world.health_answers = [503, 200]
    result = world.run(phase="gate", node_rank=1, ready_when_active=False)
    assert result["healthy"] is True, result["msg"]
    assert world.probe.calls[0]["tiers"] == list(RANK_TIERS)
    assert "soak_requests" not in world.probe.calls[0]
    assert "generate" in GATE_TIERS and "generate" not in RANK_TIERS


def test_the_gate_phase_fails_at_once_when_the_engine_crashes_and_saves_nothing():
    world = started(World("inactive"), Start(load=5.0, crash_at=2.0))
    result = world.run(phase="gate", node_rank=1)
    assert result["healthy"] is False
    assert result["gate"]["failed_tier"] == "unit"
    assert world.clock.now < 3.0, "failed when it crashed, not at the ready timeout"
    assert world.store.saves == []
    assert result["service"]["journal"], "the journal's tail explains the failure"
    assert result["msg"].startswith(f"{UNIT} failed its gate: unit tier:")


def test_the_gate_phase_of_a_unit_that_never_started_fails_on_the_unit_tier():
    world = World("inactive")
    original = world.unit.props

    def never_started():
        return {**original(), "InvocationID": "", "InactiveExitTimestampMonotonic": "0"}

    world.unit.props = never_started
    result = world.run(phase="gate")
    assert result["healthy"] is False and result["gate"]["failed_tier"] == "unit"
    assert "did not begin" in result["gate"]["reason"]


# -- check mode ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "keys"),
    [
        ("stop", ["stop", "reap"]),
        ("start", ["daemon_reload", "start"]),
        ("gate", ["gate", "snapshot"]),
        ("all", ["stop", "reap", "daemon_reload", "start", "gate", "snapshot"]),
    ],
)
def test_check_mode_plans_only_its_phase_and_changes_nothing(phase, keys):
    world = World()
    result = world.run(check_mode=True, phase=phase, node_rank=1)
    assert sorted(result["plan"]) == sorted(keys)
    assert world.unit.verbs() == [] and world.probe.calls == [] and world.store.saves == []
    if "stop" in keys:
        assert result["plan"]["stop"]["mode"] == "kill"
    if "gate" in keys:
        assert ", ".join(RANK_TIERS) in result["plan"]["gate"]


# -- bad input -------------------------------------------------------------------------------------------


def test_a_negative_node_rank_is_refused_naming_it():
    with pytest.raises(ChainInputError, match=r"node_rank must be an integer >= 0.*got -1") as caught:
        parse_chain_options(validated({**PARAMS, "node_rank": -1}))
    assert caught.value.option == "node_rank"


def test_gateways_on_a_rank_above_0_are_refused():
    params = {**PARAMS, "node_rank": 1, "gateways": ["http://10.0.0.9:30080"], "gateway_worker_url": "http://h:1"}
    with pytest.raises(ChainInputError, match="gateways must be empty on node_rank 1") as caught:
        parse_chain_options(validated(params))
    assert caught.value.option == "gateways"


def test_an_unknown_phase_is_refused_naming_the_phases():
    params = validated(PARAMS)
    with pytest.raises(ChainInputError, match="phase must be one of all, stop, start, gate, got 'restart'"):
        parse_chain_options({**params, "phase": "restart"})
