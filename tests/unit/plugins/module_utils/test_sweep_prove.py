"""The proof of a sweep's deployable configuration: its arms, their alternating order, each figure against the
level's best static point with its spread, and the verdicts."""

from __future__ import annotations

import csv
import io

from test_sweep_actions import plan_params, record
from test_sweep_adaptive import LAB

from ansible_collections.llmops.inference.plugins.module_utils.sweep_actions import (
    plan_sweep,
    record_arm,
    write_reports,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_prove import (
    DEFAULT,
    DERIVED,
    NONE,
    arms,
    compare,
    schedule,
)

BEST = [
    {"concurrency": 1, "best": {"id": "s4-k1-d5", "steps": 4, "topk": 1, "draft_tokens": 5}},
    {"concurrency": 16, "best": {"id": "s2-k1-d3", "steps": 2, "topk": 1, "draft_tokens": 3}},
]
STATIC = {"id": "s3-k1-d4", "steps": 3, "topk": 1, "draft_tokens": 4}


def deploy(config=True, refused=None, static=None):
    static = STATIC if static is None else static
    return {
        "static": {"point": static},
        "adaptive": {"config": {"1": {"candidate_steps": [4]}} if config else None, "refused": refused},
    }


def test_the_arms_and_how_each_is_applied():
    found = arms(deploy(), BEST, "/etc/sglang/x.json")
    assert [arm["id"] for arm in found] == [DERIVED, DEFAULT, "s3-k1-d4", NONE, "s4-k1-d5", "s2-k1-d3"]
    derived, default = found[0]["dropin"], found[1]["dropin"]
    assert derived == {"num_steps": None, "eagle_topk": None, "num_draft_tokens": None, "adaptive": True,
                       "adaptive_config": "/etc/sglang/x.json"}  # fmt: skip
    assert default["adaptive_config"] == "" and default["adaptive"] is True
    assert found[2]["dropin"] == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert found[3]["dropin"]["algorithm"] == ""
    refused = arms(deploy(config=False, refused={"reason": "top-k"}), BEST, "")
    assert [arm["id"] for arm in refused] == ["s3-k1-d4", NONE, "s4-k1-d5", "s2-k1-d3"]
    same = arms(deploy(static=BEST[0]["best"]), BEST, "")
    assert [arm["role"] for arm in same] == ["derived", "sglang default", "best static", "no speculation", "level best"]


def test_rounds_rotate_the_arms():
    order = schedule([{"id": "a"}, {"id": "b"}, {"id": "c"}], 3)
    assert [(item["round"], item["arm"]["id"]) for item in order] == [
        (1, "a"), (1, "b"), (1, "c"), (2, "b"), (2, "c"), (2, "a"), (3, "c"), (3, "a"), (3, "b"),
    ]  # fmt: skip
    assert schedule([{"id": "a"}], 0) == []


def row(arm, number, level, value):
    return {"id": arm, "round": number, "concurrency": level, "status": "measured", "output_throughput_median": value}


def rows_for(values: dict) -> list:
    """values: {arm: {level: [per round]}}."""
    return [
        row(arm, number, level, value)
        for arm, by_level in values.items()
        for level, per_round in by_level.items()
        for number, value in enumerate(per_round, start=1)
    ]


def test_each_arm_against_the_levels_best_with_its_spread_and_verdict():
    found = arms(deploy(), BEST, "")
    values = {
        "s4-k1-d5": {1: [100.0, 100.0], 16: [90.0, 91.0]},
        "s2-k1-d3": {1: [92.0, 93.0], 16: [100.0, 100.0]},
        "s3-k1-d4": {1: [98.0, 99.0], 16: [99.0, 99.0]},
        DERIVED: {1: [99.0, 98.5], 16: [99.5, 99.0]},
        DEFAULT: {1: [98.0, 98.0], 16: [90.0, 90.0]},
        NONE: {1: [50.0, 51.0], 16: [70.0, 70.0]},
    }
    proof = compare(rows_for(values), found, BEST, [1, 16])
    derived = next(arm for arm in proof["arms"] if arm["arm"] == DERIVED)
    first = derived["levels"][0]
    assert first["reference"] == "s4-k1-d5" and first["target"] == 0.97
    assert (first["low"], first["high"], first["verdict"]) == (0.985, 0.99, "meets")
    static = next(arm for arm in proof["arms"] if arm["arm"] == "s3-k1-d4")
    assert static["levels"][0]["verdict"] is None  # only the derived setting has a target per level
    versus_static = proof["averaged"]["adaptive_vs_best_static"]
    assert versus_static["other"] == "s3-k1-d4" and versus_static["rounds"] == 2
    assert versus_static["verdict"] == "inconclusive"  # round 1: 99/98 and 99.5/99 beat it; round 2 does not
    assert proof["averaged"]["adaptive_vs_sglang_default"]["verdict"] == "meets"


def test_a_spread_across_the_target_is_inconclusive_and_one_round_never_decides():
    found = arms(deploy(), BEST[:1], "")
    crossing = rows_for({"s4-k1-d5": {1: [100.0, 100.0]}, DERIVED: {1: [99.0, 95.0]}})
    assert compare(crossing, found, BEST[:1], [1])["arms"][0]["levels"][0]["verdict"] == "inconclusive"
    missing = rows_for({"s4-k1-d5": {1: [100.0, 100.0]}, DERIVED: {1: [90.0, 95.0]}})
    assert compare(missing, found, BEST[:1], [1])["arms"][0]["levels"][0]["verdict"] == "misses"
    single = rows_for({"s4-k1-d5": {1: [100.0]}, DERIVED: {1: [99.9]}})
    assert compare(single, found, BEST[:1], [1])["arms"][0]["levels"][0]["verdict"] == "inconclusive"


def test_a_recorded_proof_reaches_every_report_format(tmp_path):
    params = plan_params(tmp_path, steps=[2, 3, 4], concurrency=[1, 16])
    plan = plan_sweep(params, {"run_id": "r1"}, now=1000.0)
    for steps in (2, 3, 4):
        record(tmp_path, plan, steps, 1, LAB[1][steps])
        record(tmp_path, plan, steps, 16, LAB[16][steps])
    report = write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": False, "prove_rounds": 2}, 1100.0)
    order = report["prove_plan"]
    assert [item["arm"]["id"] for item in order if item["round"] == 1][:2] == [DERIVED, DEFAULT]
    assert report["proof"] is None and "Not measured in this run" in (tmp_path / "results.md").read_text()
    for item in order:
        arm, number = item["arm"], item["round"]
        base = {"s4-k1-d5": 100.0, "s2-k1-d3": 100.0, "s3-k1-d4": 99.0, NONE: 60.0}.get(arm["id"], 99.5)
        runs = [{"completed": 4, "failed_requests": 0, "output_throughput": base + number, "concurrency": c}
                for c in (1, 16)]  # fmt: skip
        benchmark = {"levels": [dict(run, level_started_at=5000.0, level_ended_at=5001.0, runs=[run], repeats=1)
                                for run in runs], "engine": {}}  # fmt: skip
        record_arm(
            {"results_dir": str(tmp_path), "run_id": "r1", "arm": arm, "round": number, "host": "h1",
             "levels": [1, 16], "started_at": 5000.0, "finished_at": 5002.0, "load_s": 1.0,
             "gate": {"healthy": True, "service": {"main_pid": 1}}, "benchmark": benchmark}
        )  # fmt: skip
    report = write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": False}, 1200.0)
    proof = report["proof"]
    assert proof["rounds"] == 2
    derived = next(arm for arm in proof["arms"] if arm["arm"] == DERIVED)
    assert [level["verdict"] for level in derived["levels"]] == ["meets", "meets"]
    assert "## The deployable configuration, proven in this run" in (tmp_path / "results.md").read_text()
    proof_csv = list(csv.reader(io.StringIO((tmp_path / "results-proof.csv").read_text())))
    assert proof_csv[0][0] == "arm" and any(line[0] == DERIVED and line[2] == "1" for line in proof_csv)
    assert report["files"]["proof_csv"].endswith("results-proof.csv")
