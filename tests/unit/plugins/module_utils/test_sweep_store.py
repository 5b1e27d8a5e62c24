"""The results directory on the controller (resume, replacing, writability) and the sweep_report actions."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_actions import (
    plan_sweep,
    record_point,
    write_reports,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import SweepInputError
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plot import plot_available
from ansible_collections.llmops.inference.plugins.module_utils.sweep_store import ResultsDir

DEFINITION = {"algorithm": "EAGLE", "repeats": 2, "warmup_requests": 1, "bench": {"num_prompts": 8}}


def plan_params(results_dir, **overrides) -> dict:
    params = {
        "results_dir": str(results_dir),
        "steps": [1, 2, 3, 4, 5],
        "topk": 1,
        "draft_tokens": None,
        "grid": None,
        "algorithm": "EAGLE",
        "host_profiles": {"h1": {"model_path": "m", "tp_size": "1"}, "h2": {"model_path": "m", "tp_size": "1"}},
        "hosts": ["h1", "h2"],
        "repeats": 2,
        "warmup_requests": 1,
        "bench": {"num_prompts": 8, "concurrency": 4},
        "resume": False,
        "retry_failed": False,
        "apply": "original",
        "mad_penalty": 1.0,
        "tolerance": 0.02,
    }
    params.update(overrides)
    return params


def record(results_dir, plan: dict, steps: int, throughput: float | None, run_id: str | None = None) -> dict:
    entry = next(item for item in plan["points"] if item["steps"] == steps)
    healthy = throughput is not None
    run = {"completed": 8, "failed_requests": 0, "output_throughput": throughput, "accept_length": 2.0}
    benchmark = {"runs": [run], "elapsed_s": 2.0}
    return record_point(
        {
            "results_dir": str(results_dir),
            "point": entry,
            "host": "h1",
            "run_id": run_id or plan["run_id"],
            "started_at": 1000.0 + steps * 10,
            "finished_at": 1008.0 + steps * 10,
            "load_s": 5.0,
            "gate": {"healthy": healthy, "reason": None if healthy else "unit failed", "failed_tier": "unit"},
            "benchmark": benchmark if healthy else None,
            "journal": ["RuntimeError: CUDA out of memory."] if not healthy else [],
        }
    )


def test_results_dir_must_be_absolute_and_writable(tmp_path):
    with pytest.raises(SweepInputError, match="sweep_results_dir must be an absolute path on the controller"):
        ResultsDir("relative/dir")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SweepInputError, match=r"sweep_results_dir cannot be written on the controller: .*file/sub"):
        ResultsDir(str(blocker / "sub")).ensure_writable()
    with pytest.raises(SweepInputError, match="is not a directory"):
        ResultsDir(str(blocker / "sub")).check_writable()
    ResultsDir(str(tmp_path / "new" / "dir")).check_writable()
    assert not (tmp_path / "new").exists()


def test_start_run_then_resume_skips_recorded_points(tmp_path):
    store = ResultsDir(str(tmp_path / "r"))
    first = store.start_run(DEFINITION, resume=True, run={"run_id": "a"}, now=1.0)
    assert first == {"done": [], "replaced": None}
    store.write_point({"point": {"id": "steps001-topk01-draft002"}, "status": "measured"})
    store.write_point({"point": {"id": "steps009-topk01-draft010"}, "status": "failed"})
    (tmp_path / "r" / "points" / "steps002-topk01-draft003.json").write_text("{not json")  # a write cut short
    again = store.start_run(DEFINITION, resume=True, run={"run_id": "b"}, now=2.0)
    assert again["done"] == ["steps001-topk01-draft002", "steps009-topk01-draft010"]
    retry = store.start_run(DEFINITION, resume=True, run={"run_id": "c"}, now=3.0, retry_failed=True)
    assert retry["done"] == ["steps001-topk01-draft002"]
    saved = json.loads((tmp_path / "r" / "sweep.json").read_text())
    assert [run["run_id"] for run in saved["runs"]] == ["a", "b", "c"]


def test_resume_refuses_results_measured_differently(tmp_path):
    store = ResultsDir(str(tmp_path))
    store.start_run(DEFINITION, resume=False, run={"run_id": "a"}, now=1.0)
    changed = dict(DEFINITION, bench={"num_prompts": 64})
    with pytest.raises(
        SweepInputError,
        match=r"sweep_resume is true but .* \(differs in: bench; before: {\"bench\": {\"num_prompts\": 8}}\)",
    ):
        store.start_run(changed, resume=True, run={"run_id": "b"}, now=2.0)


def test_a_fresh_run_moves_earlier_results_aside(tmp_path):
    store = ResultsDir(str(tmp_path))
    store.start_run(DEFINITION, resume=False, run={"run_id": "a"}, now=1.0)
    store.write_point({"point": {"id": "p1"}, "status": "measured"})
    store.write_file("results.md", b"old")
    fresh = store.start_run(DEFINITION, resume=False, run={"run_id": "b"}, now=1700000000.0)
    assert fresh["replaced"] == str(tmp_path / "replaced-20231114T221320Z")
    assert sorted(os.listdir(fresh["replaced"])) == ["points", "results.md", "sweep.json"]
    assert store.point_records() == []
    assert [run["run_id"] for run in store.read_definition()["runs"]] == ["b"]


def test_plan_assigns_pending_points_in_turn_and_resume_skips_recorded_ones(tmp_path):
    plan = plan_sweep(plan_params(tmp_path), {"run_id": "r1"}, now=1000.0)
    assert plan["pending"] == [entry["id"] for entry in plan["points"]]
    assert [entry["steps"] for entry in plan["assignment"]["h1"]] == [1, 3, 5]
    assert [entry["steps"] for entry in plan["assignment"]["h2"]] == [2, 4]
    assert plan["definition"]["bench"]["max_new_tokens"] == 128  # defaults filled in
    record(tmp_path, plan, 1, 100.0)
    record(tmp_path, plan, 2, 110.0)
    resumed = plan_sweep(plan_params(tmp_path, resume=True), {"run_id": "r2"}, now=2000.0)
    assert resumed["done"] == [plan["points"][0]["id"], plan["points"][1]["id"]]
    assert [entry["steps"] for entry in resumed["assignment"]["h1"]] == [3, 5]
    assert [entry["steps"] for entry in resumed["assignment"]["h2"]] == [4]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"steps": []}, "sweep_steps must not be empty"),
        ({"algorithm": "NGRAM"}, "sweep_algorithm is NGRAM"),
        ({"repeats": 0}, "sweep_repeats must be an integer >= 1"),
        ({"bench": {"num_prompts": 0}}, "sweep_bench.num_prompts must be an integer >= 1, got 0"),
        ({"bench": {"prompts": 3}}, r"sweep_bench has unknown keys \['prompts'\]"),
        ({"bench": {"ignore_eos": "yes"}}, "sweep_bench.ignore_eos must be true or false"),
        ({"tolerance": 1.0}, "sweep_tolerance must be a fraction"),
        ({"mad_penalty": -1.0}, "sweep_mad_penalty must be a number >= 0"),
        ({"hosts": []}, "sweep_hosts matches no hosts"),
        ({"hosts": ["h1", "h1"]}, "sweep_hosts lists a host more than once"),
        ({"host_profiles": {"h1": {"tp_size": "1"}, "h2": {"tp_size": "2"}}}, "sweep_hosts are not alike"),
    ],
)
def test_plan_rejects_bad_input_and_writes_nothing(tmp_path, overrides, message):
    with pytest.raises(SweepInputError, match=message):
        plan_sweep(plan_params(tmp_path / "r", **overrides), {"run_id": "x"}, now=1.0)
    assert not (tmp_path / "r").exists()


def test_plan_in_check_mode_writes_nothing(tmp_path):
    plan = plan_sweep(plan_params(tmp_path / "r"), {"run_id": "x"}, now=1.0, write=False)
    assert len(plan["pending"]) == 5
    assert not (tmp_path / "r").exists()


def test_reports_json_csv_markdown_and_plot(tmp_path):
    plan = plan_sweep(plan_params(tmp_path), {"run_id": "r1"}, now=1000.0)
    for steps, throughput in ((1, 100.0), (2, 130.0), (3, 131.0), (4, 120.0), (5, None)):
        record(tmp_path, plan, steps, throughput)
    report = write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": True}, now=1100.0)
    assert report["best"]["steps"] == 2  # 130 is within 2 % of 131 and uses fewer steps
    assert sorted(report["files"]) == (
        ["csv", "json", "markdown", "png"] if plot_available() else ["csv", "json", "markdown"]
    )
    document = json.loads((tmp_path / "results.json").read_text())
    assert len(document["points"]) == 5
    assert document["timing"]["points_run"] == 5
    assert document["timing"]["sweep_wall_s"] == pytest.approx(1058.0 - 1010.0)
    failed = [row for row in document["summary"] if row["status"] == "failed"]
    assert [row["steps"] for row in failed] == [5]
    assert "CUDA out of memory" in failed[0]["reason"]
    assert "**best**" in (tmp_path / "results.md").read_text()
    if plot_available():
        assert (tmp_path / "results.png").read_bytes().startswith(b"\x89PNG")
    quiet = write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": False}, now=1100.0)
    assert quiet["plot_skipped"] == "plot: false"


def test_report_needs_a_planned_sweep(tmp_path):
    with pytest.raises(SweepInputError, match=r"holds no sweep\.json"):
        write_reports({"results_dir": str(tmp_path)}, now=1.0)
