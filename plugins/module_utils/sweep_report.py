# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sweep's level records, their statistics, the choices made from them, and the reports.

Private to the llmops.inference collection; not a public API. Pure functions, standard library only
(the optional plots are in sweep_plot.py).

A record is one point measured at one load level (concurrency). The choices, each stated in the report:

- best per level: each measured record's output tok/s over its repeats gives a median and a MAD (median
  absolute deviation from the median, unscaled); score = median - mad_penalty * MAD. The top score wins,
  except that every point scoring within ``tolerance`` (a fraction) of it counts as just as good, and among
  those the one with the fewest steps (then the lowest top-k, then the fewest draft tokens) wins: it uses the
  least draft memory and compute for the same throughput. Its margin is its median minus the runner-up's (the
  next best score), with both MADs over the repeat runs as the spread; the margin is clear when it exceeds the
  sum of the two MADs.
- robust choice: per point, the worst over every load level of (its median tok/s at that level / the best
  median at that level); a level it failed at counts 0. The highest worst case wins (within ``tolerance``,
  fewest steps).
- SLA choice (with an SLO such as {p99_tpot_ms: 30}): a point survives a level when it was measured there and
  every bound holds in every repeat run; per point, the heaviest level it survives with every lighter level
  survived too, and its median tok/s there. The highest of those wins (within ``tolerance``, fewest steps).
- Pareto frontier: over every measured record, output tok/s per user against output tok/s per GPU; a record is
  on the frontier when no other one is at least as good on both and better on one.
"""

from __future__ import annotations

import csv
import io
import re

from ansible_collections.llmops.inference.plugins.module_utils.engine_times import same_engine

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
RULES = {
    "best_per_level": (
        "Per load level: score = median output tok/s over the repeat runs - {mad_penalty} x MAD; points within "
        "{tolerance_pct} % of the top score count as equal and the fewest steps (then top-k, then draft tokens) wins. "
        "Margin = the best point's median - the runner-up's (next best score); spread = the MAD of each over the "
        "repeat runs; the margin is clear when it exceeds the sum of both MADs."
    ),
    "robust": (
        "Robust choice: for each point, the worst over all load levels (each measured on the host that ran it) of "
        "its median output tok/s / the best median at that level, a failed level counting 0; the highest worst "
        "case wins, points within {tolerance_pct} % of it count as equal and the fewest steps wins."
    ),
    "sla": (
        "SLA choice ({slo}): a point survives a load level when it was measured there and every bound holds in "
        "every repeat run; each point is rated by its median output tok/s at the heaviest level it survives "
        "(every lighter level survived too); the highest wins, points within {tolerance_pct} % of it count as "
        "equal and the fewest steps wins."
    ),
    "pareto": (
        "Pareto frontier: every measured point and level as output tok/s per user (mean over requests of tokens / "
        "E2E latency) against output tok/s per GPU (the engine's output tok/s / {gpus} GPU(s)); on the frontier "
        "when no other is at least as good on both and better on one."
    ),
    "apply": (
        "sweep_apply: best applies the SLA choice when sweep_slo is set (the original configuration when no point "
        "meets it), else the robust choice."
    ),
}


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


def _bench_problem(benchmark: dict | None, gate_pid=None) -> str | None:
    """Why a level's benchmark does not count (None when it does): it failed, any request failed, or another
    engine process than the one the point's gate passed served it (the engine crashed and was restarted)."""
    if not benchmark or benchmark.get("skipped"):
        return "no benchmark ran"
    if benchmark.get("engine_restarted"):
        return "the engine restarted during the benchmark (another process served the unit at its end)"
    engine_pid = (benchmark.get("engine") or {}).get("main_pid")
    if gate_pid and engine_pid is not None and str(engine_pid) != str(gate_pid):
        return (
            f"the engine is not the one loaded for the point (main PID {gate_pid} passed the gate, "
            f"{engine_pid or 'none'} ran now): it crashed or was restarted after the gate"
        )
    warmup = benchmark.get("warmup") or {}
    if warmup.get("failed_requests"):
        errors = warmup.get("errors") or [{"error": "unknown error"}]
        return f"warm-up: {warmup['failed_requests']} of {warmup.get('requests')} requests failed: {errors[0]['error']}"
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


