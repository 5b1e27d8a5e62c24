# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sweep's point records, their statistics, the noise-aware choice of the best point, and the reports.

Private to the llmops.inference collection; not a public API. Pure functions, standard library only
(the optional plot is in sweep_plot.py).

Scoring: each measured point's output tok/s over its repeats gives a median and a MAD (median absolute
deviation from the median, unscaled). score = median - mad_penalty * MAD, so a point that is fast only
sometimes ranks below a steadily fast one. The top score wins, except that every point scoring within
``tolerance`` (a fraction) of it counts as just as good, and among those the one with the fewest steps
(then the lowest top-k, then the fewest draft tokens) is chosen: it uses the least draft memory and
compute for the same throughput.
"""

from __future__ import annotations

import csv
import io
import re

MEASURED = "measured"
FAILED = "failed"
# Python exception lines as they reach the journal ("...: torch.OutOfMemoryError: CUDA out of memory. ...").
EXCEPTION_LINE = re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception|Exit)\b:\s*\S")
JOURNAL_PREFIX = re.compile(r"^\w{3} [ \d]\d \d\d:\d\d:\d\d \S+ \S+?(\[\d+\])?: ")
CSV_METRICS = (
    "output_throughput",
    "request_throughput",
    "accept_length",
    "completed",
    "failed_requests",
    "duration",
    "total_output_tokens",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2e_latency_ms",
    "p99_e2e_latency_ms",
)


def median(values: list) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def mad(values: list) -> float | None:
    """Median absolute deviation from the median (unscaled); 0 for one value."""
    center = median(values)
    return None if center is None else median([abs(value - center) for value in values])


def telling_journal_line(journal: list) -> str | None:
    """The last exception line of a journal tail, without the journal's date/host/unit prefix."""
    for line in reversed(journal or []):
        if EXCEPTION_LINE.search(line):
            return JOURNAL_PREFIX.sub("", line).strip()
    return None


def failure_reason(reason: str | None, journal: list) -> str:
    """The gate's (or task's) one-line reason, plus the journal's own explanation when it has one."""
    reason = " ".join((reason or "failed").split())
    line = telling_journal_line(journal)
    if line and line not in reason:
        return f"{reason}; journal: {line}"
    return reason


def _bench_problem(benchmark: dict | None) -> str | None:
    """Why a point's benchmark does not count (None when it does): it failed, or any request failed."""
    if not benchmark or benchmark.get("skipped"):
        return "no benchmark ran"
    if benchmark.get("failed") is True or not isinstance(benchmark.get("runs"), list) or not benchmark["runs"]:
        return f"benchmark failed: {benchmark.get('msg') or 'no result'}"
    warmup = benchmark.get("warmup") or {}
    if warmup.get("failed_requests"):
        errors = warmup.get("errors") or [{"error": "unknown error"}]
        return f"warm-up: {warmup['failed_requests']} of {warmup.get('requests')} requests failed: {errors[0]['error']}"
    for index, run in enumerate(benchmark["runs"], start=1):
        if run.get("failed_requests") or not run.get("completed"):
            errors = run.get("errors") or [{"error": "no request completed"}]
            total = (run.get("completed") or 0) + (run.get("failed_requests") or 0)
            return (
                f"benchmark run {index}: {run.get('failed_requests')} of {total} requests failed: {errors[0]['error']}"
            )
    return None


def _run_metrics(run: dict) -> dict:
    return {key: run.get(key) for key in (*CSV_METRICS, "errors")}


