"""Point records, robust statistics, the choice of the best point, and the Markdown and CSV reports."""

from __future__ import annotations

import csv
import io

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_report import (
    build_record,
    choose_best,
    csv_text,
    failure_reason,
    mad,
    markdown,
    median,
    summarize,
    telling_journal_line,
    timing,
)

OOM_JOURNAL = [
    "Nov 29 16:25:00 lab1 sglang-sweep[812]: [2025-11-29 16:25:00 TP0] Scheduler hit an exception: Traceback",
    "Nov 29 16:25:00 lab1 sglang-sweep[812]: RuntimeError: Capture cuda graph failed: CUDA out of memory. "
    "Tried to allocate 12.72 GiB.",
    "Nov 29 16:25:01 lab1 systemd[1]: sglang-sweep.service: Main process exited, code=killed, status=9/KILL",
]


def point(steps: int, topk: int = 1, draft: int | None = None) -> dict:
    draft = steps + 1 if draft is None else draft
    return {
        "id": f"steps{steps:03d}-topk{topk:02d}-draft{draft:03d}",
        "steps": steps,
        "topk": topk,
        "draft_tokens": draft,
    }


def bench(*throughputs, failed=0, accept=2.0) -> dict:
    errors = [{"error": "HTTP 503", "count": failed}] if failed else []
    runs = [
        {"completed": 8 - failed, "failed_requests": failed, "output_throughput": value, "accept_length": accept,
         "median_ttft_ms": 12.0, "median_itl_ms": 1.5, "errors": errors}
        for value in throughputs
    ]  # fmt: skip
    return {"changed": False, "runs": runs, "elapsed_s": 3.5, "warmup": {"requests": 1, "failed_requests": 0}}


def measured(steps: int, *throughputs, host="h1", accept=2.0) -> dict:
    return build_record(
        point(steps), host, "run1", 100.0 + steps, 110.0 + steps, 4.0, gate={"healthy": True},
        benchmark=bench(*throughputs, accept=accept),
    )  # fmt: skip