def _run_metrics(run: dict) -> dict:
    metrics = {key: run.get(key) for key in RUN_METRICS}
    metrics.update({key: run.get(key) for key in SLO_METRIC_KEYS})
    metrics["errors"] = run.get("errors")
    return metrics


def build_load(
    started_at: float,
    load_s: float | None,
    gate: dict | None,
    apply_s: float | None = None,
    first_failure: str | None = None,
) -> dict:
    """The load a point's levels were measured on: the chain's timing, steps and verdict (``sglang_service_gate``)."""
    gate = gate or {}
    return {
        "started_at": started_at,
        "apply_s": apply_s,
        "load_s": load_s,
        "gate": {
            key: gate.get(key)
            for key in ("healthy", "failed_step", "failed_tier", "reason", "elapsed_s", "main_pid", "steps")
        },
        "first_failure": first_failure,
    }


def build_level_record(
    point: dict,
    concurrency: int,
    host: str,
    run_id: str,
    started_at: float,
    finished_at: float,
    load: dict,
    gate: dict | None = None,
    benchmark: dict | None = None,
    error: str | None = None,
    journal: list | None = None,
    not_run: str | None = None,
) -> dict:
    """One point at one load level: measured when its gate passed and every request of its benchmark completed.

    ``gate`` is the restart chain's verdict, ``benchmark`` the level's sglang_bench result (its ``runs`` are the
    repeats), ``error`` a task failure caught by the sweep, ``not_run`` why the level was not measured (the point
    failed at a lighter level).
    """
    gate = gate or {}
    benchmark = benchmark if isinstance(benchmark, dict) else None
    journal = list(journal or gate.get("journal") or [])
    if error:
        status, stage = FAILED, STAGE_LOAD if benchmark is None else STAGE_BENCHMARK
        reason = failure_reason(error, journal)
    elif not gate.get("healthy"):
        where = f"tier {gate.get('failed_tier')}" if gate.get("failed_tier") else (gate.get("failed_step") or "gate")
        status, stage = FAILED, STAGE_LOAD
        reason = failure_reason(f"load or gate failed ({where}): {gate.get('reason')}", journal)
    elif not_run:
        status, stage, reason = FAILED, STAGE_NOT_RUN, not_run
    else:
        problem = _bench_problem(benchmark, gate.get("main_pid"))
        status, stage, reason = (FAILED, STAGE_BENCHMARK, problem) if problem else (MEASURED, None, None)
        if problem:
            reason = failure_reason(problem, journal)
    bench = benchmark or {}
    runs = bench.get("runs") if isinstance(bench.get("runs"), list) else []
    return {
        "point": point,
        "concurrency": concurrency,
        "host": host,
        "run_id": run_id,
        "status": status,
        "stage": stage,
        "reason": reason,
        "journal_tail": journal if status == FAILED and stage != STAGE_NOT_RUN else [],
        "started_at": started_at,
        "finished_at": finished_at,
        "load": load,
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
    }


def _shape(row: dict) -> tuple:
    return (row["steps"], row["topk"], row["draft_tokens"])


def _pick(candidates: list, value_key: str, tolerance: float):
    """The candidate within ``tolerance`` of the top ``value_key`` with the fewest steps (then top-k, draft)."""
    top = max(candidate[value_key] for candidate in candidates)
    floor = top - abs(top) * tolerance
    near = [candidate for candidate in candidates if candidate[value_key] >= floor]
    return min(near, key=lambda candidate: (_shape(candidate), -candidate[value_key]))


def choose_best(rows: list, tolerance: float) -> dict | None:
    """The best measured row of one level (see the module docstring), or None when nothing was measured."""
    scored = [row for row in rows if row["score"] is not None]
    return _pick(scored, "score", tolerance) if scored else None


def _point_ref(row: dict) -> dict:
    return {"id": row["id"], "steps": row["steps"], "topk": row["topk"], "draft_tokens": row["draft_tokens"]}


