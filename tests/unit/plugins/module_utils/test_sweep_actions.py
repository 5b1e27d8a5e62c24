"""The sweep_report module's actions: plan, budget, record (redacted) and report, on a results directory."""

from __future__ import annotations

import json

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_actions import (
    host_budget,
    plan_sweep,
    record_levels,
    write_reports,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import SweepInputError
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plot import plot_available
from ansible_collections.llmops.inference.plugins.module_utils.sweep_store import ResultsDir


def plan_params(results_dir, **overrides) -> dict:
    params = {
        "results_dir": str(results_dir),
        "steps": [1, 2, 3, 4, 5],
        "topk": 1,
        "draft_tokens": None,
        "grid": None,
        "concurrency": [1, 8],
        "slo": {},
        "algorithm": "EAGLE",
        "host_profiles": {"h1": {"model_path": "m", "tp_size": "1"}, "h2": {"model_path": "m", "tp_size": "1"}},
        "host_args": {},
        "hosts": ["h1", "h2"],
        "repeats": 2,
        "warmup_requests": 1,
        "bench": {"num_prompts": 4},
        "resume": False,
        "retry_failed": False,
        "apply": "original",
        "mad_penalty": 1.0,
        "tolerance": 0.02,
    }
    params.update(overrides)
    return params


def record(results_dir, plan: dict, steps: int, concurrency: int, throughput: float | None, **extra) -> dict:
    entry = next(item for item in plan["points"] if item["steps"] == steps)
    healthy = throughput is not None
    scale = concurrency or 1
    run = {"completed": 8, "failed_requests": 0, "output_throughput": throughput, "accept_length": 2.0,
           "output_throughput_per_user": (throughput or 0) / scale, "p99_tpot_ms": 10.0 * scale,
           "started_at": 5000.0, "ended_at": 5002.0}  # fmt: skip
    engine = {"main_pid": 100 + steps, "forked_at": 900.0 + steps, "fork_to_ready_s": 3.0}
    benchmark = {"runs": [run], "repeats": 1, "elapsed_s": 2.0, "engine": engine}
    params = {
        "results_dir": str(results_dir),
        "point": entry,
        "concurrency": concurrency,
        "host": "h1",
        "run_id": plan["run_id"],
        "point_started_at": 1000.0 + steps * 10,
        "started_at": 1002.0 + steps * 10,
        "finished_at": 1008.0 + steps * 10 + scale / 100,
        "load_s": 5.0,
        "gate": {
            "healthy": healthy,
            "gate": {"reason": None if healthy else "unit failed", "failed_tier": "unit"},
            "service": {"main_pid": 100 + steps},
        },
        "benchmark": benchmark if healthy else None,
        "journal": ["RuntimeError: CUDA out of memory."] if not healthy else [],
    }
    params.update(extra)
    return record_levels(params)


def test_plan_gives_a_multi_node_engine_its_points_once_and_counts_all_its_gpus(tmp_path):
    profile = {"model_path": "m", "tp_size": "4", "gpus": [0, 1], "nnodes": 2}
    params = plan_params(tmp_path, hosts=["r0", "r1"], host_profiles={"r0": profile, "r1": profile},
                         node_groups={"r0": ["r0", "r1"], "r1": ["r0", "r1"]}, steps=[1, 2, 3])  # fmt: skip
    plan = plan_sweep(params, {"run_id": "g"}, now=1.0)
    assert [entry["steps"] for entry in plan["assignment"]["r0"]] == [1, 2, 3]
    assert plan["assignment"]["r1"] == plan["assignment"]["r0"]
    assert plan["definition"]["gpus_per_engine"] == 4
    with pytest.raises(SweepInputError, match="holds r0 but not r1 of the multi-node engine r0, r1"):
        plan_sweep(dict(params, hosts=["r0"]), {"run_id": "h"}, now=1.0)


def test_plan_assigns_points_in_turn_with_their_levels_and_resume_measures_only_missing_levels(tmp_path):
    plan = plan_sweep(plan_params(tmp_path), {"run_id": "r1"}, now=1000.0)
    assert plan["pending"] == [entry["id"] for entry in plan["points"]]
    assert [entry["steps"] for entry in plan["assignment"]["h1"]] == [1, 3, 5]
    assert [entry["steps"] for entry in plan["assignment"]["h2"]] == [2, 4]
    assert [level["concurrency"] for level in plan["assignment"]["h1"][0]["levels"]] == [1, 8]
    assert plan["levels"] == [
        {"concurrency": 1, "num_prompts": 4, "waves": 1 + 2 * 4, "budget_s": 9 * 120.0 + 30},
        {"concurrency": 8, "num_prompts": 8, "waves": 1 + 2 * 1, "budget_s": 3 * 120.0 + 30},
    ]
    assert plan["definition"]["bench"]["max_new_tokens"] == 128  # defaults filled in
    assert "concurrency" not in plan["definition"]["bench"]  # the levels say it
    assert plan["stability_window"] == 0  # a point's own benchmark watches the engine right after its gate
    assert plan_sweep(plan_params(tmp_path / "w", stability_window=5), {"run_id": "w"}, 1.0)["stability_window"] == 5
    record(tmp_path, plan, 1, 1, 100.0)
    record(tmp_path, plan, 1, 8, 300.0)
    record(tmp_path, plan, 2, 1, 110.0)  # killed before steps 2 at concurrency 8
    resumed = plan_sweep(plan_params(tmp_path, resume=True), {"run_id": "r2"}, now=2000.0)
    assert resumed["done"] == [plan["points"][0]["id"]]
    assert resumed["partial"] == {plan["points"][1]["id"]: [1]}
    pending = {entry["steps"]: [level["concurrency"] for level in entry["levels"]]
               for entries in resumed["assignment"].values() for entry in entries}  # fmt: skip
    assert pending == {2: [8], 3: [1, 8], 4: [1, 8], 5: [1, 8]}
    more = plan_sweep(plan_params(tmp_path, resume=True, concurrency=[1, 8, 32]), {"run_id": "r3"}, now=3000.0)
    assert more["done"] == [] and more["partial"][plan["points"][0]["id"]] == [1, 8]


def test_a_failed_level_stops_the_heavier_ones_and_a_failed_load_records_every_level(tmp_path):
    plan = plan_sweep(plan_params(tmp_path, concurrency=[1, 8, 32]), {"run_id": "r1"}, now=1000.0)
    measured = record(tmp_path, plan, 2, 1, 100.0)
    assert measured["stops_point"] is None and measured["status"] == "measured"
    crashed = record(tmp_path, plan, 2, 8, 100.0, benchmark={"runs": [], "warmup": {}, "msg": "connection refused"})
    assert crashed["stops_point"] == (
        "not run: the point failed at concurrency 8 (benchmark): benchmark failed: connection refused"
    )
    skipped = record(tmp_path, plan, 2, 32, None, gate={"healthy": True}, not_run=crashed["stops_point"])
    assert (skipped["status"], skipped["records"][0]["stage"], skipped["stops_point"]) == ("failed", "not run", None)
    oom = record(tmp_path, plan, 3, None, None, levels=[1, 8, 32])
    assert [item["concurrency"] for item in oom["records"]] == [1, 8, 32]
    assert all(item["stage"] == "load" and "CUDA out of memory" in item["reason"] for item in oom["records"])
    store = ResultsDir(str(tmp_path))
    assert store.done_levels() == {plan["points"][1]["id"]: [1, 8, 32], plan["points"][2]["id"]: [1, 8, 32]}
    with pytest.raises(SweepInputError, match="concurrency or levels must name the load level"):
        record(tmp_path, plan, 2, None, 1.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"steps": []}, "sweep_steps must not be empty"),
        ({"steps": [2], "topk": 4}, "top-k 4 needs draft tokens"),
        ({"algorithm": "NGRAM"}, "sweep_algorithm is NGRAM"),
        ({"repeats": 0}, "sweep_repeats must be an integer >= 1"),
        ({"stability_window": -1}, "sweep_stability_window must be an integer >= 0, got -1"),
        ({"bench": {"num_prompts": 0}}, "sweep_bench.num_prompts must be an integer >= 1, got 0"),
        ({"bench": {"prompts": 3}}, r"sweep_bench has unknown keys \['prompts'\]"),
        ({"bench": {"ignore_eos": "yes"}}, "sweep_bench.ignore_eos must be true or false"),
        ({"bench": {"concurrency": 4}}, "sweep_bench.concurrency and sweep_concurrency are both set"),
        ({"concurrency": [0]}, "sweep_concurrency must hold only integers >= 1"),
        ({"slo": {"p99_tpot": 1}}, "sweep_slo has unknown keys"),
        ({"tolerance": 1.0}, "sweep_tolerance must be a fraction"),
        ({"mad_penalty": -1.0}, "sweep_mad_penalty must be a number >= 0"),
        ({"hosts": []}, "sweep_hosts matches no hosts"),
        ({"hosts": ["h1", "h1"]}, "sweep_hosts lists a host more than once"),
        ({"host_profiles": {"h1": {"tp_size": "1"}, "h2": {"tp_size": "2"}}}, "sweep_hosts are not alike"),
        (
            {"steps": [2], "topk": 4, "draft_tokens": 6, "host_args": {"h1": ["--speculative-use-rejection-sampling"]}},
            r"rejection-sampling-topk",
        ),
    ],
)
def test_plan_rejects_bad_input_and_writes_nothing(tmp_path, overrides, message):
    with pytest.raises(SweepInputError, match=message):
        plan_sweep(plan_params(tmp_path / "r", **overrides), {"run_id": "x"}, now=1.0)
    assert not (tmp_path / "r").exists()


