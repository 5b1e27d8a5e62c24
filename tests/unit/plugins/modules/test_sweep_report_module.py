"""The sweep_report module's thin layer: check mode writes nothing, errors name the variable or the options."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.modules import sweep_report

pytestmark = pytest.mark.usefixtures("target_side_ansible")


def run_module(capsys, args: dict) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        sweep_report.main()
    return json.loads(capsys.readouterr().out)


def test_sweep_report_plan_in_check_mode_writes_nothing(capsys, tmp_path):
    target = tmp_path / "results"
    result = run_module(
        capsys,
        {"action": "plan", "results_dir": str(target), "steps": [1, 2, 3], "algorithm": "EAGLE", "hosts": ["a", "b"],
         "_ansible_check_mode": True},
    )  # fmt: skip
    assert result["changed"] is False
    assert [entry["steps"] for entry in result["assignment"]["a"]] == [1, 3]
    assert not target.exists()


def test_sweep_report_names_the_variable_and_the_missing_options(capsys, tmp_path):
    bad = run_module(capsys, {"action": "plan", "results_dir": str(tmp_path), "steps": [0], "hosts": ["a"]})
    assert bad["failed"] is True
    assert bad["variable"] == "sweep_steps"
    missing = run_module(capsys, {"action": "record", "results_dir": str(tmp_path)})
    assert missing["msg"] == "action=record needs run_id, point, host, started_at, finished_at"


def test_sweep_report_returns_each_rejected_combination(capsys, tmp_path):
    bad = run_module(
        capsys,
        {"action": "plan", "results_dir": str(tmp_path), "grid": [{"steps": 1, "topk": 4, "draft_tokens": 8}],
         "algorithm": "EAGLE", "hosts": ["a"]},
    )  # fmt: skip
    assert bad["failed"] is True and bad["variable"] == "sweep_grid"
    assert bad["rejected"] == [
        {
            "point": {"steps": 1, "topk": 4, "draft_tokens": 8},
            "rule": "draft-above-tree",
            "reason": bad["rejected"][0]["reason"],
            "source": "srt/speculative/eagle_utils.py organize_draft_results; srt/speculative/spec_utils.py",
        }
    ]
    assert not (tmp_path / "sweep.json").exists()


def test_sweep_report_budget_changes_nothing(capsys, tmp_path):
    status = {"ActiveState": "active", "ExecMainStartTimestampMonotonic": "0", "ActiveEnterTimestampMonotonic": "9"}
    result = run_module(capsys, {"action": "budget", "results_dir": str(tmp_path), "unit_status": status,
                                 "role_wait_s": 300, "load_timeout": 42})  # fmt: skip
    assert result["changed"] is False
    assert result["load_budget_s"] == 42.0
    assert result["msg"] == "load budget 42 s (sweep_load_timeout)"


def test_sweep_report_records_every_level_of_one_benchmark_in_one_call(capsys, tmp_path):
    plan = run_module(capsys, {"action": "plan", "results_dir": str(tmp_path), "steps": [2], "algorithm": "EAGLE",
                               "hosts": ["a"], "concurrency": [1, 8], "repeats": 1})  # fmt: skip
    point = plan["assignment"]["a"][0]
    timed_out = {"failed": True, "msg": "Task failed: Timed out after 500 second(s)."}
    progress = {"planned": [1, 8], "levels": [], "running": {"concurrency": 1, "level_started_at": 12.0}}
    result = run_module(
        capsys,
        {"action": "record", "results_dir": str(tmp_path), "run_id": plan["run_id"], "point": point, "levels": [1, 8],
         "host": "a", "started_at": 10.0, "finished_at": 20.0, "gate": {"healthy": True}, "benchmark": timed_out,
         "bench_progress": json.dumps(progress)},
    )  # fmt: skip
    assert result["changed"] is True
    assert result["msg"] == f"point {point['id']}: concurrency 1 failed, concurrency 8 not run"
    assert [record["started_at"] for record in result["records"]] == [12.0, 20.0]
    assert sorted(path.name for path in (tmp_path / "points" / point["id"]).iterdir()) == ["c0001.json", "c0008.json"]