def best_per_level(rows: list, levels: list, tolerance: float) -> list:
    """Per level: the best point, the runner-up, the margin between their medians and its spread."""
    result = []
    for level in levels:
        at_level = [row for row in rows if row["concurrency"] == level]
        best = choose_best(at_level, tolerance)
        entry = {
            "concurrency": level,
            "best": None,
            "runner_up": None,
            "margin_tok_s": None,
            "margin_pct": None,
            "spread_source": None,
            "clear": None,
            "measured_points": sum(1 for row in at_level if row["status"] == MEASURED),
        }
        if best is not None:
            others = [row for row in at_level if row["score"] is not None and row["id"] != best["id"]]
            runner = max(others, key=lambda row: (row["score"], tuple(-part for part in _shape(row))), default=None)
            entry["best"] = dict(
                _point_ref(best),
                output_throughput_median=best["output_throughput_median"],
                output_throughput_mad=best["output_throughput_mad"],
                repeats=best["repeats"],
                host=best["host"],
            )
            repeats = min(best["repeats"], runner["repeats"]) if runner else best["repeats"]
            entry["spread_source"] = (
                f"repeat runs: MAD of output tok/s over {repeats} runs"
                if repeats >= 2
                else "none: one run per level (set sweep_repeats >= 2 for a spread)"
            )
            if runner is not None:
                margin = best["output_throughput_median"] - runner["output_throughput_median"]
                entry.update(
                    runner_up=dict(
                        _point_ref(runner),
                        output_throughput_median=runner["output_throughput_median"],
                        output_throughput_mad=runner["output_throughput_mad"],
                        repeats=runner["repeats"],
                        host=runner["host"],
                    ),
                    margin_tok_s=margin,
                    margin_pct=100.0 * margin / runner["output_throughput_median"]
                    if runner["output_throughput_median"]
                    else None,
                    clear=(margin > best["output_throughput_mad"] + runner["output_throughput_mad"])
                    if repeats >= 2
                    else None,
                )
        result.append(entry)
    return result


def _points_of(rows: list) -> dict:
    points = {}
    for row in rows:
        points.setdefault(row["id"], []).append(row)
    return points


def robust_choice(rows: list, levels: list, tolerance: float) -> dict:
    """The point whose worst ratio to each level's best is highest (see the module docstring)."""
    best_at = {}
    for level in levels:
        medians = [row["output_throughput_median"] for row in rows if row["concurrency"] == level]
        medians = [value for value in medians if value]
        if medians:
            best_at[level] = max(medians)
    candidates = []
    for point_rows in _points_of(rows).values():
        by_level = {row["concurrency"]: row for row in point_rows}
        ratios = {}
        for level, best in best_at.items():
            row = by_level.get(level)
            value = row["output_throughput_median"] if row is not None else None
            ratios[level] = value / best if value else 0.0
        if not ratios:
            continue
        worst_level = min(ratios, key=lambda level: (ratios[level], level))
        worst_row = by_level.get(worst_level)
        candidates.append(
            dict(
                _point_ref(point_rows[0]),
                worst_ratio=ratios[worst_level],
                worst_at={"concurrency": worst_level, "host": worst_row["host"] if worst_row else None},
                ratios={str(level): ratio for level, ratio in sorted(ratios.items())},
            )
        )
    candidates.sort(key=_shape)
    rated = [candidate for candidate in candidates if candidate["worst_ratio"] > 0]
    chosen = _pick(rated, "worst_ratio", tolerance) if rated else None
    skipped = [level for level in levels if level not in best_at]
    return {
        "point": chosen,
        "candidates": candidates,
        "levels_without_measurement": skipped,
        "reason": None if chosen else "no point was measured at every load level",
    }


def _meets(row: dict, slo: dict) -> bool:
    worst = row.get("worst") or {}
    return row["status"] == MEASURED and all(key in worst and worst[key] <= bound for key, bound in slo.items())


