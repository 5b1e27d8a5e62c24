# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sweep's reports: the Markdown report (the choices with their rules, every measurement, failures, timing) and
the CSV of every repeat run.

Private to the llmops.inference collection; not a public API. Pure functions, standard library only (the optional
plots are in sweep_plot.py).
"""

from __future__ import annotations

import csv
import io

from ansible_collections.llmops.inference.plugins.module_utils.sweep_adaptive import (
    markdown_lines as deployable_markdown,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_prove import markdown_lines as proof_markdown
from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import MEASURED, RUN_METRICS

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
    ]
    if report.get("deployable"):
        lines += deployable_markdown(report["deployable"])
        lines += proof_markdown(report.get("proof"))
    lines += [
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
        mark = "**not lossless**" if row.get("lossless") is False else mark
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
    lines += _lossless_lines(rows)
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


def _lossless_lines(rows: list) -> list:
    """Which points changed greedy output against the model's without speculation (never chosen)."""
    lines = ["", "## Losslessness", ""]
    checked = [row for row in rows if row.get("lossless") is not None]
    if not checked:
        return [*lines, "Not checked: no golden outputs without speculation (see the sweep's log)."]
    lossy = {row["id"]: row for row in rows if row.get("lossless") is False}
    lines.append(
        "Each point's greedy outputs, teacher-forced and free-running, against the model's without speculation: a "
        "point whose output differs is **not lossless** and never chosen, however fast."
    )
    lines.append("")
    if not lossy:
        return [*lines, f"Every checked point is lossless ({len({row['id'] for row in checked})} points)."]
    return lines + [
        f"- steps {row['steps']}, top-k {row['topk']}, draft tokens {row['draft_tokens']}: not lossless: "
        f"{row.get('lossless_detail')}"
        for row in lossy.values()
    ]


def csv_text(records: list) -> str:
    """Every raw benchmark run, one row each; a level without runs gets one row with its status and reason."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head = ["point_id", "steps", "topk", "draft_tokens", "concurrency", "host", "run_id", "status", "repeat"]
    writer.writerow([*head, *RUN_METRICS, "load_s", "fork_to_ready_s", "bench_s", "reason", "lossless"])
    for record in records:
        point = record["point"]
        engine = (record.get("bench") or {}).get("engine") or {}
        head = [point["id"], point["steps"], point["topk"], point["draft_tokens"], record["concurrency"]]
        head += [record.get("host"), record.get("run_id"), record["status"]]
        tail = [(record.get("load") or {}).get("load_s"), engine.get("fork_to_ready_s")]
        tail += [(record.get("bench") or {}).get("elapsed_s"), record.get("reason") or ""]
        tail.append(_lossless_cell(((record.get("load") or {}).get("lossless") or {}).get("lossless")))
        runs = record.get("repeats") or [None]
        for number, run in enumerate(runs, start=1):
            values = [run.get(name) for name in RUN_METRICS] if run else [None] * len(RUN_METRICS)
            writer.writerow([*head, number if run else "", *values, *tail])
    return out.getvalue()


def _lossless_cell(value) -> str:
    return "" if value is None else ("true" if value else "false")
