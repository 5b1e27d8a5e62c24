# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep_report module's three actions - plan, record, report - on top of the plan, store and report logic.

Private to the llmops.inference collection; not a public API. ``params`` are the module's parameters.
"""

from __future__ import annotations

import json

from ansible_collections.llmops.inference.plugins.module_utils.bench import BenchInputError, BenchSettings
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import (
    SweepInputError,
    assign,
    check_algorithm,
    check_counts,
    expand_points,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plot import plot_available, render_png
from ansible_collections.llmops.inference.plugins.module_utils.sweep_report import (
    build_record,
    choose_best,
    csv_text,
    markdown,
    summarize,
    timing,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_store import ResultsDir

BENCH_DEFAULTS = {
    "num_prompts": 32,
    "concurrency": 8,
    "max_new_tokens": 128,
    "prompt_set": "builtin",
    "random_input_len": 256,
    "seed": 0,
    "request_timeout": 120.0,
    "ignore_eos": True,
    "temperature": 0.0,
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


def plan_sweep(params: dict, run: dict, now: float, write: bool = True) -> dict:
    """Validate everything, start the run in the results directory, and assign the pending points."""
    points = expand_points(params.get("steps"), params.get("topk", 1), params.get("draft_tokens"), params.get("grid"))
    algorithm = check_algorithm(params.get("algorithm"))
    check_counts(sweep_repeats=(params["repeats"], 1), sweep_warmup_requests=(params["warmup_requests"], 0))
    _check_scoring(params["mad_penalty"], params["tolerance"])
    bench = bench_options(params.get("bench") or {})
    hosts = list(params.get("hosts") or [])
    if len(set(hosts)) != len(hosts):
        raise SweepInputError("sweep_hosts", f"lists a host more than once: {hosts}")
    assign([], hosts)  # no hosts is an error
    check_alike(params.get("host_profiles") or {})
    definition = {
        "algorithm": algorithm,
        "repeats": params["repeats"],
        "warmup_requests": params["warmup_requests"],
        "bench": bench,
        "mad_penalty": params["mad_penalty"],
        "tolerance": params["tolerance"],
        "apply": params.get("apply", "original"),
        "points": [point.as_dict() for point in points],
    }
    store = ResultsDir(params["results_dir"])
    run = dict(run, started_at=now, hosts=hosts)
    if write:
        started = store.start_run(definition, params["resume"], run, now, params.get("retry_failed", False))
    else:
        store.check_writable()
        done = [record["point"]["id"] for record in store.point_records()] if params["resume"] else []
        started = {"done": done, "replaced": None}
    pending = [point for point in points if point.id not in started["done"]]
    plan = assign(pending, hosts)
    return {
        "run_id": run["run_id"],
        "started_at": now,
        "definition": definition,
        "points": definition["points"],
        "done": [point.id for point in points if point.id in started["done"]],
        "pending": [point.id for point in pending],
        "assignment": {host: [point.as_dict() for point in assigned] for host, assigned in plan.items()},
        "replaced": started["replaced"],
    }


def record_point(params: dict, write: bool = True) -> dict:
    record = build_record(
        params["point"],
        params["host"],
        params["run_id"],
        params["started_at"],
        params["finished_at"],
        params.get("load_s"),
        gate=params.get("gate"),
        benchmark=params.get("benchmark"),
        error=params.get("error"),
        journal=params.get("journal"),
        apply_s=params.get("apply_s"),
        first_failure=params.get("first_failure"),
    )
    path = ResultsDir(params["results_dir"]).write_point(record) if write else None
    return {"record": record, "path": path}


def write_reports(params: dict, now: float, write: bool = True) -> dict:
    store = ResultsDir(params["results_dir"])
    sweep = store.read_definition()
    if sweep is None:
        raise SweepInputError("sweep_results_dir", f"{store.path} holds no sweep.json; plan the sweep first")
    definition = sweep["definition"]
    runs = sweep.get("runs") or [{}]
    run = next((item for item in runs if item.get("run_id") == params.get("run_id")), runs[-1])
    records = store.point_records()
    rows = [summarize(record, definition["mad_penalty"]) for record in records]
    best = choose_best(rows, definition["tolerance"])
    for row in rows:
        row["best"] = best is not None and row["id"] == best["id"]
    run_timing = timing(records, run, now)
    document = {
        "definition": definition,
        "runs": runs,
        "timing": run_timing,
        "best": best,
        "summary": rows,
        "points": records,
    }
    files = {"json": "results.json", "csv": "results.csv", "markdown": "results.md"}
    contents = {
        "json": (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8"),
        "csv": csv_text(records).encode("utf-8"),
        "markdown": markdown(rows, best, definition, run_timing).encode("utf-8"),
    }
    plot_skipped = None
    if not params.get("plot", True):
        plot_skipped = "plot: false"
    elif not plot_available():
        plot_skipped = "matplotlib cannot be imported on the controller (pip install matplotlib)"
    elif rows:
        files["png"] = "results.png"
        title = f"{definition['algorithm']} speculative sweep: {len(rows)} point(s)"
        contents["png"] = render_png(rows, best, title)
    else:
        plot_skipped = "no points recorded"
    paths = {}
    for kind, name in files.items():
        paths[kind] = store.write_file(name, contents[kind]) if write else f"{store.path}/{name}"
    return {"summary": rows, "best": best, "timing": run_timing, "files": paths, "plot_skipped": plot_skipped}
