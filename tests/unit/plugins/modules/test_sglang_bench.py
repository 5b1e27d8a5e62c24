"""The sglang_bench module's thin layer: options, failure policy, check mode, no secrets in the result."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.modules import sglang_bench

pytestmark = pytest.mark.usefixtures("target_side_ansible")


def run_module(capsys, module, args: dict) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


def canned_result(failed_requests: int = 0, warmup_failed: int = 0) -> dict:
    errors = [{"error": "/generate returned HTTP 503", "count": failed_requests}] if failed_requests else []
    warm_errors = [{"error": "timeout", "count": warmup_failed}] if warmup_failed else []
    return {
        "completed": 8 - failed_requests,
        "failed_requests": failed_requests,
        "errors": errors,
        "duration": 2.0,
        "num_prompts": 8,
        "output_throughput": 512.0,
        "warmup": {"requests": 1, "failed_requests": warmup_failed, "duration": 0.1, "errors": warm_errors},
        "runs": [],
    }


@pytest.fixture
def fake_run(monkeypatch):
    seen = {}

    def run(settings, client_factory):
        seen["settings"] = settings
        seen["client"] = client_factory()
        return dict(seen.get("result") or canned_result())

    monkeypatch.setattr(sglang_bench, "run_benchmark", run)
    return seen


def test_bench_passes_options_and_never_changes_anything(capsys, fake_run):
    result = run_module(
        capsys,
        sglang_bench,
        {"num_prompts": 8, "concurrency": 2, "random_output_len": 64, "api_key": "s3cret", "repeats": 2,
         "_ansible_check_mode": True},
    )  # fmt: skip
    assert result["changed"] is False
    assert result["output_throughput"] == 512.0
    assert result["msg"] == "sglang_bench: 8/16 requests completed in 2.00 s at concurrency 2"
    settings = fake_run["settings"]
    assert (settings.num_prompts, settings.concurrency, settings.max_new_tokens, settings.repeats) == (8, 2, 64, 2)
    assert fake_run["client"].api_key == "s3cret"
    assert "s3cret" not in json.dumps(result)


def test_failed_requests_fail_the_task_unless_told_otherwise(capsys, fake_run):
    fake_run["result"] = canned_result(failed_requests=3)
    failed = run_module(capsys, sglang_bench, {})
    assert failed["failed"] is True
    assert "3 failed (first error: /generate returned HTTP 503)" in failed["msg"]
    recorded = run_module(capsys, sglang_bench, {"fail_on_errors": False})
    assert "failed" not in recorded
    assert recorded["failed_requests"] == 3
    fake_run["result"] = canned_result(warmup_failed=1)
    warm = run_module(capsys, sglang_bench, {})
    assert "first error: timeout" in warm["msg"]


def test_bad_options_are_named(capsys, fake_run):
    result = run_module(capsys, sglang_bench, {"concurrency": 0})
    assert result["failed"] is True
    assert result["option"] == "concurrency"
    assert result["msg"] == "concurrency: must be an integer >= 1, got 0"
    assert "settings" not in fake_run


def test_with_a_unit_the_result_names_the_engine_and_a_restart(capsys, fake_run, monkeypatch):
    readings = iter([{"main_pid": 10, "forked_at": 1.0}, {"main_pid": 11, "forked_at": 9.0}])
    monkeypatch.setattr(sglang_bench, "engine_times", lambda run, unit, **_kw: dict(next(readings), unit=unit))
    monkeypatch.setattr(sglang_bench, "journal_tail", lambda run, unit: [f"{unit}: Killed"])
    result = run_module(capsys, sglang_bench, {"unit": "sglang.service", "stop_on_failure": True})
    assert fake_run["settings"].stop_on_failure is True
    assert result["engine"] == {"main_pid": 10, "forked_at": 1.0, "unit": "sglang.service"}
    assert result["engine_restarted"] is True
    assert result["journal_tail"] == ["sglang.service: Killed"]
    plain = run_module(capsys, sglang_bench, {})
    assert "engine" not in plain and "journal_tail" not in plain