def sla_choice(rows: list, levels: list, slo: dict, tolerance: float) -> dict | None:
    """The highest-throughput point at the heaviest level it survives under ``slo``; None without an SLO."""
    if not slo:
        return None
    candidates = []
    for point_rows in _points_of(rows).values():
        by_level = {row["concurrency"]: row for row in point_rows}
        survived = None
        for level in levels:
            row = by_level.get(level)
            if row is None or not _meets(row, slo):
                break
            survived = row
        candidates.append(
            dict(
                _point_ref(point_rows[0]),
                heaviest_concurrency=survived["concurrency"] if survived else None,
                output_throughput_median=survived["output_throughput_median"] if survived else None,
                values={key: survived["worst"].get(key) for key in slo} if survived else None,
            )
        )
    candidates.sort(key=_shape)
    rated = [candidate for candidate in candidates if candidate["output_throughput_median"]]
    chosen = _pick(rated, "output_throughput_median", tolerance) if rated else None
    return {
        "slo": slo,
        "point": chosen,
        "candidates": candidates,
        "reason": None if chosen else f"no point meets {slo} even at concurrency {levels[0] if levels else '-'}",
    }


def pareto(rows: list) -> list:
    """Every measured row as (per user, per GPU), marked when on the frontier."""
    measured = [
        row
        for row in rows
        if row["output_throughput_per_user_median"] is not None and row["output_throughput_per_gpu_median"] is not None
    ]
    entries = []
    for row in measured:
        user, gpu = row["output_throughput_per_user_median"], row["output_throughput_per_gpu_median"]
        dominated = any(
            other["output_throughput_per_user_median"] >= user
            and other["output_throughput_per_gpu_median"] >= gpu
            and (other["output_throughput_per_user_median"] > user or other["output_throughput_per_gpu_median"] > gpu)
            for other in measured
        )
        entries.append(
            dict(
                _point_ref(row),
                concurrency=row["concurrency"],
                output_throughput_per_user=user,
                output_throughput_per_gpu=gpu,
                frontier=not dominated,
            )
        )
    entries.sort(key=lambda entry: (entry["output_throughput_per_gpu"], entry["output_throughput_per_user"]))
    return entries


def applied_choice(robust: dict, sla: dict | None) -> dict:
    """What ``sweep_apply: best`` applies: the SLA choice when an SLO is set, else the robust choice."""
    if sla is not None:
        return {"rule": "sla", "point": sla["point"], "reason": sla["reason"]}
    return {"rule": "robust", "point": robust["point"], "reason": robust["reason"]}


def _loads(records: list) -> dict:
    """The distinct loads among ``records``: {(host, point id, run id, load start): [records]}."""
    loads = {}
    for record in records:
        load = record.get("load") or {}
        key = (record.get("host"), record["point"]["id"], record.get("run_id"), load.get("started_at"))
        loads.setdefault(key, []).append(record)
    return loads


def _fork_to_ready(load_records: list) -> float | None:
    for record in sorted(load_records, key=lambda item: item.get("started_at") or 0):
        engine = (record.get("bench") or {}).get("engine") or {}
        if engine.get("fork_to_ready_s") is not None:
            return engine["fork_to_ready_s"]
    return None


def _engines(records: list) -> list:
    """The distinct engine processes that served measured levels: [(host, engine reading)]."""
    engines = []
    for record in records:
        engine = (record.get("bench") or {}).get("engine") or {}
        if record["status"] != MEASURED or not engine.get("main_pid"):
            continue
        host = record.get("host")
        if not any(seen_host == host and same_engine(seen, engine) for seen_host, seen in engines):
            engines.append((host, engine))
    return engines


def _wall(records: list) -> float | None:
    starts = [(record.get("load") or {}).get("started_at") or record.get("started_at") for record in records]
    starts = [start for start in starts if start is not None]
    ends = [record["finished_at"] for record in records if record.get("finished_at") is not None]
    return max(ends) - min(starts) if starts and ends else None


def _engine_time(records: list) -> dict:
    """The engine's own time in ``records``: each load's fork-to-ready (the chain's time for a load that never
    got ready) plus every level's benchmark time."""
    loads = _loads(records)
    load_sum = 0.0
    unknown = 0
    for load_records in loads.values():
        fork_to_ready = _fork_to_ready(load_records)
        if fork_to_ready is None:
            unknown += 1
            fork_to_ready = (load_records[0].get("load") or {}).get("load_s") or 0.0
        load_sum += fork_to_ready
    bench_sum = sum((record.get("bench") or {}).get("elapsed_s") or 0.0 for record in records)
    return {"loads": len(loads), "loads_without_engine_time": unknown, "load_sum_s": load_sum, "bench_sum_s": bench_sum}


