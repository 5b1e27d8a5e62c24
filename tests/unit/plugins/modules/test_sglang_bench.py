"""The sglang_bench module's thin layer: options, failure policy, check mode, no secrets in the result."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.module_utils import bench_levels
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

    def run(settings, client_factory, budget_s=None):
        seen["settings"] = settings
        seen["client"] = client_factory()
        return dict(seen.get("result") or canned_result())

    monkeypatch.setattr(bench_levels, "run_benchmark", run)
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
    monkeypatch.setattr(bench_levels, "engine_times", lambda run, unit, **_kw: dict(next(readings), unit=unit))
    monkeypatch.setattr(bench_levels, "journal_tail", lambda run, unit: [f"{unit}: Killed"])
    result = run_module(capsys, sglang_bench, {"unit": "sglang.service", "stop_on_failure": True})
    assert fake_run["settings"].stop_on_failure is True
    assert result["engine"] == {"main_pid": 10, "forked_at": 1.0, "unit": "sglang.service"}
    assert result["engine_restarted"] is True
    assert result["journal_tail"] == ["sglang.service: Killed"]
    plain = run_module(capsys, sglang_bench, {})
    assert "engine" not in plain and "journal_tail" not in plain


LEVELS = [{"concurrency": 1, "num_prompts": 4, "budget_s": 60}, {"concurrency": 8, "budget_s": 90}, {"concurrency": 32}]


def test_levels_in_one_call_keep_each_level_in_the_progress_file(capsys, fake_run, tmp_path):
    path = tmp_path / "bench" / "r1" / "steps002.json"
    args = {"levels": LEVELS, "num_prompts": 8, "repeats": 2, "warmup_requests": 2, "api_key": "s3cret",
            "progress_path": str(path), "progress_context": {"run_id": "r1", "point": {"id": "steps002"}}}  # fmt: skip
    result = run_module(capsys, sglang_bench, args)
    assert result["changed"] is True
    assert [level["concurrency"] for level in result["levels"]] == [1, 8, 32]
    assert [(level["budget_s"], level["out_of_budget"]) for level in result["levels"]] == [
        (60.0, False), (90.0, False), (None, False)
    ]  # fmt: skip
    assert result["levels_not_run"] == []
    last = fake_run["settings"]  # the last level's: its own concurrency, the call's num_prompts, no warm-up
    assert (last.concurrency, last.num_prompts, last.warmup_requests, last.repeats) == (32, 8, 0, 2)
    assert result["msg"].startswith(
        "sglang_bench: 3 of 3 level(s) run; 8/16 requests completed in 2.00 s at concurrency 1"
    )
    written = json.loads(path.read_text())
    assert written["context"] == {"run_id": "r1", "point": {"id": "steps002"}}
    assert written["planned"] == [1, 8, 32] and written["finished"] is True
    assert [level["concurrency"] for level in written["levels"]] == [1, 8, 32]
    assert "s3cret" not in path.read_text() and "s3cret" not in json.dumps(result)
    check = run_module(
        capsys, sglang_bench, dict(args, progress_path=str(tmp_path / "dry.json"), _ansible_check_mode=True)
    )
    assert check["changed"] is True  # it would write the file
    assert not (tmp_path / "dry.json").exists()


def test_a_failed_level_fails_the_call_unless_told_otherwise(capsys, fake_run, monkeypatch):
    answers = iter([canned_result(), canned_result(failed_requests=2)])
    monkeypatch.setattr(bench_levels, "run_benchmark", lambda settings, factory, budget_s=None: next(answers))
    failed = run_module(capsys, sglang_bench, {"levels": LEVELS, "stop_on_failure": True})
    assert failed["failed"] is True
    assert failed["msg"].endswith("2 failed at concurrency 8 (first error: /generate returned HTTP 503)")
    assert "not run after a failed level: concurrency 32" in failed["msg"]
    assert failed["levels_not_run"] == [32]
    answers = iter([canned_result(), canned_result(failed_requests=2)])
    recorded = run_module(capsys, sglang_bench, {"levels": LEVELS, "stop_on_failure": True, "fail_on_errors": False})
    assert "failed" not in recorded
    assert [level["failed_requests"] for level in recorded["levels"]] == [0, 2]
    assert recorded["changed"] is False  # no progress file


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"levels": LEVELS, "concurrency": 4}, "parameters are mutually exclusive: concurrency|levels"),
        ({"progress_path": "/tmp/p.json"}, "missing parameter(s) required by 'progress_path': levels"),
        (
            {"levels": [{"concurrency": 1, "waves": 3}]},
            "levels.waves. Supported parameters include: budget_s, concurrency, num_prompts",
        ),
        ({"levels": [{"num_prompts": 3}]}, "missing required arguments: concurrency found in levels"),
        ({"levels": [{"concurrency": 8}, {"concurrency": 8}]}, "levels[1].concurrency: 8 is listed twice"),
        ({"levels": [{"concurrency": 8, "budget_s": -1}]}, "levels[0].budget_s: must be a number of seconds > 0"),
        ({"levels": LEVELS, "progress_path": "bench/p.json"}, "progress_path: must be the absolute path of a file"),
    ],
)
def test_bad_levels_or_progress_options_are_refused_before_any_request(capsys, fake_run, args, message):
    result = run_module(capsys, sglang_bench, args)
    assert result["failed"] is True
    assert message in result["msg"]
    assert "settings" not in fake_run


def test_a_progress_file_that_cannot_be_written_is_refused_before_any_request(capsys, fake_run, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_module(capsys, sglang_bench, {"levels": LEVELS, "progress_path": str(blocker / "p.json")})
    assert result["failed"] is True and result["option"] == "progress_path"
    assert result["msg"].startswith(f"progress_path: cannot write {blocker / 'p.json'}: ")
    assert "settings" not in fake_run
