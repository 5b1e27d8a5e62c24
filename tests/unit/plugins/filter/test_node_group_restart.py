"""node_group_restart: a multi-node engine decides its restart as one and is judged as one after each step."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.filter.node_group_restart import FilterModule, node_group_restart

RANKS = {"gpu-b": 1, "gpu-a": 0}
PLAY = ["gpu-a", "gpu-b", "solo"]


def done(phase: str, **gate) -> dict:
    """A member's sglang_restart result of ``phase`` that passed (or failed, with ``gate`` keys)."""
    healthy = None if phase in ("stop", "start") else True
    if gate.get("failed_tier"):
        healthy = False
    return {"phase": phase, "healthy": healthy, "gate": {"failed_step": None, "failed_tier": None, **gate}}


def test_any_member_that_needs_a_restart_restarts_every_member_alike():
    asked = {"gpu-a": False, "gpu-b": True}
    decisions = [node_group_restart(asked, "decide", host=host, ranks=RANKS, play_hosts=PLAY) for host in RANKS]
    assert all(decision["restart"] for decision in decisions)
    assert {decision["why"] for decision in decisions} == {"needed by rank 1 gpu-b"}
    assert [decision["rank"] for decision in decisions] == [1, 0]
    assert decisions[0]["order"] == ["gpu-a", "gpu-b"]


def test_no_member_asked_means_no_restart_unless_forced():
    quiet = {"gpu-a": False, "gpu-b": "false"}
    assert node_group_restart(quiet, "decide", host="gpu-a", ranks=RANKS, play_hosts=PLAY)["restart"] is False
    forced = node_group_restart(quiet, "decide", host="gpu-a", ranks=RANKS, play_hosts=PLAY, force=True)
    assert forced["restart"] is True and forced["why"] == "asked for the whole group"


def test_a_member_that_left_the_play_refuses_the_group_restart_naming_it():
    with pytest.raises(AnsibleFilterError, match=r"rank 1 gpu-b is not in the play any more"):
        node_group_restart({"gpu-a": True}, "decide", host="gpu-a", ranks=RANKS, play_hosts=["gpu-a"])


def test_every_step_passes_when_every_member_ran_it():
    verdict = None
    steps = [
        ("stop_rank0", {"gpu-a": done("stop")}),
        ("stop_ranks", {"gpu-a": done("stop"), "gpu-b": done("stop")}),
        ("start", {"gpu-a": done("start"), "gpu-b": done("start")}),
        ("gate_ranks", {"gpu-a": done("start"), "gpu-b": done("gate")}),
        ("gate_rank0", {"gpu-a": done("gate"), "gpu-b": done("gate")}),
    ]
    for step, results in steps:
        verdict = node_group_restart(results, step, ranks=RANKS, play_hosts=PLAY, previous=verdict)
        assert verdict["ok"], (step, verdict["msg"])
    assert verdict["touched"] is True


def test_a_failed_gate_of_rank_1_fails_the_group_naming_rank_and_host():
    results = {"gpu-a": done("start"), "gpu-b": done("gate", failed_tier="unit", reason="unit restarted\nmore")}
    verdict = node_group_restart(
        results,
        "gate_ranks",
        ranks=RANKS,
        play_hosts=PLAY,
        previous={"ok": True, "touched": True, "failed": [], "msg": ""},
    )
    assert verdict["ok"] is False
    assert verdict["failed"] == [
        {"rank": 1, "host": "gpu-b", "step": "gate_ranks", "reason": "failed its gate: unit tier: unit restarted"}
    ]
    assert "rank 1 (gpu-b) failed its gate: unit tier: unit restarted" in verdict["msg"]
    assert "Every member of the group is stopped next" in verdict["msg"]
    stopped = {"gpu-a": done("stop"), "gpu-b": done("stop")}
    final = node_group_restart(stopped, "cleanup", ranks=RANKS, play_hosts=PLAY, previous=verdict)
    assert final["ok"] is False and final["stopped"] is True
    assert final["msg"].startswith("the node group (rank 0 gpu-a, rank 1 gpu-b) failed its restart at gate_ranks: ")
    assert "Every member of the group is stopped and reaped" in final["msg"]
    later = node_group_restart({}, "gate_rank0", ranks=RANKS, play_hosts=PLAY, previous=verdict)
    assert later == verdict, "a failed group stays failed; later steps did not run"


def test_a_stop_after_the_failure_that_fails_too_names_the_members_that_may_still_run():
    failure = node_group_restart(
        {"gpu-a": done("start"), "gpu-b": done("gate", failed_tier="gpu", reason="holds 0 MiB")},
        "gate_ranks",
        ranks=RANKS,
        play_hosts=PLAY,
        previous={"ok": True, "touched": True, "failed": [], "msg": ""},
    )
    stops = {
        "gpu-a": done("stop", failed_step="lock", reason="not held with the given lock.token"),
        "gpu-b": done("stop"),
    }
    final = node_group_restart(stops, "cleanup", ranks=RANKS, play_hosts=PLAY, previous=failure)
    assert final["ok"] is False and final["stopped"] is False
    assert "rank 1 (gpu-b) failed its gate: gpu tier: holds 0 MiB." in final["msg"]
    assert (
        "Stopping every member failed too, so these may still run: rank 0 (gpu-a) failed at lock: not held with the "
        "given lock.token." in final["msg"]
    )


def test_a_refused_stop_of_rank_0_leaves_the_group_untouched():
    results = {"gpu-a": done("stop", failed_step="gateway_drain", reason="would leave 0 healthy worker(s)")}
    verdict = node_group_restart(results, "stop_rank0", ranks=RANKS, play_hosts=PLAY)
    assert verdict["ok"] is False and verdict["touched"] is False
    assert "No engine of the group was stopped" in verdict["msg"]
    assert "rank 0 (gpu-a) failed at gateway_drain: would leave 0 healthy worker(s)" in verdict["msg"]


def test_a_member_that_did_not_run_its_step_or_left_the_play_fails_the_group():
    stale = {"gpu-a": done("stop"), "gpu-b": done("gate")}
    verdict = node_group_restart(stale, "start", ranks=RANKS, play_hosts=PLAY)
    assert [entry["host"] for entry in verdict["failed"]] == ["gpu-a", "gpu-b"]
    assert verdict["failed"][0]["reason"] == "did not run the start phase"
    gone = node_group_restart({"gpu-a": done("start")}, "start", ranks=RANKS, play_hosts=["gpu-a"])
    assert gone["failed"] == [
        {"rank": 1, "host": "gpu-b", "step": "start", "reason": "left the play (it failed or could not be reached)"}
    ]


@pytest.mark.parametrize(
    ("values", "kwargs", "message"),
    [
        ([], {"step": "decide"}, "expects a dict by member, got list"),
        ({}, {"step": "decide", "ranks": {}}, "ranks must map each member"),
        ({}, {"step": "gate", "ranks": RANKS}, "step must be decide or one of stop_rank0, stop_ranks, start"),
        ({}, {"step": "decide", "ranks": RANKS, "host": "other"}, "other is not a member of its node group"),
    ],
)
def test_bad_input_is_named(values, kwargs, message):
    with pytest.raises(AnsibleFilterError, match=message):
        node_group_restart(values, play_hosts=PLAY, **kwargs)


def test_the_filter_is_registered():
    assert FilterModule().filters()["node_group_restart"] is node_group_restart