def test_median_and_mad():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([]) is None
    assert mad([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.0
    assert mad([7.0]) == 0.0


def test_the_journal_explains_a_failed_load():
    line = telling_journal_line(OOM_JOURNAL)
    assert line.startswith("RuntimeError: Capture cuda graph failed: CUDA out of memory.")
    reason = failure_reason("unit restarting: MainPID 1770 -> 0", OOM_JOURNAL)
    assert reason == f"unit restarting: MainPID 1770 -> 0; journal: {line}"
    assert failure_reason("gate failed", ["nothing to see"]) == "gate failed"
    assert failure_reason(None, []) == "failed"


def test_a_point_whose_gate_failed_is_recorded_with_the_reason_and_the_journal():
    gate = {"healthy": False, "failed_tier": "unit", "reason": "unit failed", "journal": OOM_JOURNAL, "elapsed_s": 9.1}
    record = build_record(point(9), "h1", "run1", 1.0, 2.0, 9.5, gate=gate)
    assert record["status"] == "failed"
    assert record["reason"].startswith("load or gate failed (tier unit): unit failed; journal: RuntimeError:")
    assert "out of memory" in record["reason"]
    assert record["journal_tail"] == OOM_JOURNAL
    assert record["repeats"] == []
    assert record["gate"]["elapsed_s"] == 9.1


def test_a_task_failure_or_failed_requests_fail_the_point():
    error = build_record(point(2), "h1", "r", 1.0, 2.0, None, error="Write the drop-in: disk full", journal=[])
    assert (error["status"], error["reason"]) == ("failed", "Write the drop-in: disk full")
    partial = build_record(point(2), "h1", "r", 1.0, 2.0, 3.0, gate={"healthy": True}, benchmark=bench(10.0, failed=2))
    assert partial["status"] == "failed"
    assert partial["reason"] == "benchmark run 1: 2 of 8 requests failed: HTTP 503"
    crashed = build_record(
        point(2), "h1", "r", 1.0, 2.0, 3.0, gate={"healthy": True}, benchmark={"failed": True, "msg": "boom"}
    )
    assert crashed["reason"] == "benchmark failed: boom"
    skipped = build_record(point(2), "h1", "r", 1.0, 2.0, 3.0, gate={"healthy": True}, benchmark=None)
    assert skipped["reason"] == "no benchmark ran"
    warm = bench(10.0)
    warm["warmup"] = {"requests": 2, "failed_requests": 2, "errors": [{"error": "timeout", "count": 2}]}
    cold = build_record(point(2), "h1", "r", 1.0, 2.0, 3.0, gate={"healthy": True}, benchmark=warm)
    assert cold["reason"] == "warm-up: 2 of 2 requests failed: timeout"


def test_a_measured_point_keeps_every_run():
    record = measured(3, 100.0, 104.0, 90.0)
    assert record["status"] == "measured"
    assert record["reason"] is None
    assert [run["output_throughput"] for run in record["repeats"]] == [100.0, 104.0, 90.0]
    assert record["bench_s"] == 3.5
    assert record["load_s"] == 4.0


def test_summary_uses_median_and_mad_and_scores_with_the_penalty():
    row = summarize(measured(3, 100.0, 104.0, 90.0), mad_penalty=1.0)
    assert row["output_throughput_median"] == 100.0
    assert row["output_throughput_mad"] == 4.0
    assert row["score"] == 96.0
    assert row["accept_length_median"] == 2.0
    failed = summarize(build_record(point(9), "h1", "r", 1.0, 2.0, 3.0, gate={"healthy": False}), 1.0)
    assert failed["score"] is None
    assert failed["output_throughput_median"] is None


def test_the_best_is_the_top_score_but_fewer_steps_win_within_tolerance():
    rows = [
        summarize(measured(3, 196.0, 197.0, 198.0), 1.0),  # score 196
        summarize(measured(4, 199.0, 200.0, 201.0), 1.0),  # score 199
        summarize(measured(5, 150.0, 200.5, 250.0), 1.0),  # noisy: score 150
    ]
    assert choose_best(rows, tolerance=0.0)["steps"] == 4
    assert choose_best(rows, tolerance=0.02)["steps"] == 3  # 196 is within 2 % of 199
    assert choose_best(rows, tolerance=0.02) is not None
    assert choose_best([summarize(build_record(point(2), "h", "r", 1.0, 2.0, 1.0), 1.0)], 0.02) is None


def test_timing_covers_only_this_runs_points():
    records = [measured(1, 10.0), measured(2, 10.0)]
    records.append(dict(measured(3, 10.0), run_id="earlier"))
    result = timing(records, {"run_id": "run1", "started_at": 90.0, "hosts": ["h1"]}, reported_at=130.0)
    assert result["points_run"] == 2
    assert result["sweep_wall_s"] == pytest.approx(112.0 - 101.0)
    assert result["load_bench_sum_s"] == pytest.approx(2 * (4.0 + 3.5))
    assert result["overhead_ratio"] == pytest.approx(11.0 / 15.0)
    assert result["run_wall_s"] == 40.0


def test_markdown_marks_the_best_and_lists_failed_points_with_reasons():
    gate = {"healthy": False, "failed_tier": "unit", "reason": "unit failed", "journal": OOM_JOURNAL}
    records = [measured(1, 100.0), measured(2, 120.0), build_record(point(9), "h2", "r", 1.0, 2.0, 3.0, gate=gate)]
    rows = [summarize(record, 1.0) for record in records]
    best = choose_best(rows, 0.02)
    definition = {"algorithm": "EAGLE", "repeats": 1, "warmup_requests": 1, "bench": {}, "mad_penalty": 1.0}
    text = markdown(rows, best, definition, {"sweep_wall_s": 30.0, "load_bench_sum_s": 25.0, "overhead_ratio": 1.2,
                                             "points_run": 3, "hosts": ["h1", "h2"]})  # fmt: skip
    table = [line for line in text.splitlines() if line.startswith("| 2 |")]
    assert len(table) == 1
    assert table[0].endswith("**best** |")
    assert "- steps 9, top-k 1, draft tokens 10 (h2): load or gate failed (tier unit): unit failed; journal: " in text
    assert "ratio 1.20" in text


def test_csv_has_one_row_per_raw_run_and_one_per_failed_point():
    records = [measured(1, 100.0, 101.0), build_record(point(9), "h1", "r", 1.0, 2.0, 3.0, gate={"healthy": False})]
    rows = list(csv.DictReader(io.StringIO(csv_text(records))))
    assert len(rows) == 3
    assert [row["repeat"] for row in rows] == ["1", "2", ""]
    assert rows[1]["output_throughput"] == "101.0"
    assert rows[2]["status"] == "failed"
    assert rows[2]["reason"].startswith("load or gate failed")


def test_a_point_loaded_twice_keeps_why_its_first_load_failed():
    retried = build_record(
        point(2), "h1", "r", 1.0, 2.0, 9.0, gate={"healthy": True}, benchmark=bench(100.0),
        first_failure="unit: unit restarting: NRestarts 0 -> 1",
    )  # fmt: skip
    assert retried["status"] == "measured"
    assert retried["first_failure"] == "unit: unit restarting: NRestarts 0 -> 1"
    row = summarize(retried, 1.0)
    text = markdown([row], row, {"bench": {}}, {})
    assert "## Points loaded twice" in text
    assert "- steps 2, top-k 1: unit: unit restarting: NRestarts 0 -> 1" in text
