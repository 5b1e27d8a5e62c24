"""A sweep point whose greedy output differs from the model's without speculation: "not lossless" in the JSON
record, the CSV, the Markdown and the plot, and never chosen as best, robust or SLA point, however fast."""

from __future__ import annotations

import csv
import io

from test_sweep_report import GATE, bench, build_level_record, point

from ansible_collections.llmops.inference.plugins.module_utils.sweep_choice import (
    applied_choice,
    best_per_level,
    pareto,
    robust_choice,
    sla_choice,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plot import plot_available, render_png
from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import build_load, summarize
from ansible_collections.llmops.inference.plugins.module_utils.sweep_render import csv_text, markdown

DEFINITION = {"algorithm": "EAGLE", "repeats": 2, "warmup_requests": 1, "bench": {"num_prompts": 8}, "mad_penalty": 1.0,
              "tolerance": 0.02, "slo": {"p99_tpot_ms": 30.0},
              "levels": [{"concurrency": 1, "num_prompts": 8}, {"concurrency": 8, "num_prompts": 8}]}  # fmt: skip
DRIFT = {"lossless": False, "detail": "golden token 8 (id 1234) of prompt 0: logprob -4.1 now, -0.3 recorded"}
CLEAN = {"lossless": True, "detail": "3 golden outputs reproduced"}


def record(steps, concurrency, throughput, lossless):
    load = build_load(100.0, 4.0, GATE, apply_s=0.5, lossless=lossless)
    return build_level_record(
        point(steps), concurrency, "h1", "run1", 101.0, 106.0, load, gate=GATE, benchmark=bench(throughput, throughput)
    )


def sweep(records):
    rows = [summarize(entry, 1.0) for entry in records]
    slo = {"p99_tpot_ms": 30.0}
    robust, sla = robust_choice(rows, [1, 8], 0.02), sla_choice(rows, [1, 8], slo, 0.02)
    report = {"best_per_level": best_per_level(rows, [1, 8], 0.02), "robust_choice": robust, "sla_choice": sla,
              "choice": applied_choice(robust, sla), "pareto": pareto(rows)}  # fmt: skip
    return rows, report


def test_the_fastest_point_that_is_not_lossless_is_never_chosen_and_every_report_says_so():
    records = [record(s, c, tok * (3.0 if s == 3 else 1.0), DRIFT if s == 3 else CLEAN)
               for s, tok in ((1, 100.0), (2, 120.0), (3, 150.0), (4, 110.0)) for c in (1, 8)]  # fmt: skip
    assert records[4]["load"]["lossless"] == DRIFT  # the JSON record keeps it
    rows, report = sweep(records)
    assert {row["id"] for row in rows if row["lossless"] is False} == {point(3)["id"]}
    assert all(entry["best"]["steps"] == 2 for entry in report["best_per_level"])
    assert all(entry["runner_up"]["steps"] != 3 for entry in report["best_per_level"])
    assert report["robust_choice"]["point"]["steps"] == 2 and report["sla_choice"]["point"]["steps"] == 2
    robust3 = next(c for c in report["robust_choice"]["candidates"] if c["steps"] == 3)
    assert robust3["worst_ratio"] == 0.0
    text = markdown(rows, report, DEFINITION, {})
    assert "## Losslessness" in text
    assert f"- steps 3, top-k 1, draft tokens 4: not lossless: {DRIFT['detail']}" in text
    assert next(line for line in text.splitlines() if line.startswith("| 3 | 1 | 4 |")).endswith("**not lossless** |")
    table = list(csv.DictReader(io.StringIO(csv_text(records))))
    assert {row["lossless"] for row in table if row["steps"] == "3"} == {"false"}
    assert {row["lossless"] for row in table if row["steps"] != "3"} == {"true"}
    if plot_available():
        assert render_png(rows, report["best_per_level"], "t").startswith(b"\x89PNG")


def test_without_golden_outputs_losslessness_is_not_checked_and_nothing_is_excluded():
    rows, report = sweep([record(s, c, 100.0 * s, None) for s in (1, 2) for c in (1, 8)])
    assert all(row["lossless"] is None for row in rows)
    assert report["best_per_level"][0]["best"]["steps"] == 2
    assert "Not checked: no golden outputs without speculation" in markdown(rows, report, DEFINITION, {})