def build_record(
    point: dict,
    host: str,
    run_id: str,
    started_at: float,
    finished_at: float,
    load_s: float | None,
    gate: dict | None = None,
    benchmark: dict | None = None,
    error: str | None = None,
    journal: list | None = None,
    apply_s: float | None = None,
    first_failure: str | None = None,
) -> dict:
    """One point's record: measured when its gate passed and every request of its benchmark completed.

    ``gate`` is the restart chain's verdict (the role's ``sglang_service_gate``), ``benchmark`` the point's
    sglang_bench result (its ``runs`` are the repeats), ``error`` a task failure caught by the sweep (then the
    point failed there), ``first_failure`` why a first load failed when the point was loaded a second time.
    """
    gate = gate or {}
    benchmark = benchmark if isinstance(benchmark, dict) else None
    journal = list(journal or gate.get("journal") or [])
    if error:
        status, reason = FAILED, failure_reason(error, journal)
    elif not gate.get("healthy"):
        stage = f"tier {gate.get('failed_tier')}" if gate.get("failed_tier") else (gate.get("failed_step") or "gate")
        status, reason = FAILED, failure_reason(f"load or gate failed ({stage}): {gate.get('reason')}", journal)
    else:
        problem = _bench_problem(benchmark)
        status, reason = (FAILED, problem) if problem else (MEASURED, None)
    runs = (benchmark or {}).get("runs")
    return {
        "point": point,
        "host": host,
        "run_id": run_id,
        "status": status,
        "reason": reason,
        "journal_tail": journal if status == FAILED else [],
        "started_at": started_at,
        "finished_at": finished_at,
        "apply_s": apply_s,
        "load_s": load_s,
        "bench_s": float((benchmark or {}).get("elapsed_s") or 0.0),
        "gate": {key: gate.get(key) for key in ("healthy", "failed_step", "failed_tier", "reason", "elapsed_s")},
        "first_failure": first_failure,
        "warmup": (benchmark or {}).get("warmup"),
        "repeats": [_run_metrics(run) for run in runs] if isinstance(runs, list) else [],
    }


def summarize(record: dict, mad_penalty: float) -> dict:
    """One row per point: medians and MAD over its repeats, and its score (None unless measured)."""
    point = record["point"]
    repeats = record.get("repeats") or []
    measured = record["status"] == MEASURED
    throughputs = [run["output_throughput"] for run in repeats if run.get("output_throughput") is not None]
    accepts = [run["accept_length"] for run in repeats if run.get("accept_length") is not None]
    center, spread = median(throughputs), mad(throughputs)
    row = {
        "id": point["id"],
        "steps": point["steps"],
        "topk": point["topk"],
        "draft_tokens": point["draft_tokens"],
        "host": record.get("host"),
        "status": record["status"],
        "reason": record.get("reason"),
        "repeats": len(repeats),
        "output_throughput_median": center if measured else None,
        "output_throughput_mad": spread if measured else None,
        "score": center - mad_penalty * spread if measured and center is not None else None,
        "accept_length_median": median(accepts) if measured else None,
        "median_ttft_ms": median([run["median_ttft_ms"] for run in repeats if run.get("median_ttft_ms") is not None]),
        "median_itl_ms": median([run["median_itl_ms"] for run in repeats if run.get("median_itl_ms") is not None]),
        "load_s": record.get("load_s"),
        "bench_s": record.get("bench_s"),
        "first_failure": record.get("first_failure"),
        "best": False,
    }
    return row


def choose_best(rows: list, tolerance: float) -> dict | None:
    """The best measured row (see the module docstring), or None when nothing was measured."""
    scored = [row for row in rows if row["score"] is not None]
    if not scored:
        return None
    top = max(row["score"] for row in scored)
    floor = top - abs(top) * tolerance
    candidates = [row for row in scored if row["score"] >= floor]
    return min(candidates, key=lambda row: (row["steps"], row["topk"], row["draft_tokens"], -row["score"]))


