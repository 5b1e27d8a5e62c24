"""tests/bench/write_performance.py: every number from the raw files, the same page from the same files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SPEC = importlib.util.spec_from_file_location("write_performance", HERE.parent / "write_performance.py")
write_performance = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(write_performance)


def test_the_committed_page_is_what_the_committed_data_gives():
    run, files = write_performance.load_run(None)
    assert write_performance.OUTPUT.read_text() == write_performance.render(run, files), (
        "docs/performance.md differs from what tests/bench/write_performance.py computes from "
        f"docs/performance/{run}/: run it and commit the page"
    )


def test_without_a_committed_run_the_page_publishes_no_figure(monkeypatch, tmp_path):
    monkeypatch.setattr(write_performance, "DATA", tmp_path / "none")
    run, files = write_performance.load_run(None)
    page = write_performance.render(run, files)
    assert (run, files) == (None, {})
    assert "No benchmark run is committed yet, so this page publishes no figure." in page
    for title, _compute, command in write_performance.BENCHMARKS.values():
        assert f"| {title} | `{command}` |" in page
    assert "| met |" not in page and "**missed**" not in page


def test_a_set_of_files_from_several_commits_runs_or_a_dirty_tree_publishes_no_figure(data_dir):
    run = data_dir / "performance" / "20260102T030405Z"
    assert write_performance.refused(*write_performance.load_run(None)) == ""  # one run, one clean commit
    restart = json.loads((run / "restart.json").read_text())
    (run / "restart.json").write_text(json.dumps(restart | {"commit": {"sha": "f" * 40, "dirty": True}}))
    name, files = write_performance.load_run(None)
    why = (
        "docs/performance/20260102T030405Z/ is not one run at one clean commit: they were measured at 2 commits "
        "(restart at ffffffffffff, rolling_deploy at 0123456789ab); restart measured with uncommitted changes"
    )
    assert write_performance.refused(name, files) == why
    page = write_performance.render(name, files)
    assert page.startswith(f"# Performance\n\n**No figure is published.** {why}.")
    assert "| met |" not in page and "**missed**" not in page and "median" not in page
    assert write_performance.main([]) == 1  # the writer says so, and the page it wrote says why
    assert write_performance.OUTPUT.read_text() == page
    (run / "restart.json").write_text(json.dumps(restart | {"run": "20260101T000000Z"}))
    assert "the files come from the runs 20260101T000000Z, 20260102T030405Z" in write_performance.refused(
        *write_performance.load_run(None)
    )


def benchmark(name: str, settings: dict, samples: list, **extra) -> dict:
    return {
        "benchmark": name,
        "run": "20260102T030405Z",
        "commit": {"sha": "0123456789abcdef" * 2 + "01234567", "dirty": False},
        "machine": {"cores": 2, "memory_gib": 23.4, "kernel": "6.1.0", "python": "3.11.2",
                    "ansible": "ansible [core 2.19.4]", "load_average_at_start": [1.5, 1.2, 1.0]},
        "lab": {"name": "bench", "hosts": 12, "gpus_per_host": 2},
        "settings": settings,
        "rounds": 3,
        "started": 1767322800.0,
        "finished": 1767323100.0,
        "complete": True,
        "skipped": None,
        "parts": [{"name": "round 1", "start": 1767322800.0, "stop": 1767322860.0}],
        "samples": samples,
        "notes": {},
    } | extra  # fmt: skip


def restart_samples() -> list:
    samples = []
    # chain / operator at 5 s load: 11/10, 12/10, 13/10; the checked script served after 6 s and ended after 11 s;
    # the baseline's second run failed
    for round_number, chain in enumerate((11.0, 12.0, 13.0)):
        common = {"round": round_number, "load_s": 5.0}
        samples += [
            common | {"side": "collection", "seconds": chain, "process_start": 0, "process_stop": chain, "ok": True},
            common | {"side": "operator", "seconds": 10.0, "ok": True},
            common | {"side": "operator_checked", "seconds": 11.0, "start": 0.0, "serving": 6.0, "ok": True},
            common | {"side": "baseline", "seconds": chain, "ok": round_number != 1, "error": "boom"},
        ]  # fmt: skip
    return samples


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    run = tmp_path / "performance" / "20260102T030405Z"
    run.mkdir(parents=True)
    (run / "restart.json").write_text(
        json.dumps(benchmark("restart", {"loads_s": [5.0], "baseline_commit": "d" * 40}, restart_samples()))
    )
    (run / "rolling_deploy.json").write_text(json.dumps(benchmark("rolling_deploy", {}, [], skipped="no drain yet")))
    monkeypatch.setattr(write_performance, "DATA", tmp_path / "performance")
    monkeypatch.setattr(write_performance, "OUTPUT", tmp_path / "performance.md")
    return tmp_path


@pytest.mark.parametrize(
    ("rounds", "says"),
    [
        (4, "- Runs planned per benchmark: 4; the targets ask for the median of at least 5.\n"),
        (5, "- Runs planned per benchmark: 5.\n"),
    ],
)
def test_the_page_says_how_many_runs_were_planned_and_how_to_measure_the_same_again(rounds, says):
    files = {"probe": benchmark("probe", {}, [], rounds=rounds), "reap": benchmark("reap", {}, [], rounds=rounds)}
    page = "".join(write_performance.header("20260102T030405Z", files))
    assert says in page
    assert f"Measure again: `LLMOPS_BENCH_RUNS={rounds} make bench` as root." in page


def test_figures_are_medians_of_the_runs_with_their_spread_and_the_failed_runs_left_out(data_dir):
    _run, files = write_performance.load_run(None)
    figures = {figure.key: figure for figure in write_performance.restart_figures(files["restart"])}
    ratio = figures["restart_5s"]
    assert ratio.values == pytest.approx([1.1, 1.2, 1.3])
    assert ratio.stats == pytest.approx({"min": 1.1, "median": 1.2, "max": 1.3, "n": 3})
    assert ratio.met is None  # the plain script checks less: no target
    checked = figures["restart_5s_checked"]
    assert checked.values == pytest.approx([1.0, 12 / 11, 13 / 11])
    assert checked.met == write_performance.INCONCLUSIVE  # <= 1.06 at 5 s; the runs fall on both sides of it
    assert "the stability window: 5 s on both sides" in checked.context
    # 5 s is the longest load measured here: chain - script 1 s (median), script 11 s, so 1 + 1 / (11 + 115) at 120 s.
    assert "projected, not measured, from the chain's 1.00 s beyond the script at 5 s: the ratio at loads of " \
           "120 s: 1.01, 300 s: 1.00" in checked.context  # fmt: skip
    against_baseline = figures["restart_5s_baseline"]
    assert against_baseline.values == pytest.approx([1.0, 1.0])  # the failed baseline run is not a sample
    assert any("1 run(s) of side baseline, load_s 5.0 failed: boom" in line for line in against_baseline.context)


@pytest.mark.parametrize(
    ("values", "shown"),
    [([0, 0, 0, 0], "0 [0 to 0], 4 runs"), ([0, 1, 2, 3], "1.50 [0 to 3], 4 runs"), ([1, 2, 4], "2 [1 to 4], 3 runs")],
)
def test_a_count_over_an_even_number_of_runs_shows_as_a_count_when_its_median_is_whole(values, shown):
    assert write_performance.show(write_performance.spread(values)) == shown


@pytest.mark.parametrize(
    ("values", "at_most", "at_least"),
    [
        ([0.8, 0.9, 1.0], True, False),
        ([1.1, 1.2], False, True),
        ([0.9, 1.0, 1.1], "inconclusive", "inconclusive"),
    ],
)
def test_a_target_is_met_by_every_run_missed_by_every_run_or_else_inconclusive(values, at_most, at_least):
    stats = write_performance.spread(values)
    assert write_performance.at_most(1.0)(stats, values) == at_most
    assert write_performance.at_least(1.05)(stats, values) == at_least


def test_the_page_is_the_same_from_the_same_files_and_names_what_was_not_measured(data_dir):
    assert write_performance.main([]) == 0
    first = (data_dir / "performance.md").read_text()
    assert write_performance.main(["--check"]) == 0
    assert write_performance.main([]) == 0
    assert (data_dir / "performance.md").read_text() == first
    assert "| Restart at 5 s simulated load: the role's chain / systemctl restart and a /health loop | " \
           "1.20 [1.10 to 1.30], 3 runs | none: the script checks less (below, the same checks) | no target |" \
           in first  # fmt: skip
    assert "| Restart at 5 s simulated load: the role's chain / the operator's script with the same checks | " \
           "1.09 [1.00 to 1.18], 3 runs | <= 1.06 | inconclusive (the runs fall on both sides of the target) |" \
           in first  # fmt: skip
    assert "- Rolling deploy under load: not measured: no drain yet.\n" in first
    assert "Measured 2026-01-02 03:00 UTC to 2026-01-02 03:05 UTC" in first
    (data_dir / "performance.md").write_text(first + "edited\n")
    assert write_performance.main(["--check"]) == 1


def test_the_baseline_comparison_uses_the_chain_with_the_baselines_gate_when_it_was_measured(data_dir):
    _run, files = write_performance.load_run(None)
    data = files["restart"]
    for round_number, same_gate in enumerate((8.0, 9.0, 10.0)):
        data["samples"].append({"round": round_number, "load_s": 5.0, "side": "same_gate", "seconds": same_gate})
    figures = {figure.key: figure for figure in write_performance.restart_figures(data)}
    against_baseline = figures["restart_5s_baseline"]
    # same_gate / baseline in the rounds where the baseline succeeded: 8/11 and 10/13
    assert against_baseline.values == pytest.approx([8 / 11, 10 / 13])
    assert against_baseline.met is True
    assert "with the probe gate's stability window set to 0 s" in against_baseline.numerator
    assert any(line.startswith("this commit's chain with its own 5 s window / the baseline's: 1.00") for line in
               against_baseline.context)  # fmt: skip
    window = [line for line in figures["restart_5s"].context if "window" in line]
    assert window == [
        "of which the probe gate's stability window (the same chain with window 0 s, run alongside): "
        "3.00 s [3.00 s to 3.00 s], 3 runs",
        "the same chain with window 0 s / the operator's script: 0.90 [0.80 to 1.00], 3 runs",
        "the floor a 5 s stability window sets, (script + window) / script: the least any chain with it can take "
        "against this script, since the window starts at the first /health 200, where the script ends: "
        "1.50 [1.50 to 1.50], 3 runs",
    ]  # fmt: skip
    # Time to serving: the chain with window 0 s (8, 9, 10 s) minus the checked script up to its generation (6 s).
    serving = figures["restart_5s_serving"]
    assert serving.values == pytest.approx([2.0, 3.0, 4.0]) and serving.met is False


def test_the_chain_steps_and_ansibles_share_come_from_the_module_result(data_dir):
    _run, files = write_performance.load_run(None)
    data = files["restart"]
    data["settings"]["stability_window_s"] = 2
    for sample in write_performance.samples(data, side="collection"):
        sample["gate_elapsed_s"] = sample["seconds"] - 0.5
        sample["chain_steps"] = [{"name": "stop", "elapsed_s": 1.0}, {"name": "gate", "elapsed_s": 7.0},
                                 {"name": "gate", "elapsed_s": 2.0}]  # fmt: skip
    context = {figure.key: figure for figure in write_performance.restart_figures(data)}["restart_5s"].context
    assert "the chain's steps as the module timed them (medians of 3 runs): stop 1.00 s, gate 9.00 s" in context
    assert "Ansible's share of the chain's task (its wall time minus the module's own elapsed time): " \
           "0.50 s [0.50 s to 0.50 s], 3 runs" in context  # fmt: skip
    assert any("a 2 s stability window sets" in line and ": 1.20 [1.20 to 1.20], 3 runs" in line for line in context)


def rolling_sample(round_number: int, side: str, outcomes: list) -> dict:
    """A round whose load began at 0 and whose deploy ran from 60 s to 120 s: 24 s requests, one steady, then one
    started during the deploy per outcome (times in ms from the start of the load)."""
    requests = ["1000 25000 ok"] + [
        f"{61000 + index} {85000 + index} {outcome}" for index, outcome in enumerate(outcomes)
    ]
    times = {"start": 60.0, "stop": 120.0, "seconds": 60.0, "load_start": 0.0}
    return {"round": round_number, "side": side, **times, "requests": requests}


def test_the_rolling_control_counts_the_requests_lost_without_drains_in_the_same_run():
    samples = []
    for round_number, lost in enumerate((["failed"], ["truncated", "failed"], [])):
        samples += [
            rolling_sample(round_number, "with_drain", ["ok", "ok"]),
            rolling_sample(round_number, "without_drain", ["ok", *lost]),
        ]
    data = benchmark("rolling_deploy", {"max_new_tokens": 480, "token_latency_ms": 50, "steady_s": 60}, samples)
    figures = {figure.key: figure for figure in write_performance.rolling_figures(data)}
    assert figures["rolling_failed"].values == [0, 0, 0] and figures["rolling_failed"].met is True
    # The third run's control lost nothing: that run cannot show what the drains buy.
    assert figures["rolling_control"].values == [1, 2, 0]
    assert figures["rolling_control"].met == write_performance.INCONCLUSIVE
    assert "480 tokens at 50 ms each" in figures["rolling_failed"].compares
    assert figures["rolling_p99"].values == pytest.approx([1.0, 1.0, 1.0])
    assert "in flight at its stops" not in figures["rolling_control"].compares


def test_the_rolling_control_shows_the_requests_its_stops_held():
    samples = [
        rolling_sample(0, "with_drain", ["ok"]) | {"in_flight_at_stop": {"h1": [0], "h2": [0]}},
        rolling_sample(0, "without_drain", ["failed"]) | {"in_flight_at_stop": {"h1": [6], "h2": [7]}},
        rolling_sample(1, "without_drain", ["ok"]) | {"in_flight_at_stop": {"h1": [0], "h2": [0]}},
    ]
    data = benchmark("rolling_deploy", {"max_new_tokens": 480, "token_latency_ms": 50, "steady_s": 60}, samples)
    figures = {figure.key: figure for figure in write_performance.rolling_figures(data)}
    assert figures["rolling_control"].compares.endswith("; requests in flight at its stops, per run: 13, 0")


def sweep_data() -> dict:
    """Two runs of a 2-point sweep: the playbook's points phase 40 s and 44 s, the lean loop's 36 s, SGLang's
    bench_speculative.py as a script 80 s; one load of 5 s per point and the final restore."""
    bench = {
        "warmup": {"start": 0.0, "stop": 1.0},
        "levels": [{"concurrency": 1, "runs": [{"start": 1.0, "stop": 3.0}]}],
    }
    samples = []
    loop_points = [{"start": 0.0, "bench": bench}, {"start": 18.0, "bench": bench}, {"restore": True, "start": 36.0}]
    for round_number, points_phase in enumerate((40.0, 44.0)):
        loads = [{"fork": 10.0 * index, "ready": 10.0 * index + 5} for index in range(3)]
        samples += [
            {"round": round_number, "side": "one_host", "seconds": 60.0, "loads": loads,
             "points_start": 100.0, "points_stop": 100.0 + points_phase},
            {"round": round_number, "side": "operator", "seconds": 50.0,
             "points": loop_points},
            {"round": round_number, "side": "bench_speculative", "seconds": 80.0, "points": []},
        ]  # fmt: skip
    settings = {"steps": [1, 2], "levels": [1], "load_s": 5, "sweep_repeats": 1, "bench": {"max_new_tokens": 32},
                "requests": {"per_level": [4], "warmup": 1},
                "stability_window_s": {"points": 0, "final_restore": 5}}  # fmt: skip
    return benchmark("sweep", settings, samples)


def test_the_sweep_is_compared_with_bench_speculative_as_a_script_and_its_cost_per_point_with_the_loops():
    figures = {figure.key: figure for figure in write_performance.sweep_figures(sweep_data())}
    assert figures["sweep_vs_bench_speculative"].values == pytest.approx([0.75, 0.75])
    assert figures["sweep_vs_bench_speculative"].met is False  # target <= 0.7
    # (40 - 36) / 2 points and (44 - 36) / 2 points
    assert figures["sweep_point_overhead"].values == pytest.approx([2.0, 4.0])
    assert figures["sweep_point_overhead"].met is False  # target <= 1.5 s
    assert figures["sweep_point_overhead"].target == "<= 1.5 s"
    # At longer loads each of the 3 engine starts (2 points and the restore) on either side takes that much longer.
    assert "projected, not measured, from the 10.0 s measured at 5 s: the ratio at loads of 60 s: 1.05, " \
           "120 s: 1.03, 300 s: 1.01" in figures["sweep_vs_loop"].context  # fmt: skip
    assert "projected, not measured, from the -20.0 s measured at 5 s: the ratio at loads of 60 s: 0.92, " \
           "120 s: 0.95, 300 s: 0.98" in figures["sweep_vs_bench_speculative"].context  # fmt: skip


def test_the_sweep_at_a_realistic_load_is_measured_against_the_lean_loop_and_projected_only_beyond_it():
    data = sweep_data()
    data["settings"]["load_s"] = 60
    data["samples"] = [sample for sample in data["samples"] if sample["side"] != "bench_speculative"]
    figures = {figure.key: figure for figure in write_performance.sweep_realistic_figures(data)}
    assert list(figures) == ["sweep_vs_loop", "sweep_point_overhead", "sweep_vs_engine", "sweep_levels"]
    assert figures["sweep_vs_loop"].title == "Sweep playbook / a lean shell loop, 60 s loads"
    assert figures["sweep_vs_loop"].values == pytest.approx([1.2, 1.2])
    assert "projected, not measured, from the 10.0 s measured at 60 s: the ratio at loads of 120 s: 1.04, " \
           "300 s: 1.01" in figures["sweep_vs_loop"].context  # fmt: skip
    assert figures["sweep_point_overhead"].values == pytest.approx([2.0, 4.0])


def test_a_run_measured_in_two_sittings_at_one_commit_says_when_each_was():
    later = 1767322800.0 + 6 * 3600
    files = {
        "probe": benchmark("probe", {}, [], rounds=5),
        "reap": benchmark("reap", {}, [], rounds=5, started=later, finished=later + 600),
    }
    assert write_performance.mixed_or_dirty("20260102T030405Z", files) == ""
    page = "".join(write_performance.header("20260102T030405Z", files))
    assert "- Measured in 2 sittings (2026-01-02 03:00 UTC to 2026-01-02 03:05 UTC; 2026-01-02 09:00 UTC to " \
           "2026-01-02 09:10 UTC), each benchmark within one, every benchmark at commit" in page  # fmt: skip
    files["reap"] |= {"started": 1767323400.0, "finished": 1767324000.0}
    page = "".join(write_performance.header("20260102T030405Z", files))
    assert "- Measured 2026-01-02 03:00 UTC to 2026-01-02 03:20 UTC, every benchmark at commit" in page


@pytest.mark.parametrize(
    ("task_files", "says", "start_up"),
    [
        ({"playbooks/tasks/sweep_point.yml": 1.0}, "one benchmark run for all its levels and one record", "per point"),
        ({"playbooks/tasks/sweep_level.yml": 1.0}, "a module run per level and per record", "per level"),
    ],
)
def test_the_sweep_figures_say_how_the_measured_sweep_called_its_benchmark(task_files, says, start_up):
    data = sweep_data()
    for sample in write_performance.samples(data, side="one_host"):
        sample["task_seconds_by_file"] = task_files
    figures = {figure.key: figure for figure in write_performance.sweep_figures(data)}
    assert says in figures["sweep_vs_loop"].limits
    assert figures["sweep_point_overhead"].limits == f"the restart chain's steps and {says}, each an Ansible task"
    assert figures["sweep_levels"].limits.endswith(f"the bench module's start-up {start_up}")


def test_the_noop_deploy_is_compared_with_a_ping_play_on_the_same_hosts():
    scaling = "this commit at 1, 6 and 12 hosts"
    samples = [
        {"round": 0, "side": side, "hosts": hosts, "set": scaling, "seconds": seconds, "up_to_date": True}
        for side, per_host in (("collection", 0.5), ("ping", 0.25))
        for hosts in (1, 6, 12)
        for seconds in [3.0 + per_host * hosts if side == "collection" else 2.0 + per_host * hosts]
    ]
    data = benchmark("noop_deploy", {"baseline_commit": "d" * 40, "sizes": [1, 6, 12]}, samples)
    figures = {figure.key: figure for figure in write_performance.noop_figures(data)}
    assert figures["noop_floor"].values == pytest.approx([9.0 / 5.0]) and figures["noop_floor"].met is True
    assert figures["noop_marginal"].values == pytest.approx([0.5])
    assert figures["noop_marginal_floor"].values == pytest.approx([2.0]) and figures["noop_marginal_floor"].met is False


def slow_probe(round_number: int, side: str, failed_tier=None) -> dict:
    return {"round": round_number, "side": side, "start": 0.0, "stop": 6.0, "seconds": 6.0, "reason": "",
            "healthy": failed_tier is None, "failed_tier": failed_tier, "hung": failed_tier == "progress"}  # fmt: skip


def test_a_hang_verdict_on_the_slow_engine_in_any_run_misses_the_target():
    settings = {"window_s": 5.0, "tokens_per_s": 2.0, "busy_clients": 4}
    samples = []
    for round_number in range(3):
        samples += [
            {"round": round_number, "side": "operator", "start": 0.0, "stop": 1.2, "seconds": 1.2, "status": "200"},
            slow_probe(round_number, "collection"),
            slow_probe(round_number, "tier"),
        ]
    (figure,) = write_performance.progress_slow_figures(benchmark("progress_slow", settings, samples))
    assert figure.values == [0, 0, 0] and figure.met is True
    assert "decodes 2 tokens per second" in figure.compares
    assert any("answered 200 after 1.20 s" in line for line in figure.context), figure.context

    samples[-1] = slow_probe(2, "tier", failed_tier="progress")
    (figure,) = write_performance.progress_slow_figures(benchmark("progress_slow", settings, samples))
    assert figure.values == [0, 0, 1] and figure.met is False


def test_the_restart_is_compared_with_the_checked_script_over_ssh_when_the_run_has_it():
    settings = {"loads_s": [5.0], "baseline_commit": "d" * 40}
    keys = {
        figure.key for figure in write_performance.restart_figures(benchmark("restart", settings, restart_samples()))
    }
    assert "restart_5s_checked" in keys and "restart_5s_checked_ssh" not in keys
    # ssh restart_checked.sh from the controller: 11.5 s, serving 6.5 s after the ssh began; the chain at window 0: 7 s
    samples = restart_samples()
    for round_number in range(3):
        common = {"round": round_number, "load_s": 5.0, "ok": True}
        samples += [
            common | {"side": "operator_checked_ssh", "seconds": 11.5, "start": 100.0, "serving": 106.5},
            common | {"side": "same_gate", "seconds": 7.0},
        ]
    figures = {f.key: f for f in write_performance.restart_figures(benchmark("restart", settings, samples))}
    assert figures["restart_5s_checked_ssh"].values == pytest.approx([11 / 11.5, 12 / 11.5, 13 / 11.5])
    assert figures["restart_5s_serving_ssh"].values == pytest.approx([0.5, 0.5, 0.5])
    assert figures["restart_5s_serving_ssh"].met is True


def test_reap_and_probe_are_compared_with_the_operators_script_on_the_host_and_over_ssh():
    reap, probe = [], []
    for round_number in range(3):
        common = {"round": round_number}
        reap += [
            common | {"side": "operator", "seconds": 2.4, "release_lag_s": 0.4},
            common | {"side": "operator_ssh", "seconds": 2.6, "ok": True},
            common | {"side": "collection", "seconds": 2.9, "module_elapsed_s": 2.5 + round_number / 10, "ok": True},
            common | {"side": "ansible_task", "seconds": 0.4},
        ]
        probe += [
            common | {"side": "operator", "seconds": 0.5, "ok": True},
            common | {"side": "operator_ssh", "seconds": 0.7, "ok": True},
            common | {"side": "collection", "seconds": 1.1, "module_elapsed_s": 0.6, "ok": True},
        ]
    figures = {f.key: f for f in write_performance.reap_figures(benchmark("reap", {"grace_s": 2.0}, reap))}
    assert figures["reap_module"].values == pytest.approx([0.1, 0.2, 0.3])
    assert figures["reap_module"].met == write_performance.INCONCLUSIVE
    assert figures["reap_task_vs_ssh"].values == pytest.approx([0.3, 0.3, 0.3])
    assert figures["reap_task_vs_ssh"].met is True
    figures = {f.key: f for f in write_performance.probe_figures(benchmark("probe", {}, probe))}
    assert figures["probe_module"].values == pytest.approx([0.1, 0.1, 0.1]) and figures["probe_module"].met is True
    assert figures["probe_task_vs_ssh"].values == pytest.approx([0.4, 0.4, 0.4])
    assert figures["probe_task_vs_ssh"].met is False


def test_the_sweep_scaling_is_a_share_of_the_bound_for_its_points_and_hosts():
    settings = {"scaling": {"steps": list(range(1, 13)), "hosts": 3, "forks": 16}}
    samples = []
    for round_number, three in enumerate((100.0, 110.0, 130.0)):
        samples += [
            {"round": round_number, "side": "scaling_one_host", "seconds": 260.0},
            {"round": round_number, "side": "scaling_three_hosts", "seconds": three},
        ]
    assert write_performance.scaling_bound(12, 3) == pytest.approx(2.6)
    (figure,) = write_performance.sweep_scaling_figures(benchmark("sweep", settings, samples))
    assert figure.values == pytest.approx([1.0, 260 / 110 / 2.6, 2 / 2.6])
    assert figure.met == write_performance.INCONCLUSIVE  # 0.91 and 1.0 meet 0.85, 0.77 does not
    (figure,) = write_performance.sweep_scaling_figures(benchmark("sweep", {}, []))
    assert figure.stats is None and "12 points on 3 hosts" in figure.title