def test_the_single_level_defaults_to_the_benchmarks_concurrency(tmp_path):
    plan = plan_sweep(plan_params(tmp_path, concurrency=None, bench={"concurrency": 4}), {"run_id": "x"}, 1.0, False)
    assert [level["concurrency"] for level in plan["levels"]] == [4]
    default = plan_sweep(plan_params(tmp_path, concurrency=None, bench={}), {"run_id": "x"}, 1.0, write=False)
    assert [level["concurrency"] for level in default["levels"]] == [8]


def test_plan_in_check_mode_writes_nothing(tmp_path):
    plan = plan_sweep(plan_params(tmp_path / "r"), {"run_id": "x"}, now=1.0, write=False)
    assert len(plan["pending"]) == 5
    assert not (tmp_path / "r").exists()


def test_the_host_budget_action_reads_the_units_timestamps():
    status = {"ActiveState": "active", "ExecMainStartTimestampMonotonic": "1000000",
              "ActiveEnterTimestampMonotonic": "101000000"}  # fmt: skip
    assert host_budget({"unit_status": status, "role_wait_s": 1260.0, "load_timeout": None})["load_budget_s"] == 260.0


def test_reports_json_csv_markdown_and_plots(tmp_path):
    plan = plan_sweep(plan_params(tmp_path, slo={"p99_tpot_ms": 50.0}), {"run_id": "r1"}, now=1000.0)
    for steps, (low, high) in {1: (100.0, 300.0), 2: (130.0, 420.0), 3: (131.0, 400.0), 4: (120.0, 380.0)}.items():
        record(tmp_path, plan, steps, 1, low)
        record(tmp_path, plan, steps, 8, high)
    record(tmp_path, plan, 5, None, None, levels=[1, 8])
    report = write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": True}, now=1100.0)
    best = {entry["concurrency"]: entry["best"]["steps"] for entry in report["best_per_level"]}
    assert best == {1: 2, 8: 2}  # 130 is within 2 % of 131 and uses fewer steps
    assert report["robust_choice"]["point"]["steps"] == 2
    assert report["sla_choice"]["point"]["heaviest_concurrency"] == 1  # p99 TPOT 80 ms at concurrency 8
    assert report["choice"]["rule"] == "sla"
    expected = ["csv", "json", "markdown", "pareto_png", "png"] if plot_available() else ["csv", "json", "markdown"]
    assert sorted(report["files"]) == expected
    document = json.loads((tmp_path / "results.json").read_text())
    assert len(document["records"]) == 10
    assert document["timing"]["points_run"] == 5 and document["timing"]["levels_run"] == 10
    assert document["timing"]["loads_per_point"] == 1.0
    assert set(document["rules"]) == {"best_per_level", "robust", "sla", "pareto", "apply"}
    failed = [row for row in document["summary"] if row["status"] == "failed"]
    assert [(row["steps"], row["concurrency"]) for row in failed] == [(5, 1), (5, 8)]
    assert "CUDA out of memory" in failed[0]["reason"]
    assert "## Robust choice" in (tmp_path / "results.md").read_text()
    if plot_available():
        assert (tmp_path / "results.png").read_bytes().startswith(b"\x89PNG")
        assert (tmp_path / "results-pareto.png").read_bytes().startswith(b"\x89PNG")
    quiet = write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": False}, now=1100.0)
    assert quiet["plot_skipped"] == "plot: false"