def timing(records: list, run: dict, reported_at: float) -> dict:
    """This run's wall times and its overhead ratio: sweep wall / sum of every point's load + benchmark time.

    The sweep wall time runs from the first of this run's points starting to the last one ending, over all
    hosts; ``run_wall_s`` also covers planning and the restore of the original configuration. ``apply_sum_s``
    is the part spent writing the points' drop-ins (outside load and benchmark, like recording each point).
    """
    mine = [record for record in records if record.get("run_id") == run.get("run_id")]
    result = {
        "run_id": run.get("run_id"),
        "hosts": run.get("hosts"),
        "points_run": len(mine),
        "run_started_at": run.get("started_at"),
        "reported_at": reported_at,
        "run_wall_s": reported_at - run["started_at"] if run.get("started_at") else None,
        "sweep_wall_s": None,
        "load_bench_sum_s": None,
        "apply_sum_s": None,
        "overhead_ratio": None,
    }
    if mine:
        wall = max(record["finished_at"] for record in mine) - min(record["started_at"] for record in mine)
        busy = sum((record.get("load_s") or 0.0) + (record.get("bench_s") or 0.0) for record in mine)
        result.update(
            sweep_wall_s=wall,
            load_bench_sum_s=busy,
            apply_sum_s=sum(record.get("apply_s") or 0.0 for record in mine),
            overhead_ratio=wall / busy if busy > 0 else None,
        )
    return result


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(rows: list, best: dict | None, definition: dict, run_timing: dict) -> str:
    """The report table (one line per point, the best marked) and the failed points with their reasons."""
    bench = definition.get("bench", {})
    lines = [
        f"# Speculative decoding sweep: {definition.get('algorithm')}",
        "",
        f"{definition.get('repeats')} benchmark run(s) per point after {definition.get('warmup_requests')} "
        f"warm-up request(s); each run {bench.get('num_prompts')} requests at concurrency "
        f"{bench.get('concurrency')}, {bench.get('max_new_tokens')} new tokens, prompt set "
        f"{bench.get('prompt_set')}. Score = median tok/s - {definition.get('mad_penalty')} x MAD; points "
        f"within {definition.get('tolerance', 0) * 100:g} % of the top score count as equal and the fewest steps "
        "wins.",
        "",
        "| steps | top-k | draft tokens | status | tok/s (median) | MAD | score | accept length | "
        "TTFT p50 (ms) | ITL p50 (ms) | load (s) | host | |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        mark = "**best**" if best is not None and row["id"] == best["id"] else ""
        lines.append(
            f"| {row['steps']} | {row['topk']} | {row['draft_tokens']} | {row['status']} | "
            f"{_fmt(row['output_throughput_median'])} | {_fmt(row['output_throughput_mad'])} | "
            f"{_fmt(row['score'])} | {_fmt(row['accept_length_median'], 2)} | {_fmt(row['median_ttft_ms'])} | "
            f"{_fmt(row['median_itl_ms'], 2)} | {_fmt(row['load_s'])} | {row['host'] or '-'} | {mark} |"
        )
    failed = [row for row in rows if row["status"] != MEASURED]
    lines += ["", "## Failed points", ""]
    if failed:
        lines += [
            f"- steps {row['steps']}, top-k {row['topk']}, draft tokens {row['draft_tokens']} ({row['host']}): "
            f"{row['reason']}"
            for row in failed
        ]
    else:
        lines.append("None.")
    retried = [row for row in rows if row.get("first_failure")]
    if retried:
        lines += ["", "## Points loaded twice", "", "Their first load failed; the second one counts.", ""]
        lines += [f"- steps {row['steps']}, top-k {row['topk']}: {row['first_failure']}" for row in retried]
    if run_timing.get("sweep_wall_s") is not None:
        lines += [
            "",
            "## Timing of this run",
            "",
            f"{run_timing['points_run']} point(s) on {len(run_timing.get('hosts') or [])} host(s): sweep wall time "
            f"{run_timing['sweep_wall_s']:.1f} s for {run_timing['load_bench_sum_s']:.1f} s of loads and benchmarks "
            f"(ratio {_fmt(run_timing['overhead_ratio'], 2)}; writing the drop-ins took "
            f"{_fmt(run_timing.get('apply_sum_s'))} s of the rest).",
        ]
    return "\n".join(lines) + "\n"


def csv_text(records: list) -> str:
    """Every raw benchmark run, one row each; a point without runs gets one row with its status and reason."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head = ["point_id", "steps", "topk", "draft_tokens", "host", "run_id", "status", "repeat"]
    writer.writerow([*head, *CSV_METRICS, "load_s", "bench_s", "reason"])
    for record in records:
        point = record["point"]
        head = [point["id"], point["steps"], point["topk"], point["draft_tokens"], record.get("host")]
        head += [record.get("run_id"), record["status"]]
        tail = [record.get("load_s"), record.get("bench_s"), record.get("reason") or ""]
        runs = record.get("repeats") or [None]
        for number, run in enumerate(runs, start=1):
            values = [run.get(name) for name in CSV_METRICS] if run else [None] * len(CSV_METRICS)
            writer.writerow([*head, number if run else "", *values, *tail])
    return out.getvalue()
