# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sweep's level records (one point measured at one load level) and their statistics.

Private to the llmops.inference collection; not a public API. Pure functions, standard library only. The choices
made from the rows are in sweep_choice.py, the reports in sweep_render.py.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, replace

from ansible_collections.llmops.inference.plugins.module_utils.restart.result import flat_view

MEASURED = "measured"
FAILED = "failed"
STAGE_LOAD = "load"
STAGE_BENCHMARK = "benchmark"
STAGE_NOT_RUN = "not run"
# Python exception lines as they reach the journal ("...: torch.OutOfMemoryError: CUDA out of memory. ...").
EXCEPTION_LINE = re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception|Exit)\b:\s*\S")
JOURNAL_PREFIX = re.compile(r"^\w{3} [ \d]\d \d\d:\d\d:\d\d \S+ \S+?(\[\d+\])?: ")
RUN_METRICS = (
    "output_throughput",
    "output_throughput_per_user",
    "request_throughput",
    "accept_length",
    "completed",
    "failed_requests",
    "duration",
    "total_output_tokens",
    *(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2e_latency") for stat in ("mean", "median", "p99")),
    "started_at",
    "ended_at",
)
SLO_METRIC_KEYS = tuple(
    f"{stat}_{name}_ms"
    for stat in ("mean", "median", "p90", "p95", "p99")
    for name in ("ttft", "tpot", "itl", "e2e_latency")
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


def _engine_problem(benchmark: dict, gate_pid) -> str | None:
    """Another engine process than the one the point's gate passed served the benchmark (it crashed or restarted)."""
    if benchmark.get("engine_restarted"):
        return "the engine restarted during the benchmark (another process served the unit at its end)"
    engine_pid = (benchmark.get("engine") or {}).get("main_pid")
    if gate_pid and engine_pid is not None and str(engine_pid) != str(gate_pid):
        return (
            f"the engine is not the one loaded for the point (main PID {gate_pid} passed the gate, "
            f"{engine_pid or 'none'} ran now): it crashed or was restarted after the gate"
        )
    return None


def _warmup_problem(benchmark: dict) -> str | None:
    warmup = benchmark.get("warmup") or {}
    if not warmup.get("failed_requests"):
        return None
    errors = warmup.get("errors") or [{"error": "unknown error"}]
    return f"warm-up: {warmup['failed_requests']} of {warmup.get('requests')} requests failed: {errors[0]['error']}"


def _runs_problem(benchmark: dict) -> str | None:
    """The benchmark failed, a request of a run failed, or it stopped before its repeats."""
    if benchmark.get("failed") is True or not isinstance(benchmark.get("runs"), list) or not benchmark["runs"]:
        return f"benchmark failed: {benchmark.get('msg') or 'no result'}"
    for index, run in enumerate(benchmark["runs"], start=1):
        if run.get("failed_requests") or not run.get("completed"):
            errors = run.get("errors") or [{"error": "no request completed"}]
            total = (run.get("completed") or 0) + (run.get("failed_requests") or 0)
            unsent = benchmark.get("unsent_requests") or 0
            stopped = f", then {unsent} request(s) not sent" if unsent else ""
            return (
                f"benchmark run {index}: {run.get('failed_requests')} of {total} requests failed: "
                f"{errors[0]['error']}{stopped}"
            )
    if len(benchmark["runs"]) < (benchmark.get("repeats") or 0):
        return f"benchmark stopped after {len(benchmark['runs'])} of {benchmark['repeats']} runs"
    return None


def _bench_problem(benchmark: dict | None, gate_pid=None) -> str | None:
    """Why a level's benchmark does not count (None when it does): it failed, any request failed, or another
    engine process than the one the point's gate passed served it (the engine crashed and was restarted)."""
    if not benchmark or benchmark.get("skipped"):
        return "no benchmark ran"
    return _engine_problem(benchmark, gate_pid) or _warmup_problem(benchmark) or _runs_problem(benchmark)


def _run_metrics(run: dict) -> dict:
    metrics = {key: run.get(key) for key in RUN_METRICS}
    metrics.update({key: run.get(key) for key in SLO_METRIC_KEYS})
    metrics["errors"] = run.get("errors")
    return metrics


def build_load(started_at: float, load_s: float | None, gate: dict | None, apply_s=None, **notes) -> dict:
    """The load a point's levels were measured on: the chain's timing, steps and verdict (``sglang_service_gate``);
    ``notes``: ``first_failure`` (why a first load failed) and ``lossless`` (sglang_reference's score)."""
    gate = flat_view(gate)
    return {
        "started_at": started_at,
        "apply_s": apply_s,
        "load_s": load_s,
        "gate": {
            key: gate.get(key)
            for key in ("healthy", "failed_step", "failed_tier", "reason", "elapsed_s", "main_pid", "steps")
        },
        "first_failure": notes.get("first_failure"),
        # The point's greedy outputs against the model's without speculation (sglang_reference): lossless true or
        # false, or null when not checked, with the detail.
        "lossless": notes.get("lossless"),
    }


@dataclass
class LevelRun:
    """Where and when one point ran at one load level, on which load of it (build_load)."""

    point: dict
    concurrency: int
    host: str
    run_id: str
    started_at: float
    finished_at: float
    load: dict


@dataclass
class LevelOutcome:
    """What came of one point at one load level: ``gate`` is the restart chain's verdict, ``benchmark`` the level's
    sglang_bench result (its ``runs`` are the repeats), ``error`` a task failure caught by the sweep, ``journal`` the
    engine's journal tail, ``not_run`` why the level was not measured (the point failed at a lighter level)."""

    gate: dict | None = None
    benchmark: dict | None = None
    error: str | None = None
    journal: list | None = None
    not_run: str | None = None


def _verdict(outcome: LevelOutcome, benchmark: dict | None, journal: list) -> tuple:
    """(status, stage, reason) of one level."""
    gate = flat_view(outcome.gate)
    if outcome.error:
        return FAILED, STAGE_LOAD if benchmark is None else STAGE_BENCHMARK, failure_reason(outcome.error, journal)
    if not gate.get("healthy"):
        where = f"tier {gate.get('failed_tier')}" if gate.get("failed_tier") else (gate.get("failed_step") or "gate")
        return FAILED, STAGE_LOAD, failure_reason(f"load or gate failed ({where}): {gate.get('reason')}", journal)
    if outcome.not_run:
        return FAILED, STAGE_NOT_RUN, outcome.not_run
    problem = _bench_problem(benchmark, gate.get("main_pid"))
    return (FAILED, STAGE_BENCHMARK, failure_reason(problem, journal)) if problem else (MEASURED, None, None)


def build_level_record(level: LevelRun, outcome: LevelOutcome) -> dict:
    """One point at one load level: measured when its gate passed and every request of its benchmark completed."""
    benchmark = outcome.benchmark if isinstance(outcome.benchmark, dict) else None
    journal = list(outcome.journal or flat_view(outcome.gate).get("journal") or [])
    status, stage, reason = _verdict(outcome, benchmark, journal)
    bench = benchmark or {}
    runs = bench.get("runs") if isinstance(bench.get("runs"), list) else []
    return {
        "point": level.point,
        "concurrency": level.concurrency,
        "host": level.host,
        "run_id": level.run_id,
        "status": status,
        "stage": stage,
        "reason": reason,
        "journal_tail": journal if status == FAILED and stage != STAGE_NOT_RUN else [],
        "started_at": level.started_at,
        "finished_at": level.finished_at,
        "load": level.load,
        "bench": {
            "elapsed_s": float(bench.get("elapsed_s") or 0.0),
            "num_prompts": bench.get("num_prompts"),
            "repeats": bench.get("repeats"),
            "requests_started_at": min((run["started_at"] for run in runs if run.get("started_at")), default=None),
            "requests_ended_at": max((run["ended_at"] for run in runs if run.get("ended_at")), default=None),
            "stopped_early": bench.get("stopped_early"),
            "unsent_requests": bench.get("unsent_requests"),
            "engine": bench.get("engine"),
            "engine_restarted": bench.get("engine_restarted"),
            "warmup": bench.get("warmup"),
        },
        "repeats": [_run_metrics(run) for run in runs],
    }


def stops_point(record: dict) -> str | None:
    """Why the point's heavier levels are recorded as not run once ``record`` failed; None when it did not fail
    (or was itself not run)."""
    if record["status"] == MEASURED or record["stage"] == STAGE_NOT_RUN:
        return None
    return f"not run: the point failed at concurrency {record['concurrency']} ({record['stage']}): {record['reason']}"


def progress_document(content) -> dict | None:
    """The progress file of a point's benchmark (sglang_bench's ``progress_path``), from its text or its base64 (as
    ansible.builtin.slurp returns it); None when it cannot be read."""
    if not isinstance(content, str) or not content.strip():
        return None
    try:
        text = base64.b64decode(content, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        text = content
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return document if isinstance(document, dict) and isinstance(document.get("levels"), list) else None


@dataclass
class PointBenchmark:
    """What one benchmark of all a point's levels left: ``benchmark`` is the sglang_bench task's result (its
    ``levels`` when it ended by itself; a failed or timed-out task's result otherwise), ``progress`` its progress
    file (progress_document), ``started_at`` / ``finished_at`` when the task began and when it was recorded."""

    benchmark: dict | None
    progress: dict | None
    started_at: float
    finished_at: float

    def ended(self) -> dict:
        """{concurrency: result} of the levels that ended: the task's own, else those in the progress file."""
        benchmark = self.benchmark or {}
        entries = benchmark["levels"] if isinstance(benchmark.get("levels"), list) else None
        if entries is None:
            entries = (self.progress or {}).get("levels") or []
        return {entry.get("concurrency"): entry for entry in entries if isinstance(entry, dict)}

    def unfinished(self, concurrency: int) -> tuple:
        """(benchmark, started_at) to record a level that has no result with: the task's failure (a timeout), and
        when the level began if the progress file says so."""
        benchmark = self.benchmark
        if isinstance((benchmark or {}).get("levels"), list):
            benchmark = {"failed": True, "msg": f"no result for concurrency {concurrency}: {benchmark.get('msg')}"}
        running = (self.progress or {}).get("running") or {}
        started = running.get("level_started_at") if running.get("concurrency") == concurrency else None
        return benchmark, started or self.started_at


def point_level_records(
    run: LevelRun, levels: list, gate: dict | None, bench: PointBenchmark, record_unfinished: bool = True
) -> list:
    """The records of a point's ``levels`` (in order) from its one benchmark: each level that ended with its own
    result and times (the host's clock), the first without a result as failed with the task's failure (with
    ``record_unfinished``; without it, that level and the later ones are left out: a resumed sweep measures them), and
    every level after a failed one as not run. ``run`` gives the point, host, run id and load of every level (its
    concurrency and times are each level's own)."""
    ended = bench.ended()
    records, stops = [], None
    for concurrency in levels:
        result = ended.get(concurrency)
        if stops:
            times, outcome = (bench.finished_at, bench.finished_at), LevelOutcome(gate=gate, not_run=stops)
        elif result is not None:
            times = (
                result.get("level_started_at") or bench.started_at,
                result.get("level_ended_at") or bench.finished_at,
            )
            outcome = LevelOutcome(gate=gate, benchmark=result, journal=result.get("journal_tail"))
        elif record_unfinished:
            benchmark, started = bench.unfinished(concurrency)
            times, outcome = (started, bench.finished_at), LevelOutcome(gate=gate, benchmark=benchmark)
        else:
            break
        level = replace(run, concurrency=int(concurrency), started_at=times[0], finished_at=times[1])
        records.append(build_level_record(level, outcome))
        stops = stops or stops_point(records[-1])
    return records


def _values(repeats: list, key: str) -> list:
    return [run[key] for run in repeats if run.get(key) is not None]


def summarize(record: dict, mad_penalty: float, gpus_per_engine: int = 1) -> dict:
    """One row per point and level: medians and MAD over its repeats, its score (None unless measured)."""
    point = record["point"]
    repeats = record.get("repeats") or []
    measured = record["status"] == MEASURED
    throughputs = _values(repeats, "output_throughput")
    center, spread = median(throughputs), mad(throughputs)
    engine = (record.get("bench") or {}).get("engine") or {}

    def med(key):
        return median(_values(repeats, key)) if measured else None

    worst = {}
    if measured:
        worst = {key: max(_values(repeats, key)) for key in SLO_METRIC_KEYS if _values(repeats, key)}
    return {
        "id": point["id"],
        "steps": point["steps"],
        "topk": point["topk"],
        "draft_tokens": point["draft_tokens"],
        "concurrency": record["concurrency"],
        "host": record.get("host"),
        "run_id": record.get("run_id"),
        "status": record["status"],
        "stage": record.get("stage"),
        "reason": record.get("reason"),
        "repeats": len(repeats),
        "output_throughput_median": center if measured else None,
        "output_throughput_mad": spread if measured else None,
        "score": center - mad_penalty * spread if measured and center is not None else None,
        "output_throughput_per_user_median": med("output_throughput_per_user"),
        "output_throughput_per_gpu_median": center / gpus_per_engine if measured and center is not None else None,
        "accept_length_median": med("accept_length"),
        "median_ttft_ms": med("median_ttft_ms"),
        "p99_ttft_ms": med("p99_ttft_ms"),
        "median_tpot_ms": med("median_tpot_ms"),
        "p99_tpot_ms": med("p99_tpot_ms"),
        "median_itl_ms": med("median_itl_ms"),
        # The worst repeat of each latency statistic, which the SLA choice checks.
        "worst": worst,
        "load_s": (record.get("load") or {}).get("load_s"),
        "fork_to_ready_s": engine.get("fork_to_ready_s"),
        "bench_s": (record.get("bench") or {}).get("elapsed_s"),
        "first_failure": (record.get("load") or {}).get("first_failure"),
        "lossless": lossless_of(record),
        "lossless_detail": ((record.get("load") or {}).get("lossless") or {}).get("detail"),
    }


def lossless_of(record: dict):
    """True, False (the point changed greedy output: never chosen), or None (not checked)."""
    return ((record.get("load") or {}).get("lossless") or {}).get("lossless")
