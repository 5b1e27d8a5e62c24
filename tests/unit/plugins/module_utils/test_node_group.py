"""node_group: a multi-node engine's members, ranks, GPU counts and rank-0 address, refused before anything changes."""

from __future__ import annotations

import errno
import socket

import pytest

from ansible_collections.llmops.inference.plugins.module_utils import node_group
from ansible_collections.llmops.inference.plugins.module_utils.node_group import (
    GroupPlan,
    NodeGroupError,
    check_rank0_address,
    format_address,
    plan_group,
    split_address,
)

GROUP = ["gpu-a", "gpu-b"]


def view(name: str, **overrides) -> dict:
    base = {
        "node_group": list(GROUP),
        "node_rank": None,
        "tp_size": 4,
        "gpus": [],
        "model_path": "Qwen/Qwen3-32B",
        "dist_init_addr": "",
        "dist_init_port": 20000,
        "address": {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"}.get(name, name),
    }
    return {**base, **overrides}


def views(**per_host) -> dict:
    """A view per member of GROUP, with the overrides given by host name (None: the host is not in the play)."""
    out = {}
    for name in per_host.pop("members", GROUP):
        overrides = per_host.get(name.replace("-", "_"), {})
        out[name] = None if overrides is None else view(name, **overrides)
    return out


def problems(host="gpu-a", group=None, **per_host) -> list:
    with pytest.raises(NodeGroupError) as refused:
        plan_group(host, GROUP if group is None else group, views(**per_host))
    return refused.value.problems


# -- a group that works ----------------------------------------------------------------------------------------------
def test_rank_is_the_position_and_the_address_is_rank0s():
    plan = plan_group("gpu-b", GROUP, views())
    assert plan.as_dict() == {
        "nnodes": 2,
        "node_rank": 1,
        "dist_init_addr": "10.0.0.1:20000",
        "gpus_per_node": 2,
        "ranks": {"gpu-a": 0, "gpu-b": 1},
    }


def test_explicit_ranks_override_positions_and_move_the_address():
    plan = plan_group("gpu-a", GROUP, views(gpu_a={"node_rank": 1}, gpu_b={"node_rank": 0}))
    assert (plan.node_rank, plan.dist_init_addr) == (1, "10.0.0.2:20000")


def test_an_explicit_address_wins_and_an_empty_group_is_one_node():
    plan = plan_group(
        "gpu-a", GROUP, views(gpu_a={"dist_init_addr": "head:5000"}, gpu_b={"dist_init_addr": "head:5000"})
    )
    assert plan.dist_init_addr == "head:5000"
    assert plan_group("gpu-a", [], {}) == GroupPlan()


def test_a_member_without_an_address_is_reached_by_its_name_and_v6_is_bracketed():
    assert plan_group("gpu-a", GROUP, views(gpu_a={"address": ""})).dist_init_addr == "gpu-a:20000"
    assert plan_group("gpu-a", GROUP, views(gpu_a={"address": "fd00::1"})).dist_init_addr == "[fd00::1]:20000"


def test_gpu_lists_of_gpus_per_node_are_accepted():
    assert plan_group("gpu-a", GROUP, views(gpu_a={"gpus": ["2", "3"]}, gpu_b={"gpus": ["0", "1"]})).gpus_per_node == 2


# -- membership ------------------------------------------------------------------------------------------------------
def test_this_host_must_be_in_its_group():
    assert problems(host="gpu-c") == [
        "sglang_service_node_group of gpu-c is ['gpu-a', 'gpu-b'], which does not list gpu-c itself"
    ]


def test_a_host_named_twice_is_refused():
    found = problems(group=["gpu-a", "gpu-b", "gpu-a"])
    assert found == ["sglang_service_node_group names gpu-a 2 times; list each host of the engine once"]


def test_a_member_not_in_the_play_is_refused():
    (found,) = problems(gpu_b=None)
    assert found.startswith("sglang_service_node_group names gpu-b, which is not in this play")
    assert "all or none" in found


def test_members_must_list_the_same_group_in_the_same_order():
    (found,) = problems(gpu_b={"node_group": ["gpu-b", "gpu-a"]})
    assert found == (
        "sglang_service_node_group of gpu-b is ['gpu-b', 'gpu-a'], but gpu-a's is ['gpu-a', 'gpu-b']: every host of "
        "the engine must list the same hosts in the same order"
    )


# -- ranks -----------------------------------------------------------------------------------------------------------
def test_a_rank_out_of_range_is_refused_naming_the_accepted_range():
    found = problems(gpu_b={"node_rank": 2})
    assert found[0] == (
        "sglang_service_node_rank of gpu-b is 2: accepted is null (its position in the group) or an integer from 0 to 1"
        " (2 hosts)"
    )


@pytest.mark.parametrize("bad", [-1, "one", True])
def test_ranks_that_are_not_integers_in_range_are_refused(bad):
    assert problems(gpu_a={"node_rank": bad})[0].startswith(f"sglang_service_node_rank of gpu-a is {bad!r}: accepted")


def test_a_duplicated_rank_and_the_rank_it_leaves_missing_are_refused():
    found = problems(gpu_b={"node_rank": 0})
    assert found == [
        "sglang_service_node_rank 0 is given to gpu-a and gpu-b: each rank belongs to one host",
        "no host of the group has sglang_service_node_rank 1: ranks 0 to 1 must each be given",
    ]


# -- the engine's layout ---------------------------------------------------------------------------------------------
def test_tp_size_must_divide_by_the_number_of_hosts():
    found = problems(gpu_a={"tp_size": 3}, gpu_b={"tp_size": 3})
    assert found == [
        "sglang_service_tp_size 3 does not divide by the 2 hosts of sglang_service_node_group (SGLang asserts that "
        "tp_size is divisible by the number of nodes): accepted is a multiple of 2"
    ]


def test_tp_size_and_model_must_be_the_same_on_every_member():
    found = problems(gpu_b={"tp_size": 8, "model_path": "other"})
    assert found == [
        "sglang_service_tp_size differs between the hosts of one engine (gpu-a: 4, gpu-b: 8): set it once for the "
        "group",
        "sglang_service_model_path differs between the hosts of one engine (gpu-a: 'Qwen/Qwen3-32B', gpu-b: 'other'): "
        "set it once for the group",
    ]


def test_a_gpu_list_that_does_not_hold_tp_over_nnodes_gpus_is_refused():
    found = problems(gpu_b={"gpus": ["0", "1", "2", "3"]})
    assert found == [
        "sglang_service_gpus of gpu-b lists 4 GPUs ['0', '1', '2', '3'], but tp_size 4 over 2 hosts runs 2 ranks on "
        "each: list 2 GPUs, or none (0 .. 1)"
    ]


def test_a_bad_or_differing_address_is_refused():
    found = problems(gpu_a={"dist_init_addr": "head"}, gpu_b={"dist_init_addr": "head"})
    assert found == [
        "sglang_service_dist_init_addr is 'head': accepted is empty (rank 0's address) or HOST:PORT of the rank-0 host"
    ]
    assert problems(gpu_b={"dist_init_addr": "head:1"})[0].startswith("sglang_service_dist_init_addr differs")


def test_every_problem_is_named_at_once():
    found = problems(gpu_b={"node_rank": 5, "tp_size": 8})
    assert len(found) == 2 and "node_rank of gpu-b is 5" in found[0] and "tp_size differs" in found[1]


# -- addresses -------------------------------------------------------------------------------------------------------
def test_split_and_format_addresses():
    assert split_address("10.0.0.1:20000") == ("10.0.0.1", 20000)
    assert split_address("[fd00::1]:20000") == ("fd00::1", 20000)
    assert format_address("fd00::1", 1) == "[fd00::1]:1"
    for bad in ("head", "head:0", "head:70000", "a b:1", ":1"):
        with pytest.raises(ValueError):
            split_address(bad)


def _resolve(name, port, family, kind):
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port))]