def timing(records: list, run: dict, reported_at: float) -> dict:
    """This run's wall times and ratios, from the records' own timestamps.

    ``sweep_wall_s`` runs from the first of this run's loads starting to the last level's record, over all
    hosts; ``run_wall_s`` also covers planning and the restore of the original configuration.
    ``overhead_ratio`` = sweep wall / (every load's restart-chain time + every level's benchmark time);
    ``engine_ratio`` = sweep wall / (every load's fork-to-ready from the engine's log + every level's benchmark
    time), the engine's own time with nothing of the collection in it (per host in ``per_host``).
    ``loads_per_point`` is the engine processes that served measured levels per point measured: 1.0 when
    adding load levels costs no extra engine loads.
    """
    mine = [record for record in records if record.get("run_id") == run.get("run_id")]
    result = {
        "run_id": run.get("run_id"),
        "hosts": run.get("hosts"),
        "points_run": len({record["point"]["id"] for record in mine}),
        "levels_run": len(mine),
        "run_started_at": run.get("started_at"),
        "reported_at": reported_at,
        "run_wall_s": reported_at - run["started_at"] if run.get("started_at") else None,
        "sweep_wall_s": None,
        "load_bench_sum_s": None,
        "apply_sum_s": None,
        "overhead_ratio": None,
        "engine_time_s": None,
        "engine_ratio": None,
        "engine_loads": 0,
        "loads_per_point": None,
        "per_host": {},
    }
    if not mine:
        return result
    loads = _loads(mine)
    chain_sum = sum((load_records[0].get("load") or {}).get("load_s") or 0.0 for load_records in loads.values())
    engine = _engine_time(mine)
    busy = chain_sum + engine["bench_sum_s"]
    engine_time = engine["load_sum_s"] + engine["bench_sum_s"]
    wall = _wall(mine)
    measured_points = {record["point"]["id"] for record in mine if record["status"] == MEASURED}
    engines = _engines(mine)
    result.update(
        sweep_wall_s=wall,
        load_bench_sum_s=busy,
        apply_sum_s=sum((load_records[0].get("load") or {}).get("apply_s") or 0.0 for load_records in loads.values()),
        overhead_ratio=wall / busy if wall and busy > 0 else None,
        loads=engine["loads"],
        engine_load_sum_s=engine["load_sum_s"],
        bench_sum_s=engine["bench_sum_s"],
        loads_without_engine_time=engine["loads_without_engine_time"],
        engine_time_s=engine_time,
        engine_ratio=wall / engine_time if wall and engine_time > 0 else None,
        engine_loads=len(engines),
        loads_per_point=len(engines) / len(measured_points) if measured_points else None,
    )
    for host in sorted({record.get("host") for record in mine}):
        on_host = [record for record in mine if record.get("host") == host]
        host_engine = _engine_time(on_host)
        host_time = host_engine["load_sum_s"] + host_engine["bench_sum_s"]
        host_wall = _wall(on_host)
        result["per_host"][host] = {
            "wall_s": host_wall,
            "engine_time_s": host_time,
            "engine_ratio": host_wall / host_time if host_wall and host_time > 0 else None,
            "loads": host_engine["loads"],
            "levels": len(on_host),
        }
    return result


def rules(definition: dict) -> dict:
    """Each choice's rule, in words, with this sweep's settings filled in."""
    tolerance_pct = f"{definition.get('tolerance', 0) * 100:g}"
    return {
        name: text.format(
            mad_penalty=definition.get("mad_penalty"),
            tolerance_pct=tolerance_pct,
            slo=", ".join(f"{key} <= {value:g}" for key, value in (definition.get("slo") or {}).items()) or "no SLO",
            gpus=definition.get("gpus_per_engine", 1),
        )
        for name, text in RULES.items()
    }


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _name(point: dict | None) -> str:
    if not point:
        return "-"
    return f"steps {point['steps']}, top-k {point['topk']}, draft tokens {point['draft_tokens']}"


