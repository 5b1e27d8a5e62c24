"""The results directory on the controller: resume, replacing earlier results, writability."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import SweepInputError
from ansible_collections.llmops.inference.plugins.module_utils.sweep_store import ResultsDir

DEFINITION = {"algorithm": "EAGLE", "repeats": 2, "warmup_requests": 1, "bench": {"num_prompts": 8}}
P1, P9 = "steps001-topk01-draft002", "steps009-topk01-draft010"


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


def test_start_run_then_resume_skips_recorded_levels(tmp_path):
    store = ResultsDir(str(tmp_path / "r"))
    first = store.start_run(DEFINITION, resume=True, run={"run_id": "a"}, now=1.0)
    assert first == {"done": {}, "replaced": None}
    store.write_level({"point": {"id": P1}, "concurrency": 1, "status": "measured"})
    store.write_level({"point": {"id": P1}, "concurrency": 8, "status": "failed"})
    store.write_level({"point": {"id": P9}, "concurrency": 1, "status": "failed"})
    (tmp_path / "r" / "points" / P1 / "c0032.json").write_text("{not json")  # a write cut short
    again = store.start_run(DEFINITION, resume=True, run={"run_id": "b"}, now=2.0)
    assert again["done"] == {P1: [1, 8], P9: [1]}
    retry = store.start_run(DEFINITION, resume=True, run={"run_id": "c"}, now=3.0, retry_failed=True)
    assert retry["done"] == {P1: [1]}
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
    # other points or load levels are no reason to refuse: the new ones are measured
    store.start_run(dict(DEFINITION, levels=[{"concurrency": 64}], points=[]), resume=True, run={"run_id": "c"}, now=3)


def test_a_fresh_run_moves_earlier_results_aside(tmp_path):
    store = ResultsDir(str(tmp_path))
    store.start_run(DEFINITION, resume=False, run={"run_id": "a"}, now=1.0)
    store.write_level({"point": {"id": P1}, "concurrency": 1, "status": "measured"})
    store.write_file("results.md", b"old")
    store.write_file("results-pareto.png", b"old")
    fresh = store.start_run(DEFINITION, resume=False, run={"run_id": "b"}, now=1700000000.0)
    assert fresh["replaced"] == str(tmp_path / "replaced-20231114T221320Z")
    assert sorted(os.listdir(fresh["replaced"])) == ["points", "results-pareto.png", "results.md", "sweep.json"]
    assert store.level_records() == []
    assert [run["run_id"] for run in store.read_definition()["runs"]] == ["b"]
