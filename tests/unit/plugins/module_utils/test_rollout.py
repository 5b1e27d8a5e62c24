"""rollout: batches of a rolling deploy never split a multi-node engine, and take it whole or not at all."""

from __future__ import annotations

import re

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.rollout import (
    RolloutError,
    batch_size,
    engines,
    plan_rollout,
)

HOSTS = ["a", "b", "c", "d", "e"]
# b and d are the two ranks of one engine (not next to each other in the inventory); the others are single-node.
GROUPS = {"b": ["b", "d"], "d": ["b", "d"], "a": [], "c": None}


@pytest.mark.parametrize(("batch", "hosts", "size"), [(1, 5, 1), ("2", 5, 2), ("25%", 5, 1), ("50%", 5, 2),
                                                      ("100%", 3, 3), ("40%", 10, 4)])  # fmt: skip
def test_batch_size_reads_serial_as_ansible_does(batch, hosts, size):
    assert batch_size(batch, hosts) == size


@pytest.mark.parametrize("batch", [0, "0", "-1", "101%", "0%", "x", "2.5", None])
def test_a_batch_that_is_no_size_is_refused_naming_it(batch):
    with pytest.raises(RolloutError, match=re.escape(f"got {batch!r}")):
        batch_size(batch, 4)


def test_an_engine_comes_where_its_first_member_comes():
    assert engines(HOSTS, GROUPS) == [["a"], ["b", "d"], ["c"], ["e"]]


def test_one_host_per_batch_deploys_the_group_as_one_batch():
    plan = plan_rollout(HOSTS, 1, GROUPS, {})
    assert plan["batches"] == [["a"], ["b", "d"], ["c"], ["e"]]
    assert plan["sizes"] == [1, 2, 1, 1] and plan["rollout"] == ["a", "b", "d", "c", "e"]
    assert plan["skipped"] == []


def test_a_batch_takes_whole_engines_while_they_fit():
    assert plan_rollout(HOSTS, 2, GROUPS, {})["batches"] == [["a"], ["b", "d"], ["c", "e"]]
    assert plan_rollout(HOSTS, 3, GROUPS, {})["batches"] == [["a", "b", "d"], ["c", "e"]]
    assert plan_rollout(HOSTS, "100%", GROUPS, {})["batches"] == [["a", "b", "d", "c", "e"]]


def test_a_member_that_is_not_up_to_date_brings_its_whole_group():
    up_to_date = {"a": True, "b": True, "d": False, "c": True, "e": True}
    plan = plan_rollout(HOSTS, 1, GROUPS, up_to_date)
    assert plan["batches"] == [["b", "d"]] and plan["skipped"] == ["a", "c", "e"]


def test_a_group_up_to_date_on_every_member_is_skipped_unless_forced():
    up_to_date = dict.fromkeys(HOSTS, True) | {"e": False}
    assert plan_rollout(HOSTS, 1, GROUPS, up_to_date)["rollout"] == ["e"]
    assert plan_rollout(HOSTS, 1, GROUPS, up_to_date, force=True)["rollout"] == ["a", "b", "d", "c", "e"]


def test_the_share_is_of_the_hosts_deployed():
    # 4 hosts change: 50% is 2 per batch, the group one batch, the two single hosts the next.
    up_to_date = {"a": True}
    assert plan_rollout(HOSTS, "50%", GROUPS, up_to_date)["batches"] == [["b", "d"], ["c", "e"]]


def test_members_outside_the_hosts_deployed_are_not_added():
    assert plan_rollout(["b", "c"], 1, GROUPS, {})["batches"] == [["b"], ["c"]]
