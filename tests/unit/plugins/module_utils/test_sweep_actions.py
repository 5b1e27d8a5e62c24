"""The sweep_report module's actions: plan, budget, record (redacted) and report, on a results directory."""

from __future__ import annotations

import base64
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
from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import progress_document
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
    # each point's levels as sglang_bench takes them, and the budget of its one benchmark of them all
    assert plan["assignment"]["h1"][0]["levels"] == [
        {"concurrency": 1, "num_prompts": 4, "budget_s": 9 * 120.0 + 30},
        {"concurrency": 8, "num_prompts": 8, "budget_s": 3 * 120.0 + 30},
    ]
    assert plan["assignment"]["h1"][0]["budget_s"] == 12 * 120.0 + 60
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
    plots = ["pareto_png", "png"] if plot_available() else []
    expected = sorted(["adaptive_config", "adaptive_csv", "csv", "json", "markdown", *plots])
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


def level_result(concurrency: int, throughput: float, failed: int = 0, started: float = 5000.0) -> dict:
    """One level of a point's sglang_bench call with levels, as the module returns it."""
    errors = [{"error": "/generate returned HTTP 503", "count": failed}] if failed else []
    run = {"completed": 8 - failed, "failed_requests": failed, "output_throughput": throughput, "errors": errors,
           "started_at": started + 1, "ended_at": started + 3}  # fmt: skip
    return {"concurrency": concurrency, "runs": [run], "repeats": 1, "elapsed_s": 3.0, "failed_requests": failed,
            "warmup": {"requests": 0, "failed_requests": 0}, "engine": {"main_pid": 102, "forked_at": 902.0},
            "engine_restarted": False, "level_started_at": started, "level_ended_at": started + 4,
            "budget_s": 100.0, "out_of_budget": False,
            "journal_tail": ["RuntimeError: scheduler died"] if failed else None}  # fmt: skip


def point_params(results_dir, plan: dict, steps: int, **extra) -> dict:
    """What the sweep's record task passes for one point measured at every level by one benchmark."""
    params = {
        "results_dir": str(results_dir),
        "point": next(item for item in plan["assignment"]["h2"] if item["steps"] == steps),
        "levels": [1, 8, 32],
        "host": "h2",
        "run_id": plan["run_id"],
        "point_started_at": 4000.0,
        "started_at": 4990.0,
        "finished_at": 5100.0,
        "apply_s": 0.5,
        "load_s": 9.5,
        "gate": {"healthy": True, "service": {"main_pid": 102}},
        "first_failure": None,
    }
    params.update(extra)
    return params


def test_one_benchmark_of_all_levels_records_each_and_a_failed_level_stops_the_heavier_ones(tmp_path):
    plan = plan_sweep(plan_params(tmp_path, concurrency=[1, 8, 32]), {"run_id": "r1"}, now=1000.0)
    benchmark = {"levels": [level_result(1, 100.0), level_result(8, 300.0, failed=2, started=5010.0)],
                 "levels_not_run": [32], "msg": "sglang_bench: 2 of 3 level(s) run"}  # fmt: skip
    recorded = record_levels(point_params(tmp_path, plan, 2, benchmark=benchmark))
    first, second, third = recorded["records"]
    assert (first["status"], first["started_at"], first["finished_at"]) == ("measured", 5000.0, 5004.0)
    assert first["load"]["load_s"] == 9.5 and first["bench"]["engine"]["main_pid"] == 102
    assert (second["status"], second["stage"], second["started_at"]) == ("failed", "benchmark", 5010.0)
    assert second["reason"] == (
        "benchmark run 1: 2 of 8 requests failed: /generate returned HTTP 503; journal: RuntimeError: scheduler died"
    )
    assert second["journal_tail"] == ["RuntimeError: scheduler died"]
    stops = "not run: the point failed at concurrency 8 (benchmark): " + second["reason"]
    assert (third["status"], third["stage"], third["reason"]) == ("failed", "not run", stops)
    assert (third["started_at"], third["finished_at"], third["journal_tail"]) == (5100.0, 5100.0, [])
    assert recorded["stops_point"] == stops
    assert ResultsDir(str(tmp_path)).done_levels() == {first["point"]["id"]: [1, 8, 32]}


def test_a_timed_out_benchmark_keeps_the_levels_its_progress_file_holds(tmp_path):
    plan = plan_sweep(plan_params(tmp_path, concurrency=[1, 8, 32]), {"run_id": "r1"}, now=1000.0)
    timed_out = {"failed": True, "msg": "Task failed: Timed out after 1290 second(s).", "timedout": {"period": 1290}}
    running = {"concurrency": 8, "level_started_at": 5004.5}
    progress = {"context": {}, "planned": [1, 8, 32], "levels": [level_result(1, 100.0)], "running": running,
                "not_run": [], "finished": False}  # fmt: skip
    slurped = base64.b64encode(json.dumps(progress).encode()).decode()
    recorded = record_levels(point_params(tmp_path, plan, 2, benchmark=timed_out, bench_progress=slurped))
    first, cut, after = recorded["records"]
    assert first["status"] == "measured" and first["repeats"][0]["output_throughput"] == 100.0
    assert (cut["status"], cut["stage"]) == ("failed", "benchmark")
    assert cut["reason"] == "benchmark failed: Task failed: Timed out after 1290 second(s)."
    assert (cut["started_at"], cut["finished_at"]) == (5004.5, 5100.0)  # from when the file says it began
    assert (after["stage"], after["reason"]) == ("not run", recorded["stops_point"])
    # no progress file (the benchmark never started): its failure is the first level's, the rest are not run
    nothing = record_levels(point_params(tmp_path / "other", plan, 2, benchmark=timed_out), write=False)
    assert [(item["stage"], item["started_at"]) for item in nothing["records"]] == [
        ("benchmark", 4990.0), ("not run", 5100.0), ("not run", 5100.0)
    ]  # fmt: skip