def test_report_needs_a_planned_sweep(tmp_path):
    with pytest.raises(SweepInputError, match=r"holds no sweep\.json"):
        write_reports({"results_dir": str(tmp_path)}, now=1.0)


def test_a_recorded_failure_never_holds_the_api_key(tmp_path):
    plan = plan_sweep(plan_params(tmp_path), {"run_id": "r1"}, now=1000.0)
    journal = [
        "server_args=ServerArgs(model_path='m', api_key='sk-live-123', port=30000)",
        "launch: python -m sglang.launch_server --api-key sk-other-9 --port 30000",
        "config: {'api_key': 'sk-dict-7'}",
        "RuntimeError: CUDA out of memory (key sk-live-123 was set)",
    ]
    failed = record(
        tmp_path, plan, 2, None, None, levels=[1, 8], journal=journal, api_key="sk-live-123",
        error="Restart through the gated chain: unit failed with --api-key=sk-live-123",
    )  # fmt: skip
    written = "".join(path.read_text() for path in sorted((tmp_path / "points").rglob("*.json")))
    returned = json.dumps(failed)
    for text in (written, returned):
        assert "sk-live-123" not in text and "sk-other-9" not in text and "sk-dict-7" not in text
        assert "CUDA out of memory" in text and "********" in text
    assert (
        failed["records"][0]["journal_tail"][0]
        == "server_args=ServerArgs(model_path='m', api_key='********', port=30000)"
    )
