"""Level records, robust statistics, the choices (best per level, robust, SLA, Pareto), timing and the reports."""

from __future__ import annotations

import csv
import io

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_choice import (
    applied_choice,
    best_per_level,
    choose_best,
    pareto,
    robust_choice,
    sla_choice,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import (
    LevelOutcome,
    LevelRun,
    build_load,
    failure_reason,
    mad,
    median,
    summarize,
    telling_journal_line,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import build_level_record as level_record
from ansible_collections.llmops.inference.plugins.module_utils.sweep_render import csv_text, markdown, rules
from ansible_collections.llmops.inference.plugins.module_utils.sweep_timing import timing

OOM_JOURNAL = [
    "Nov 29 16:25:00 lab1 sglang-sweep[812]: [2025-11-29 16:25:00 TP0] Scheduler hit an exception: Traceback",
    "Nov 29 16:25:00 lab1 sglang-sweep[812]: RuntimeError: Capture cuda graph failed: CUDA out of memory. "
    "Tried to allocate 12.72 GiB.",
    "Nov 29 16:25:01 lab1 systemd[1]: sglang-sweep.service: Main process exited, code=killed, status=9/KILL",
]
# The restart chain's result (sglang_restart), as sglang_service_gate holds it: nested.
GATE = {"healthy": True, "service": {"main_pid": 700}}
ENGINE = {"main_pid": 700, "forked_at": 1000.0, "ready_at": 1030.0, "fork_to_ready_s": 30.0}


def build_level_record(point, concurrency, host, run_id, started_at, finished_at, load, **outcome) -> dict:
    """One level record, from the arguments of the sweep's record action."""
    return level_record(
        LevelRun(point, concurrency, host, run_id, started_at, finished_at, load), LevelOutcome(**outcome)
    )


def point(steps: int, topk: int = 1, draft: int | None = None) -> dict:
    draft = steps + 1 if draft is None else draft
    return {"id": f"steps{steps:03d}-topk{topk:02d}-draft{draft:03d}", "steps": steps, "topk": topk,
            "draft_tokens": draft}  # fmt: skip


def bench(*throughputs, failed=0, accept=2.0, tpot=10.0, engine=None, started=2000.0) -> dict:
    errors = [{"error": "HTTP 503", "count": failed}] if failed else []
    runs = [
        {"completed": 8 - failed, "failed_requests": failed, "output_throughput": value, "accept_length": accept,
         "output_throughput_per_user": value / 8, "median_ttft_ms": 12.0, "median_itl_ms": 1.5,
         "p99_tpot_ms": tpot, "p99_ttft_ms": 40.0, "errors": errors, "started_at": started + 10 * index,
         "ended_at": started + 10 * index + 8}
        for index, value in enumerate(throughputs)
    ]  # fmt: skip
    return {"runs": runs, "repeats": len(runs), "elapsed_s": 3.5, "num_prompts": 8,
            "warmup": {"requests": 1, "failed_requests": 0}, "engine": dict(engine or ENGINE)}  # fmt: skip


def load(started=100.0, load_s=4.0) -> dict:
    return build_load(started, load_s, GATE, apply_s=0.5)


def level(steps, concurrency, *throughputs, host="h1", run_id="run1", tpot=10.0, started=None, engine=None) -> dict:
    started = 100.0 + steps * 100 if started is None else started
    gate = dict(GATE, service={"main_pid": (engine or ENGINE)["main_pid"]})
    return build_level_record(
        point(steps), concurrency, host, run_id, started + concurrency, started + concurrency + 5, load(started),
        gate=gate, benchmark=bench(*throughputs, tpot=tpot, engine=engine),
    )  # fmt: skip


def row(steps, concurrency, *throughputs, **kwargs) -> dict:
    return summarize(level(steps, concurrency, *throughputs, **kwargs), mad_penalty=1.0, gpus_per_engine=2)


def failed_row(steps, concurrency, stage="benchmark") -> dict:
    if stage == "not run":
        record = build_level_record(point(steps), concurrency, "h1", "run1", 1.0, 2.0, load(), gate=GATE,
                                    not_run="not run: the point failed at concurrency 8")  # fmt: skip
    else:
        record = build_level_record(point(steps), concurrency, "h1", "run1", 1.0, 2.0, load(), gate=GATE,
                                    benchmark=bench(1.0, failed=8))  # fmt: skip
    return summarize(record, 1.0)


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


def test_a_level_whose_load_failed_is_recorded_with_the_reason_and_the_journal():
    steps = [{"name": "gate", "attempt": 1, "status": "failed", "detail": "unit tier: unit failed", "elapsed_s": 8.2}]
    gate = {"healthy": False, "gate": {"failed_tier": "unit", "reason": "unit failed"},
            "service": {"journal": OOM_JOURNAL}, "elapsed_s": 9.1, "steps": steps}  # fmt: skip
    record = build_level_record(point(9), 8, "h1", "run1", 1.0, 2.0, build_load(1.0, 9.5, gate), gate=gate)
    assert (record["status"], record["stage"], record["concurrency"]) == ("failed", "load", 8)
    assert record["reason"].startswith("load or gate failed (tier unit): unit failed; journal: RuntimeError:")
    assert record["journal_tail"] == OOM_JOURNAL
    assert record["repeats"] == []
    assert record["load"]["gate"]["elapsed_s"] == 9.1
    assert record["load"]["gate"]["steps"] == steps  # where the chain's time went


def test_a_task_failure_failed_requests_or_another_engine_fail_the_level():
    error = build_level_record(point(2), 1, "h1", "r", 1.0, 2.0, load(), error="Write the drop-in: disk full")
    assert (error["status"], error["stage"], error["reason"]) == ("failed", "load", "Write the drop-in: disk full")
    partial = build_level_record(point(2), 8, "h1", "r", 1.0, 2.0, load(), gate=GATE, benchmark=bench(10.0, failed=2))
    assert (partial["status"], partial["stage"]) == ("failed", "benchmark")
    assert partial["reason"] == "benchmark run 1: 2 of 8 requests failed: HTTP 503"
    crashed = build_level_record(point(2), 8, "h1", "r", 1.0, 2.0, load(), gate=GATE,
                                 benchmark={"failed": True, "msg": "The task timed out"})  # fmt: skip
    assert crashed["reason"] == "benchmark failed: The task timed out"
    restarted = bench(10.0, engine=dict(ENGINE, main_pid=812))
    other = build_level_record(point(2), 32, "h1", "r", 1.0, 2.0, load(), gate=GATE, benchmark=restarted)
    assert other["status"] == "failed"
    assert "main PID 700 passed the gate, 812 ran now" in other["reason"]
    during = dict(bench(10.0), engine_restarted=True)
    assert "restarted during the benchmark" in build_level_record(point(2), 1, "h", "r", 1, 2, load(), gate=GATE,
                                                                  benchmark=during)["reason"]  # fmt: skip
    warm = bench(10.0)
    warm["warmup"] = {"requests": 2, "failed_requests": 2, "errors": [{"error": "timeout", "count": 2}]}
    cold = build_level_record(point(2), 1, "h1", "r", 1.0, 2.0, load(), gate=GATE, benchmark=warm)
    assert cold["reason"] == "warm-up: 2 of 2 requests failed: timeout"
    not_run = build_level_record(point(2), 32, "h1", "r", 1.0, 2.0, load(), gate=GATE, not_run="not run: because")
    assert (not_run["status"], not_run["stage"], not_run["reason"]) == ("failed", "not run", "not run: because")


def test_a_measured_level_keeps_every_run_and_its_timestamps():
    record = level(3, 8, 100.0, 104.0, 90.0)
    assert record["status"] == "measured" and record["reason"] is None
    assert [run["output_throughput"] for run in record["repeats"]] == [100.0, 104.0, 90.0]
    assert (record["bench"]["requests_started_at"], record["bench"]["requests_ended_at"]) == (2000.0, 2028.0)
    assert record["bench"]["engine"]["fork_to_ready_s"] == 30.0
    assert (record["load"]["load_s"], record["load"]["started_at"], record["bench"]["elapsed_s"]) == (4.0, 400.0, 3.5)


def test_summary_uses_median_and_mad_per_gpu_and_the_worst_run_for_latencies():
    summary = summarize(level(3, 8, 100.0, 104.0, 90.0, tpot=12.0), mad_penalty=1.0, gpus_per_engine=2)
    assert (summary["output_throughput_median"], summary["output_throughput_mad"], summary["score"]) == (100, 4, 96)
    assert summary["output_throughput_per_gpu_median"] == 50.0
    assert summary["output_throughput_per_user_median"] == 12.5
    assert summary["worst"]["p99_tpot_ms"] == 12.0
    assert summary["fork_to_ready_s"] == 30.0
    failed = failed_row(9, 8)
    assert failed["score"] is None and failed["output_throughput_median"] is None and failed["worst"] == {}


def test_the_best_is_the_top_score_but_fewer_steps_win_within_tolerance():
    rows = [row(3, 8, 196.0, 197.0, 198.0), row(4, 8, 199.0, 200.0, 201.0), row(5, 8, 150.0, 200.5, 250.0)]
    assert choose_best(rows, tolerance=0.0)["steps"] == 4
    assert choose_best(rows, tolerance=0.02)["steps"] == 3  # 196 is within 2 % of 199
    assert choose_best([failed_row(2, 8)], 0.02) is None


def test_best_per_level_with_its_margin_over_the_runner_up_and_the_spread():
    rows = [
        row(2, 1, 100.0, 101.0, 102.0), row(4, 1, 130.0, 131.0, 140.0),  # c=1: steps 4 by a clear margin
        row(2, 32, 500.0, 502.0, 504.0), row(4, 32, 497.0, 500.0, 510.0),  # c=32: within the noise
        failed_row(6, 32),
    ]  # fmt: skip
    levels = best_per_level(rows, [1, 32], tolerance=0.0)
    one, heavy = levels
    assert (one["best"]["steps"], one["runner_up"]["steps"]) == (4, 2)
    assert one["margin_tok_s"] == 30.0 and one["margin_pct"] == pytest.approx(100 * 30 / 101)
    assert (one["best"]["output_throughput_mad"], one["runner_up"]["output_throughput_mad"]) == (1.0, 1.0)
    assert one["clear"] is True
    assert one["spread_source"] == "repeat runs: MAD of output tok/s over 3 runs"
    assert (heavy["best"]["steps"], heavy["runner_up"]["steps"]) == (2, 4)  # score 500 vs 497
    assert heavy["margin_tok_s"] == 2.0 and heavy["clear"] is False
    assert heavy["measured_points"] == 2
    single = best_per_level([row(2, 8, 10.0), row(3, 8, 9.0)], [8], 0.0)[0]
    assert single["clear"] is None and single["spread_source"].startswith("none: one run per level")
    alone = best_per_level([row(2, 8, 10.0, 11.0)], [8, 16], 0.0)
    assert alone[0]["runner_up"] is None and alone[0]["margin_tok_s"] is None
    assert alone[1]["best"] is None


def test_ties_go_to_the_fewest_steps_then_the_lowest_top_k():
    tied = [summarize(level(3, 8, 100.0), 1.0), summarize(level(2, 8, 100.0), 1.0)]
    assert choose_best(tied, 0.0)["steps"] == 2
    wide = build_level_record(
        point(2, topk=4, draft=8), 8, "h1", "run1", 1, 2, load(), gate=GATE, benchmark=bench(100.0)
    )
    assert choose_best([summarize(wide, 1.0), tied[1]], 0.0)["topk"] == 1
    robust = robust_choice(tied, [8], 0.0)
    assert robust["point"]["steps"] == 2


def test_the_robust_choice_has_the_best_worst_case_across_levels():
    rows = [
        row(2, 1, 100.0), row(2, 32, 500.0),  # ratios 100/130, 500/500 -> worst 0.77
        row(4, 1, 130.0), row(4, 32, 420.0),  # ratios 1.0, 0.84 -> worst 0.84
        row(6, 1, 125.0), failed_row(6, 32),  # failed at 32 -> worst 0
    ]  # fmt: skip
    robust = robust_choice(rows, [1, 32], tolerance=0.02)
    chosen = robust["point"]
    assert chosen["steps"] == 4
    assert chosen["worst_ratio"] == pytest.approx(420 / 500)
    assert chosen["worst_at"] == {"concurrency": 32, "host": "h1"}
    assert chosen["ratios"] == {"1": 1.0, "32": pytest.approx(0.84)}
    by_steps = {candidate["steps"]: candidate for candidate in robust["candidates"]}
    assert by_steps[6]["worst_ratio"] == 0.0 and by_steps[6]["worst_at"]["concurrency"] == 32
    assert robust_choice([failed_row(2, 1)], [1], 0.0)["point"] is None


def test_the_sla_choice_is_the_best_throughput_at_the_heaviest_level_within_the_slo():
    rows = [
        row(2, 1, 100.0, tpot=5.0), row(2, 8, 300.0, tpot=9.0), row(2, 32, 500.0, tpot=25.0),
        row(4, 1, 130.0, tpot=4.0), row(4, 8, 320.0, tpot=8.0), row(4, 32, 450.0, tpot=31.0),
        row(6, 1, 125.0, tpot=50.0), row(6, 8, 900.0, tpot=9.0),  # misses the bound at the lightest level
    ]  # fmt: skip
    sla = sla_choice(rows, [1, 8, 32], {"p99_tpot_ms": 30.0}, tolerance=0.0)
    assert sla["point"]["steps"] == 2
    assert (sla["point"]["heaviest_concurrency"], sla["point"]["output_throughput_median"]) == (32, 500.0)
    by_steps = {candidate["steps"]: candidate for candidate in sla["candidates"]}
    assert (by_steps[4]["heaviest_concurrency"], by_steps[4]["output_throughput_median"]) == (8, 320.0)
    assert by_steps[6]["heaviest_concurrency"] is None
    strict = sla_choice(rows, [1, 8, 32], {"p99_tpot_ms": 1.0}, 0.0)
    assert strict["point"] is None and strict["reason"].startswith("no point meets")
    assert sla_choice(rows, [1], {}, 0.0) is None
    failing = sla_choice([failed_row(2, 1), row(2, 8, 10.0)], [1, 8], {"p99_tpot_ms": 30.0}, 0.0)
    assert failing["point"] is None  # a level it failed at ends what it survives


def test_sweep_apply_best_takes_the_sla_choice_when_an_slo_is_set():
    rows = [row(2, 1, 100.0, tpot=5.0), row(4, 1, 130.0, tpot=40.0)]
    robust = robust_choice(rows, [1], 0.0)
    assert applied_choice(robust, None) == {"rule": "robust", "point": robust["point"], "reason": None}
    sla = sla_choice(rows, [1], {"p99_tpot_ms": 30.0}, 0.0)
    assert applied_choice(robust, sla)["point"]["steps"] == 2
    assert robust["point"]["steps"] == 4


def test_the_pareto_frontier_keeps_only_undominated_points_and_loads():
    rows = [
        row(2, 1, 80.0), row(4, 1, 120.0),  # per user 10 and 15, per GPU 40 and 60
        row(2, 32, 800.0), row(4, 32, 640.0),  # per user 100 and 80 (per-user = tok/s / 8 in these fakes)
        failed_row(6, 32),
    ]  # fmt: skip
    entries = pareto(rows)
    assert len(entries) == 4
    frontier = {(entry["steps"], entry["concurrency"]) for entry in entries if entry["frontier"]}
    assert frontier == {(2, 32)}
    tied = pareto([row(2, 8, 100.0), row(3, 8, 100.0)])
    assert [entry["frontier"] for entry in tied] == [True, True]  # equal on both: neither dominates


def test_timing_counts_this_runs_loads_engine_time_and_engines_per_point():
    records = [level(1, 1, 10.0), level(1, 8, 10.0), level(2, 1, 10.0, engine=dict(ENGINE, main_pid=701))]
    records.append(dict(level(3, 1, 10.0), run_id="earlier"))
    result = timing(records, {"run_id": "run1", "started_at": 90.0, "hosts": ["h1"]}, reported_at=400.0)
    assert (result["points_run"], result["levels_run"], result["loads"]) == (2, 3, 2)
    # from the first load's start (point 1 at 200) to the last record's end (point 2 at 300 + 1 + 5)
    assert result["sweep_wall_s"] == pytest.approx(306.0 - 200.0)
    assert result["engine_time_s"] == pytest.approx(2 * 30.0 + 3 * 3.5)
    assert result["engine_ratio"] == pytest.approx(106.0 / 70.5)
    assert result["load_bench_sum_s"] == pytest.approx(2 * 4.0 + 3 * 3.5)
    assert result["engine_loads"] == 2 and result["loads_per_point"] == 1.0
    assert result["per_host"]["h1"]["loads"] == 2
    assert result["run_wall_s"] == 310.0
    reloaded = [level(1, 1, 10.0), level(1, 8, 10.0, engine=dict(ENGINE, main_pid=999, forked_at=1500.0))]
    assert timing(reloaded, {"run_id": "run1"}, 1.0)["loads_per_point"] == 2.0  # caught in the figure too


def test_markdown_states_every_rule_and_lists_failed_levels():
    gate = {"healthy": False, "gate": {"failed_tier": "unit", "reason": "unit failed"}}
    gate["service"] = {"journal": OOM_JOURNAL}
    records = [level(1, 1, 100.0), level(2, 1, 120.0), level(2, 8, 300.0)]
    records.append(build_level_record(point(9), 1, "h2", "run1", 1.0, 2.0, build_load(1, 3, gate), gate=gate))
    rows = [summarize(record, 1.0) for record in records]
    definition = {"algorithm": "EAGLE", "repeats": 1, "warmup_requests": 1, "bench": {"num_prompts": 8},
                  "mad_penalty": 1.0, "tolerance": 0.02, "slo": {"p99_tpot_ms": 30.0},
                  "levels": [{"concurrency": 1, "num_prompts": 8}, {"concurrency": 8, "num_prompts": 8}]}  # fmt: skip
    robust = robust_choice(rows, [1, 8], 0.02)
    sla = sla_choice(rows, [1, 8], definition["slo"], 0.02)
    report = {"best_per_level": best_per_level(rows, [1, 8], 0.02), "robust_choice": robust, "sla_choice": sla,
              "choice": applied_choice(robust, sla), "pareto": pareto(rows)}  # fmt: skip
    run_timing = timing(records, {"run_id": "run1", "hosts": ["h1", "h2"]}, 500.0)
    text = markdown(rows, report, definition, run_timing)
    for rule in rules(definition).values():
        assert rule in text
    assert "p99_tpot_ms <= 30" in text
    assert "| point | c=1 | c=8 | worst |" in text
    assert "| steps 2, top-k 1, draft tokens 3 | 1.000 | 1.000 | 1.000 |" in text
    assert "8 at concurrency 1, 8 at concurrency 8 requests per run" in text
    table = [line for line in text.splitlines() if line.startswith("| 2 | 1 | 3 | 8 |")]
    assert len(table) == 1 and table[0].endswith("**best** |")
    assert "- steps 9, top-k 1, draft tokens 10 at concurrency 1 (h2, load): load or gate failed (tier unit)" in text
    assert "Here: the sla choice, steps 2, top-k 1, draft tokens 3." in text


def test_csv_has_one_row_per_raw_run_and_one_per_failed_level():
    failed = build_level_record(point(9), 8, "h1", "r", 1.0, 2.0, load(), gate={"healthy": False})
    records = [level(1, 8, 100.0, 101.0), failed]
    rows = list(csv.DictReader(io.StringIO(csv_text(records))))
    assert len(rows) == 3
    assert [row["repeat"] for row in rows] == ["1", "2", ""]
    assert rows[1]["output_throughput"] == "101.0" and rows[1]["concurrency"] == "8"
    assert rows[1]["started_at"] == "2010.0" and rows[1]["fork_to_ready_s"] == "30.0"
    assert rows[2]["status"] == "failed"
    assert rows[2]["reason"].startswith("load or gate failed")


def test_a_point_loaded_twice_keeps_why_its_first_load_failed():
    retried = build_level_record(
        point(2), 1, "h1", "r", 1.0, 2.0, build_load(1.0, 9.0, GATE, first_failure="unit: NRestarts 0 -> 1"),
        gate=GATE, benchmark=bench(100.0),
    )  # fmt: skip
    assert retried["status"] == "measured"
    assert summarize(retried, 1.0)["first_failure"] == "unit: NRestarts 0 -> 1"
