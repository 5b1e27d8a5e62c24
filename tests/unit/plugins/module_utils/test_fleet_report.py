"""The fleet probe's report: a line per host, and a multi-node engine that serves only when every rank does."""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.fleet_report import fleet_report, host_line

SERVING = {"state": "serving", "healthy": True, "main_pid": 41, "n_restarts": 0,
           "gpu_memory_mib": {"0": 70000, "1": 70100}, "generation": {"tokens_per_s": 52.345}}  # fmt: skip
RANK1_SERVING = {"state": "serving", "healthy": True, "main_pid": 42, "n_restarts": 0, "gpu_memory_mib": {"0": 70000}}
DOWN = {"state": "not_serving", "healthy": False, "main_pid": 0, "n_restarts": 3, "failed_tier": "unit",
        "reason": "inactive (failed)"}  # fmt: skip
GROUP = {"r0": ["r0", "r1"], "r1": ["r0", "r1"], "solo": []}
RANKS = {"r0": 0, "r1": 1, "solo": 0}


def test_a_host_line_shows_state_pid_restarts_gpus_and_speed():
    assert (
        host_line("solo", SERVING, 0)
        == "solo: SERVING | pid 41, restarts 0 | GPU 0: 70000 MiB, 1: 70100 MiB | 52.3 tok/s"
    )
    assert host_line("solo", DOWN, 0) == (
        "solo: NOT SERVING (unit: inactive (failed)) | pid -, restarts 3 | GPU - | no generation"
    )
    reset = {"state": "needs_gpu_reset", "reset_message": "GPU 1 needs a reset"}
    assert host_line("solo", reset, 0).startswith("solo: NEEDS GPU RESET (GPU 1 needs a reset) | ")
    assert host_line("r1", RANK1_SERVING, 1).startswith(
        "r1 (rank 1 of a multi-node engine: unit, GPU and health tiers): SERVING | pid 42"
    )


def test_a_multi_node_engine_serves_when_every_rank_serves():
    report = fleet_report(["r0", "r1", "solo"], {"r0": SERVING, "r1": RANK1_SERVING, "solo": SERVING}, RANKS, GROUP)
    assert report["lines"][0] == "fleet probe: 3 of 3 host(s) serve, 0 hung, 0 need a GPU reset"
    assert report["lines"][-1] == "multi-node engine r0, r1: SERVING"
    assert len(report["lines"]) == 5  # headline, three hosts, one engine


def test_a_multi_node_engine_takes_the_worst_state_of_its_ranks_and_names_them():
    report = fleet_report(["r1", "r0"], {"r0": SERVING, "r1": DOWN}, RANKS, GROUP)
    assert report["lines"][-1] == "multi-node engine r0, r1: NOT SERVING (rank 1 r1: NOT SERVING)"
    assert report["counts"] == {"needs_gpu_reset": 0, "hung": 0, "not_serving": 1, "serving": 1}
    hung = dict(DOWN, state="hung")
    assert fleet_report(["r0", "r1"], {"r0": hung, "r1": DOWN}, RANKS, GROUP)["lines"][-1] == (
        "multi-node engine r0, r1: HUNG (rank 0 r0: HUNG; rank 1 r1: NOT SERVING)"
    )


def test_a_rank_that_was_not_probed_leaves_the_engine_not_known():
    report = fleet_report(["r0"], {"r0": SERVING}, RANKS, GROUP)
    assert report["lines"][-1] == "multi-node engine r0, r1: NOT KNOWN (rank 1 r1: not probed)"
    report = fleet_report(["r0"], {"r0": DOWN}, RANKS, GROUP)
    assert (
        report["lines"][-1] == "multi-node engine r0, r1: NOT SERVING (rank 0 r0: NOT SERVING; rank 1 r1: not probed)"
    )


def test_a_gpu_reset_is_counted_and_points_to_its_runbook():
    reset = {"state": "needs_gpu_reset", "reset_message": "GPU 0 needs a reset"}
    headline = fleet_report(["solo"], {"solo": reset}, {}, {})["lines"][0]
    assert headline == (
        "fleet probe: 0 of 1 host(s) serve, 0 hung, 1 need a GPU reset (runbook: docs/runbooks/gpu_needs_reset.md)"
    )