def test_a_progress_file_is_read_from_base64_or_text_and_nothing_else():
    document = {"levels": [], "running": None}
    assert progress_document(json.dumps(document)) == document
    assert progress_document(base64.b64encode(json.dumps(document).encode()).decode()) == document
    for unreadable in (None, "", "not json", base64.b64encode(b"[1, 2]").decode(), json.dumps({"no": "levels"})):
        assert progress_document(unreadable) is None


JOURNAL = ["launch: python -m sglang.launch_server --api-key sk-live-1", "RuntimeError: scheduler died"]


def leftover(plan: dict, steps: int, levels: list, running=None, run_id=None) -> str:
    """A progress file that a killed sweep's benchmark left on h2, as ansible.builtin.slurp returns it."""
    point = next(item for item in plan["assignment"]["h2"] if item["steps"] == steps)
    # numbers as text too: sglang_bench keeps the context as the task gave it
    context = {"run_id": run_id or plan["run_id"], "point": point, "host": "h2", "point_started_at": "4000.0",
               "apply_s": 0.5, "load_s": "9.5", "gate": {"healthy": True, "service": {"main_pid": 102}},
               "first_failure": None}  # fmt: skip
    document = {"context": context, "planned": [1, 8, 32], "levels": levels, "running": running, "not_run": [],
                "finished": False, "updated_at": 5050.0}  # fmt: skip
    return base64.b64encode(json.dumps(document).encode()).decode()


def test_a_resumed_sweep_first_records_the_levels_a_killed_run_left_on_the_hosts(tmp_path):
    params = plan_params(tmp_path, concurrency=[1, 8, 32])
    plan = plan_sweep(params, {"run_id": "r1"}, now=1000.0)
    steps2 = plan["assignment"]["h2"][0]["id"]
    leftovers = [
        leftover(plan, 2, [level_result(1, 100.0)], running={"concurrency": 8, "level_started_at": 5004.5}),
        leftover(plan, 4, [level_result(1, 90.0), dict(level_result(8, 0.0, failed=8), journal_tail=JOURNAL)]),
        leftover(plan, 4, [level_result(1, 1.0)], run_id="another-sweep"),  # not a run of this results directory
        "garbage",
    ]
    dry = plan_sweep(dict(params, resume=True, leftover_progress=leftovers), {"run_id": "r2"}, 2000.0, write=False)
    assert dry["recovered"] == {steps2: [1], plan["assignment"]["h2"][1]["id"]: [1, 8, 32]}
    assert not (tmp_path / "points" / steps2).exists()
    resumed = plan_sweep(dict(params, resume=True, leftover_progress=leftovers), {"run_id": "r2"}, now=2000.0)
    assert resumed["recovered"] == dry["recovered"]
    # steps 2 is measured again from the level the killed benchmark did not end; steps 4 failed at 8, so it is done
    pending = {entry["steps"]: [level["concurrency"] for level in entry["levels"]]
               for entries in resumed["assignment"].values() for entry in entries}  # fmt: skip
    assert pending == {1: [1, 8, 32], 2: [8, 32], 3: [1, 8, 32], 5: [1, 8, 32]}
    records = {
        (record["point"]["steps"], record["concurrency"]): record
        for record in ResultsDir(str(tmp_path)).level_records()
    }
    assert records[(2, 1)]["run_id"] == "r1" and records[(2, 1)]["status"] == "measured"
    assert (records[(2, 1)]["load"]["started_at"], records[(2, 1)]["load"]["load_s"]) == (4000.0, 9.5)
    assert records[(2, 1)]["host"] == "h2" and records[(2, 1)]["started_at"] == 5000.0
    assert (records[(4, 8)]["stage"], records[(4, 32)]["stage"]) == ("benchmark", "not run")
    assert records[(4, 8)]["journal_tail"][0] == "launch: python -m sglang.launch_server --api-key ********"
    # recorded once: a second resume finds them on the controller already
    again = plan_sweep(dict(params, resume=True, leftover_progress=leftovers), {"run_id": "r3"}, now=3000.0)
    assert again["recovered"] == {}
    retried = plan_sweep(dict(params, resume=True, retry_failed=True), {"run_id": "r4"}, now=4000.0)
    assert [level["concurrency"] for level in retried["assignment"]["h2"][1]["levels"]] == [8, 32]
    fresh = plan_sweep(dict(params, leftover_progress=leftovers), {"run_id": "r5"}, now=5000.0)
    assert fresh["recovered"] == {}  # without resume, earlier results (and what the hosts kept) are set aside