def _levels_text(definition: dict) -> str:
    bench = definition.get("bench", {})
    sizes = ", ".join(
        f"{level['num_prompts']} at concurrency {level['concurrency']}" for level in definition.get("levels") or []
    )
    return (
        f"Each point is loaded once and measured at every load level in turn: {sizes} requests per run "
        f"(max(num_prompts {bench.get('num_prompts')}, concurrency)), {definition.get('repeats')} run(s) per level, "
        f"after {definition.get('warmup_requests')} warm-up request(s) before the first level of each load; "
        f"{bench.get('max_new_tokens')} new tokens per request, prompt set {bench.get('prompt_set')}."
    )


def _best_lines(best_levels: list) -> list:
    lines = [
        "| concurrency | best point | tok/s (median +- MAD) | runner-up | runner-up tok/s | margin | clear | spread |",
        "|---:|---|---:|---|---:|---:|---|---|",
    ]
    for entry in best_levels:
        best, runner = entry["best"], entry["runner_up"]
        margin = (
            f"{_fmt(entry['margin_tok_s'])} tok/s ({_fmt(entry['margin_pct'])} %)"
            if entry["margin_tok_s"] is not None
            else "-"
        )
        clear = {True: "yes", False: "no (within the spread)", None: "-"}[entry["clear"]]
        lines.append(
            f"| {entry['concurrency']} | {_name(best)} | "
            f"{_fmt(best and best['output_throughput_median'])} +- {_fmt(best and best['output_throughput_mad'])} | "
            f"{_name(runner)} | {_fmt(runner and runner['output_throughput_median'])} | {margin} | {clear} | "
            f"{entry['spread_source'] or '-'} |"
        )
    return lines


