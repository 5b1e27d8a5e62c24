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
