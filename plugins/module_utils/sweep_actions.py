# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep_report module's actions - plan, budget, record, report - on top of the plan, store and report logic.

Private to the llmops.inference collection; not a public API. ``params`` are the module's parameters.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

from ansible_collections.llmops.inference.plugins.module_utils.bench import BenchInputError, BenchSettings
from ansible_collections.llmops.inference.plugins.module_utils.bench_levels import LEVEL_OPTIONS
from ansible_collections.llmops.inference.plugins.module_utils.redact import Redactor
from ansible_collections.llmops.inference.plugins.module_utils.sweep_adaptive import (
    DEFAULT_ADAPTIVE_MARGIN,
    adaptive_csv,
    deployable,
    render_config,
    sweep_refusal,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_choice import (
    applied_choice,
    best_per_level,
    pareto,
    robust_choice,
    sla_choice,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import (
    SweepInputError,
    assign,
    check_algorithm,
    check_counts,
    check_host_args,
    check_levels,
    check_slo,
    expand_points,
    level_plan,
    level_warnings,
    load_budget,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plot import (
    plot_available,
    render_pareto_png,
    render_png,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_prove import arms, compare, schedule
from ansible_collections.llmops.inference.plugins.module_utils.sweep_prove import csv_rows as proof_rows
from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import (
    MEASURED,
    LevelOutcome,
    LevelRun,
    PointBenchmark,
    build_level_record,
    build_load,
    point_level_records,
    progress_document,
    stops_point,
    summarize,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_render import csv_text, markdown, rules
from ansible_collections.llmops.inference.plugins.module_utils.sweep_store import ResultsDir
from ansible_collections.llmops.inference.plugins.module_utils.sweep_timing import timing

# The sglang_bench options a sweep sets for every run (sweep_bench), with that module's defaults.
SWEEP_BENCH_OPTIONS = (
    "num_prompts", "concurrency", "max_new_tokens", "prompt_set", "random_input_len", "seed", "request_timeout",
    "ignore_eos", "temperature",
)  # fmt: skip
BENCH_DEFAULTS = {name: BenchSettings.DEFAULTS[name] for name in SWEEP_BENCH_OPTIONS}
# The numbers of a progress file's context: sglang_bench keeps the context as given, so they may come as text.
CONTEXT_NUMBERS = ("point_started_at", "apply_s", "load_s")
REPORT_FILES = {
    "json": "results.json",
    "csv": "results.csv",
    "markdown": "results.md",
    "png": "results.png",
    "pareto_png": "results-pareto.png",
    "adaptive_config": "results-adaptive-config.json",
    "adaptive_csv": "results-adaptive.csv",
    "proof_csv": "results-proof.csv",
}


def bench_options(given: dict) -> dict:
    """sglang_bench options for every run: the defaults overlaid with ``sweep_bench``, validated."""
    unknown = sorted(set(given) - set(BENCH_DEFAULTS))
    if unknown:
        raise SweepInputError("sweep_bench", f"has unknown keys {unknown}; accepted: {', '.join(BENCH_DEFAULTS)}")
    options = dict(BENCH_DEFAULTS, **given)
    try:
        BenchSettings(**options).validate()
    except BenchInputError as exc:
        raise SweepInputError(f"sweep_bench.{exc.option}", str(exc).split(": ", 1)[1]) from None
    except TypeError as exc:
        raise SweepInputError("sweep_bench", f"has a value of the wrong type: {exc}") from None
    if not isinstance(options["ignore_eos"], bool):
        raise SweepInputError("sweep_bench.ignore_eos", f"must be true or false, got {options['ignore_eos']!r}")
    return options


def check_alike(profiles: dict) -> None:
    """Every host must report the same profile (model, TP size, algorithm, ...) or the points do not compare."""
    distinct = {}
    for host, profile in profiles.items():
        distinct.setdefault(json.dumps(profile, sort_keys=True), []).append(host)
    if len(distinct) > 1:
        shown = "; ".join(f"{', '.join(hosts)}: {key}" for key, hosts in distinct.items())
        raise SweepInputError(
            "sweep_hosts", f"are not alike, so their numbers would not compare (a sweep needs alike hosts): {shown}"
        )


def _check_scoring(mad_penalty, tolerance) -> None:
    if not (isinstance(mad_penalty, (int, float)) and mad_penalty >= 0):
        raise SweepInputError("sweep_mad_penalty", f"must be a number >= 0, got {mad_penalty!r}")
    if not (isinstance(tolerance, (int, float)) and 0 <= tolerance < 1):
        raise SweepInputError(
            "sweep_tolerance", f"must be a fraction from 0 up to (not including) 1, got {tolerance!r}"
        )


def gpus_per_engine(profiles: dict) -> int:
    """GPUs one engine uses, from the (alike) hosts' profiles: their GPU list times the engine's hosts
    (``nnodes``), else the TP size."""
    for profile in (profiles or {}).values():
        try:
            if profile.get("gpus"):
                return len(profile["gpus"]) * max(1, int(profile.get("nnodes") or 1))
            return max(1, int(profile.get("tp_size") or 1))
        except (TypeError, ValueError):
            return 1
    return 1


def _levels(params: dict, bench: dict) -> list:
    given = params.get("concurrency")
    if given is None:
        return check_levels(bench["concurrency"])
    if "concurrency" in (params.get("bench") or {}):
        raise SweepInputError(
            "sweep_bench.concurrency", "and sweep_concurrency are both set; list the load levels in sweep_concurrency"
        )
    return check_levels(given)


def plan_sweep(params: dict, run: dict, now: float, write: bool = True) -> dict:
    """Validate everything, start the run in the results directory, and assign the missing points and levels."""
    points = expand_points(params.get("steps"), params.get("topk", 1), params.get("draft_tokens"), params.get("grid"))
    algorithm = check_algorithm(params.get("algorithm"))
    check_counts(
        sweep_repeats=(params["repeats"], 1),
        sweep_warmup_requests=(params["warmup_requests"], 0),
        sweep_stability_window=(params.get("stability_window", 0), 0),
    )
    _check_scoring(params["mad_penalty"], params["tolerance"])
    margin = params.get("adaptive_margin", DEFAULT_ADAPTIVE_MARGIN)
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise SweepInputError(
            "sweep_adaptive_margin", f"must be a fraction from 0 up to (not including) 1, got {margin!r}"
        )
    bench = bench_options(params.get("bench") or {})
    levels = _levels(params, bench)
    slo = check_slo(params.get("slo"))
    hosts = list(params.get("hosts") or [])
    if len(set(hosts)) != len(hosts):
        raise SweepInputError("sweep_hosts", f"lists a host more than once: {hosts}")
    node_groups = params.get("node_groups") or {}
    assign([], hosts, node_groups)  # no hosts, or a multi-node engine swept in part, is an error
    profiles = params.get("host_profiles") or {}
    check_alike(profiles)
    check_host_args(points, params.get("host_args") or {})
    bench.pop("concurrency")
    sizes = level_plan(levels, bench, params["repeats"], params["warmup_requests"])
    definition = {
        "algorithm": algorithm,
        "repeats": params["repeats"],
        "warmup_requests": params["warmup_requests"],
        "bench": bench,
        "levels": sizes,
        "slo": slo,
        "gpus_per_engine": gpus_per_engine(profiles),
        "mad_penalty": params["mad_penalty"],
        "tolerance": params["tolerance"],
        "apply": params.get("apply", "original"),
        "points": [point.as_dict() for point in points],
        "adaptive": {
            "margin": margin,
            "refused": sweep_refusal(algorithm, sorted({p.topk for p in points}), params.get("host_args") or {}),
        },
    }
    store = ResultsDir(params["results_dir"])
    run = dict(run, started_at=now, hosts=hosts)
    retry_failed = params.get("retry_failed", False)
    earlier = (store.read_definition() or {}) if params["resume"] else {}
    earlier_runs = [item.get("run_id") for item in earlier.get("runs") or []]
    if write:
        started = store.start_run(definition, params["resume"], run, now, retry_failed)
        done, replaced = started["done"], started["replaced"]
    else:
        store.check_writable()
        done = store.done_levels(retry_failed) if params["resume"] else {}
        replaced = None
    recovered = {}
    if params["resume"]:
        planned = {point.id: [level["concurrency"] for level in sizes] for point in points}
        for record in recover_levels(store, params.get("leftover_progress"), planned, earlier_runs, write):
            recovered.setdefault(record["point"]["id"], []).append(record["concurrency"])
            if record["status"] == MEASURED or not retry_failed:
                done.setdefault(record["point"]["id"], []).append(record["concurrency"])
    pending, complete, partial = [], [], {}
    for point in points:
        missing = [level for level in sizes if level["concurrency"] not in done.get(point.id, [])]
        if not missing:
            complete.append(point.id)
            continue
        if len(missing) < len(sizes):
            partial[point.id] = sorted(done[point.id])
        # Each level as sglang_bench's levels option takes it; the point's benchmark may take all their budgets.
        to_measure = [{key: level[key] for key in LEVEL_OPTIONS} for level in missing]
        pending.append(dict(point.as_dict(), levels=to_measure, budget_s=sum(level["budget_s"] for level in missing)))
    plan = assign(pending, hosts, node_groups)
    return {
        "run_id": run["run_id"],
        "started_at": now,
        "definition": definition,
        "points": definition["points"],
        "levels": sizes,
        "done": complete,
        "partial": partial,
        "pending": [point["id"] for point in pending],
        "assignment": plan,
        "stability_window": params.get("stability_window", 0),
        "replaced": replaced,
        "recovered": recovered,
        "level_warnings": level_warnings(levels, params.get("host_args") or {}),
        "adaptive_refused": definition["adaptive"]["refused"],
    }


def host_budget(params: dict) -> dict:
    """This host's load budget for every point (see sweep_plan.load_budget)."""
    return load_budget(params.get("unit_status") or {}, params.get("role_wait_s"), params.get("load_timeout"))


def _bare_point(point: dict) -> dict:
    return {key: point[key] for key in ("id", "steps", "topk", "draft_tokens")}


def _point_run(params: dict) -> LevelRun:
    """The point, host, run and load every level record of one call shares (each level sets its own concurrency
    and times)."""
    load = build_load(
        params.get("point_started_at") or params["started_at"],
        params.get("load_s"),
        params.get("gate"),
        apply_s=params.get("apply_s"),
        first_failure=params.get("first_failure"),
        lossless=params.get("lossless"),
    )
    return LevelRun(
        _bare_point(params["point"]), 0, params["host"], params["run_id"], params["started_at"],
        params["finished_at"], load,
    )  # fmt: skip


def record_arm(params: dict, write: bool = True) -> dict:
    """Record one arm of the proof for one round (``arm``, ``round``) at every level (``levels``), from its one
    benchmark or its failed load, as record_levels records a point."""
    arm = params.get("arm") or {}
    if not arm.get("id") or not isinstance(params.get("round"), int):
        raise SweepInputError("arm", "and round must name the arm (its id) and the round to record")
    point = {key: arm.get(key) for key in ("id", "steps", "topk", "draft_tokens")}
    result = record_levels(dict(params, point=point), write=False)
    records = [dict(record, round=params["round"], arm=arm) for record in result["records"]]
    store = ResultsDir(params["results_dir"])
    paths = [store.write_arm(record) for record in records] if write else []
    return dict(result, records=records, paths=paths)


def record_levels(params: dict, write: bool = True) -> dict:
    """Record one level (``concurrency``) or several (``levels``): from one benchmark of all of them (``benchmark``
    and ``bench_progress``, see sweep_records.point_level_records), or all failed the same way (the point's load
    failed, ``error``, ``not_run``).

    Every string recorded is redacted: ``api_key`` (the server's key) and the API-key forms of redact.py.
    """
    levels = params.get("levels") or [params.get("concurrency")]
    if any(level is None for level in levels):
        raise SweepInputError("concurrency", "or levels must name the load level(s) to record")
    run = _point_run(params)
    one_benchmark = params.get("levels") and (
        params.get("benchmark") is not None or params.get("bench_progress") is not None
    )
    if one_benchmark:
        bench = PointBenchmark(
            params.get("benchmark"),
            progress_document(params.get("bench_progress")),
            params["started_at"],
            params["finished_at"],
        )
        records = point_level_records(run, [int(level) for level in levels], params.get("gate"), bench)
    else:
        one = len(levels) == 1
        outcome = LevelOutcome(
            gate=params.get("gate"),
            benchmark=params.get("benchmark") if one else None,
            error=params.get("error"),
            journal=params.get("journal"),
            not_run=params.get("not_run"),
        )
        records = [build_level_record(replace(run, concurrency=int(level)), outcome) for level in levels]
    # The journal, the errors and the benchmark's messages may quote the engine's command line or its
    # server_args: the API key never reaches the results directory (nor the module's result).
    records = Redactor([params.get("api_key")]).value(records)
    store = ResultsDir(params["results_dir"])
    paths = [store.write_level(record) for record in records] if write else []
    stops = next((stops_point(record) for record in records if stops_point(record)), None)
    return {"records": records, "paths": paths, "status": records[0]["status"], "stops_point": stops}


def recover_levels(store: ResultsDir, contents, planned: dict, earlier_runs: list, write: bool = True) -> list:
    """Record the levels that the benchmarks of an interrupted run ended on their hosts but that never reached the
    controller: ``contents`` are their progress files (text or base64), whose ``context`` holds the record options
    of the point (``run_id``, ``point``, ``host``, ``point_started_at``, ``apply_s``, ``load_s``, ``gate``,
    ``first_failure``). Only levels of ``earlier_runs`` of this results directory, in ``planned`` ({point id:
    [concurrency]}) and not recorded yet are recorded; a level cut short is left to be measured again. Returns
    the records written (or, with ``write`` false, that would be)."""
    recorded = store.done_levels()
    recovered = []
    for content in contents or []:
        progress = progress_document(content)
        context = (progress or {}).get("context") or {}
        point_id = (context.get("point") or {}).get("id")
        if context.get("run_id") not in earlier_runs or point_id not in planned:
            continue
        at = progress.get("updated_at")
        try:
            numbers = {key: None if context.get(key) is None else float(context[key]) for key in CONTEXT_NUMBERS}
            run = _point_run(dict(context, **numbers, started_at=at, finished_at=at))
            bench = PointBenchmark(None, progress, at, at)
            planned_here = progress.get("planned") or []
            records = point_level_records(run, planned_here, context.get("gate"), bench, record_unfinished=False)
        except (KeyError, TypeError, ValueError):
            continue  # not a progress file of this collection's sweep
        for record in Redactor().value(records):
            levels = recorded.setdefault(point_id, [])
            if record["concurrency"] in levels or record["concurrency"] not in planned[point_id]:
                continue
            if write:
                store.write_level(record)
            levels.append(record["concurrency"])
            recovered.append(record)
    return recovered


def _with_levels(order: list, definition: dict) -> list:
    """Each arm of the proof measures every level of the sweep, as sglang_bench's levels option takes them."""
    sizes = definition.get("levels") or []
    levels = [{key: level[key] for key in LEVEL_OPTIONS} for level in sizes]
    budget = sum(level["budget_s"] for level in sizes)
    return [dict(item, levels=levels, budget_s=budget) for item in order]


def _csv(rows: list) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def write_reports(params: dict, now: float, write: bool = True) -> dict:
    store = ResultsDir(params["results_dir"])
    sweep = store.read_definition()
    if sweep is None:
        raise SweepInputError("sweep_results_dir", f"{store.path} holds no sweep.json; plan the sweep first")
    definition = sweep["definition"]
    runs = sweep.get("runs") or [{}]
    run = next((item for item in runs if item.get("run_id") == params.get("run_id")), runs[-1])
    records = store.level_records()
    rows = [summarize(record, definition["mad_penalty"], definition.get("gpus_per_engine", 1)) for record in records]
    levels = [level["concurrency"] for level in definition.get("levels") or []]
    point_ids = {point["id"] for point in definition.get("points") or []}
    in_scope = [row for row in rows if row["concurrency"] in levels and row["id"] in point_ids]
    tolerance = definition["tolerance"]
    best_levels = best_per_level(in_scope, levels, tolerance)
    robust = robust_choice(in_scope, levels, tolerance)
    sla = sla_choice(in_scope, levels, definition.get("slo") or {}, tolerance)
    frontier = pareto(in_scope)
    choice = applied_choice(robust, sla)
    deploy = deployable(in_scope, levels, definition, choice)
    config_path = params.get("adaptive_config_path") or ""
    arm_list = arms(deploy, best_levels, config_path)
    arm_rows = [
        dict(summarize(record, definition["mad_penalty"]), round=record["round"]) for record in store.arm_records()
    ]
    report = {
        "best_per_level": best_levels,
        "robust_choice": robust,
        "sla_choice": sla,
        "choice": choice,
        "pareto": frontier,
        "deployable": deploy,
        "prove_plan": _with_levels(schedule(arm_list, params.get("prove_rounds") or 0), definition),
        "proof": compare(arm_rows, arm_list, best_levels, levels) if arm_rows else None,
    }
    run_timing = timing(records, run, now)
    document = dict(
        report, definition=definition, runs=runs, timing=run_timing, rules=rules(definition), summary=rows,
        records=records,
    )  # fmt: skip
    contents = {
        "json": (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8"),
        "csv": csv_text(records).encode("utf-8"),
        "markdown": markdown(rows, report, definition, run_timing).encode("utf-8"),
        "adaptive_csv": adaptive_csv(report["deployable"]).encode("utf-8"),
    }
    if report["proof"] is not None:
        contents["proof_csv"] = _csv(proof_rows(report["proof"])).encode("utf-8")
    if report["deployable"]["adaptive"]["config"] is not None:
        contents["adaptive_config"] = render_config(report["deployable"]["adaptive"]["config"]).encode("utf-8")
    plot_skipped = None
    if not params.get("plot", True):
        plot_skipped = "plot: false"
    elif not plot_available():
        plot_skipped = "matplotlib cannot be imported on the controller (pip install matplotlib)"
    elif not rows:
        plot_skipped = "no points recorded"
    else:
        title = f"{definition['algorithm']} speculative sweep: {len(point_ids)} point(s) x {len(levels)} load level(s)"
        contents["png"] = render_png(in_scope or rows, best_levels, title)
        if frontier:
            pareto_title = f"{definition['algorithm']}: Pareto over points and load levels"
            contents["pareto_png"] = render_pareto_png(frontier, pareto_title)
    paths = {}
    for kind, data in contents.items():
        name = REPORT_FILES[kind]
        paths[kind] = store.write_file(name, data) if write else f"{store.path}/{name}"
    return dict(report, summary=rows, timing=run_timing, files=paths, plot_skipped=plot_skipped)