def markdown(rows: list, report: dict, definition: dict, run_timing: dict) -> str:
    """The report: the choices with their rules, every measurement, failures, and this run's timing."""
    stated = rules(definition)
    levels = [level["concurrency"] for level in definition.get("levels") or []]
    robust, sla, choice = report["robust_choice"], report["sla_choice"], report["choice"]
    lines = [
        f"# Speculative decoding sweep: {definition.get('algorithm')}",
        "",
        _levels_text(definition),
        "",
        "## Best point per load level",
        "",
        stated["best_per_level"],
        "",
        *_best_lines(report["best_per_level"]),
        "",
        "## Robust choice",
        "",
        stated["robust"],
        "",
        f"**{_name(robust['point'])}**"
        + (
            f": worst ratio {robust['point']['worst_ratio']:.3f} at concurrency "
            f"{robust['point']['worst_at']['concurrency']} ({robust['point']['worst_at']['host']})."
            if robust["point"]
            else f" ({robust['reason']})."
        ),
        "",
        "| point | " + " | ".join(f"c={level}" for level in levels) + " | worst |",
        "|---|" + "---:|" * (len(levels) + 1),
    ]
    for candidate in robust["candidates"]:
        ratios = [_fmt(candidate["ratios"].get(str(level)), 3) for level in levels]
        lines.append(f"| {_name(candidate)} | " + " | ".join(ratios) + f" | {candidate['worst_ratio']:.3f} |")
    lines += ["", "## SLA choice", ""]
    if sla is None:
        lines.append("No SLO set (sweep_slo), so there is no SLA choice.")
    else:
        lines += [stated["sla"], ""]
        if sla["point"]:
            point = sla["point"]
            lines.append(
                f"**{_name(point)}**: {point['output_throughput_median']:.1f} tok/s at concurrency "
                f"{point['heaviest_concurrency']}, the heaviest level it survives."
            )
        else:
            lines.append(f"None: {sla['reason']}.")
        lines += ["", "| point | heaviest level survived | tok/s there |", "|---|---:|---:|"]
        lines += [
            f"| {_name(candidate)} | {_fmt(candidate['heaviest_concurrency'])} | "
            f"{_fmt(candidate['output_throughput_median'])} |"
            for candidate in sla["candidates"]
        ]
    lines += [
        "",
        "## Applied by sweep_apply: best",
        "",
        stated["apply"],
        "",
        f"Here: the {choice['rule']} choice, {_name(choice['point'])}"
        + ("." if choice["point"] else f" ({choice['reason']}): the original configuration."),
        "",
        "## Pareto frontier",
        "",
        stated["pareto"] + " Plot: results-pareto.png.",
        "",
        "| point | concurrency | tok/s per user | tok/s per GPU |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {_name(entry)} | {entry['concurrency']} | {entry['output_throughput_per_user']:.1f} | "
        f"{entry['output_throughput_per_gpu']:.1f} |"
        for entry in report["pareto"]
        if entry["frontier"]
    ]
    lines += [
        "",
        "## All measurements",
        "",
        "| steps | top-k | draft tokens | concurrency | status | tok/s (median) | MAD | score | tok/s per user | "
        "accept length | TTFT p99 (ms) | TPOT p99 (ms) | host | |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    best_ids = {(entry["concurrency"], entry["best"]["id"]) for entry in report["best_per_level"] if entry["best"]}
    for row in rows:
        mark = "**best**" if (row["concurrency"], row["id"]) in best_ids else ""
        lines.append(
            f"| {row['steps']} | {row['topk']} | {row['draft_tokens']} | {row['concurrency']} | {row['status']} | "
            f"{_fmt(row['output_throughput_median'])} | {_fmt(row['output_throughput_mad'])} | {_fmt(row['score'])} | "
            f"{_fmt(row['output_throughput_per_user_median'])} | {_fmt(row['accept_length_median'], 2)} | "
            f"{_fmt(row['p99_ttft_ms'])} | {_fmt(row['p99_tpot_ms'], 2)} | {row['host'] or '-'} | {mark} |"
        )
    failed = [row for row in rows if row["status"] != MEASURED]
    lines += ["", "## Failed points and levels", ""]
    if failed:
        lines += [
            f"- steps {row['steps']}, top-k {row['topk']}, draft tokens {row['draft_tokens']} at concurrency "
            f"{row['concurrency']} ({row['host']}, {row['stage']}): {row['reason']}"
            for row in failed
        ]
    else:
        lines.append("None.")
    retried = {row["id"]: row for row in rows if row.get("first_failure")}
    if retried:
        lines += ["", "## Points loaded twice", "", "Their first load failed; the second one counts.", ""]
        lines += [f"- steps {row['steps']}, top-k {row['topk']}: {row['first_failure']}" for row in retried.values()]
    if run_timing.get("sweep_wall_s") is not None:
        lines += [
            "",
            "## Timing of this run",
            "",
            f"{run_timing['points_run']} point(s), {run_timing['levels_run']} level(s) on "
            f"{len(run_timing.get('hosts') or [])} host(s): sweep wall time {run_timing['sweep_wall_s']:.1f} s; "
            f"{run_timing['loads']} load(s), {run_timing['engine_loads']} engine process(es) for the measured "
            f"levels ({_fmt(run_timing['loads_per_point'], 2)} per point); the engine's own time "
            f"{_fmt(run_timing['engine_time_s'])} s (fork to ready {_fmt(run_timing['engine_load_sum_s'])} s + "
            f"benchmarks {_fmt(run_timing['bench_sum_s'])} s), ratio {_fmt(run_timing['engine_ratio'], 2)}; "
            f"with the restart chains {_fmt(run_timing['load_bench_sum_s'])} s, ratio "
            f"{_fmt(run_timing['overhead_ratio'], 2)}.",
        ]
    return "\n".join(lines) + "\n"


def csv_text(records: list) -> str:
    """Every raw benchmark run, one row each; a level without runs gets one row with its status and reason."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head = ["point_id", "steps", "topk", "draft_tokens", "concurrency", "host", "run_id", "status", "repeat"]
    writer.writerow([*head, *RUN_METRICS, "load_s", "fork_to_ready_s", "bench_s", "reason"])
    for record in records:
        point = record["point"]
        engine = (record.get("bench") or {}).get("engine") or {}
        head = [point["id"], point["steps"], point["topk"], point["draft_tokens"], record["concurrency"]]
        head += [record.get("host"), record.get("run_id"), record["status"]]
        tail = [(record.get("load") or {}).get("load_s"), engine.get("fork_to_ready_s")]
        tail += [(record.get("bench") or {}).get("elapsed_s"), record.get("reason") or ""]
        runs = record.get("repeats") or [None]
        for number, run in enumerate(runs, start=1):
            values = [run.get(name) for name in RUN_METRICS] if run else [None] * len(RUN_METRICS)
            writer.writerow([*head, number if run else "", *values, *tail])
    return out.getvalue()