def test_a_refused_connection_reaches_rank0_and_a_timeout_does_not():
    refused = check_rank0_address(
        "head:20000", "gpu-b", "sglang_service_dist_init_addr", _resolve, lambda *a: None
    )  # answered (refused or listening)
    assert refused is None
    unreachable = check_rank0_address(
        "head:20000", "gpu-b", "sglang_service_dist_init_addr", _resolve, lambda *a: "No route to host"
    )
    assert unreachable == (
        "gpu-b cannot reach sglang_service_dist_init_addr head:20000 (the rank-0 host, where every rank meets): "
        "10.0.0.1: No route to host; the members of a multi-node engine must reach each other"
    )


def test_an_unresolvable_rank0_is_named():
    def fail(*args):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    found = check_rank0_address("nohost.invalid:20000", "gpu-b", "sglang_service_dist_init_addr", fail)
    assert found == (
        "gpu-b cannot resolve nohost.invalid, the rank-0 host of sglang_service_dist_init_addr nohost.invalid:20000: "
        "[Errno -2] Name or service not known"
    )


def test_the_real_connect_counts_a_refusal_as_reached_and_an_unreachable_network_as_not(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
    assert check_rank0_address(f"127.0.0.1:{port}", "gpu-b", "label") is None

    class Unreachable(socket.socket):
        def connect(self, address):
            raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(node_group.socket, "socket", Unreachable)
    found = check_rank0_address(f"127.0.0.1:{port}", "gpu-b", "label")
    assert found.endswith(
        ": 127.0.0.1: Network is unreachable; the members of a multi-node engine must reach each other"
    )
