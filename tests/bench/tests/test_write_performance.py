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
    # chain / operator at 10 s load: 11/10, 12/10, 13/10; the baseline's second run failed
    for round_number, chain in enumerate((11.0, 12.0, 13.0)):
        common = {"round": round_number, "load_s": 10.0}
        samples += [
            common | {"side": "collection", "seconds": chain, "process_start": 0, "process_stop": chain, "ok": True},
            common | {"side": "operator", "seconds": 10.0, "ok": True},
            common | {"side": "baseline", "seconds": chain, "ok": round_number != 1, "error": "boom"},
        ]  # fmt: skip
    return samples


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    run = tmp_path / "performance" / "20260102T030405Z"
    run.mkdir(parents=True)
    (run / "restart.json").write_text(
        json.dumps(benchmark("restart", {"loads_s": [10.0], "baseline_commit": "d" * 40}, restart_samples()))
    )
    (run / "rolling_deploy.json").write_text(json.dumps(benchmark("rolling_deploy", {}, [], skipped="no drain yet")))
    monkeypatch.setattr(write_performance, "DATA", tmp_path / "performance")
    monkeypatch.setattr(write_performance, "OUTPUT", tmp_path / "performance.md")
    return tmp_path


def test_figures_are_medians_of_the_runs_with_their_spread_and_the_failed_runs_left_out(data_dir):
    _run, files = write_performance.load_run(None)
    figures = {figure.key: figure for figure in write_performance.restart_figures(files["restart"])}
    ratio = figures["restart_10s"]
    assert ratio.values == pytest.approx([1.1, 1.2, 1.3])
    assert ratio.stats == pytest.approx({"min": 1.1, "median": 1.2, "max": 1.3, "n": 3})
    assert ratio.met is False  # target <= 1.1
    against_baseline = figures["restart_10s_baseline"]
    assert against_baseline.values == pytest.approx([1.0, 1.0])  # the failed baseline run is not a sample
    assert any("1 run(s) of side baseline, load_s 10.0 failed: boom" in line for line in against_baseline.context)


def test_the_page_is_the_same_from_the_same_files_and_names_what_was_not_measured(data_dir):
    assert write_performance.main([]) == 0
    first = (data_dir / "performance.md").read_text()
    assert write_performance.main(["--check"]) == 0
    assert write_performance.main([]) == 0
    assert (data_dir / "performance.md").read_text() == first
    assert "| Restart at 10 s simulated load: the role's chain / systemctl restart and a /health loop | " \
           "1.20 [1.10 to 1.30], 3 runs | <= 1.1 | **missed** |" in first  # fmt: skip
    assert "- Rolling deploy under load: not measured: no drain yet.\n" in first
    assert "Measured 2026-01-02 03:00 UTC to 2026-01-02 03:05 UTC" in first
    (data_dir / "performance.md").write_text(first + "edited\n")
    assert write_performance.main(["--check"]) == 1


def test_the_baseline_comparison_uses_the_chain_with_the_baselines_gate_when_it_was_measured(data_dir):
    _run, files = write_performance.load_run(None)
    data = files["restart"]
    for round_number, same_gate in enumerate((8.0, 9.0, 10.0)):
        data["samples"].append({"round": round_number, "load_s": 10.0, "side": "same_gate", "seconds": same_gate})
    figures = {figure.key: figure for figure in write_performance.restart_figures(data)}
    against_baseline = figures["restart_10s_baseline"]
    # same_gate / baseline in the rounds where the baseline succeeded: 8/11 and 10/13
    assert against_baseline.values == pytest.approx([8 / 11, 10 / 13])
    assert against_baseline.met is True
    assert "with the probe gate's stability window set to 0 s" in against_baseline.numerator
    assert any(line.startswith("this commit's chain with its own 5 s window / the baseline's: 1.00") for line in
               against_baseline.context)  # fmt: skip
    window = [line for line in figures["restart_10s"].context if "window" in line]
    assert window == [
        "of which the probe gate's stability window (the same chain with window 0 s, run alongside): "
        "3.00 s [3.00 s to 3.00 s], 3 runs",
        "the same chain with window 0 s / the operator's script: 0.90 [0.80 to 1.00], 3 runs",
        "the floor a 5 s stability window sets, (script + window) / script: the least any chain with it can take "
        "against this script, since the window starts at the first /health 200, where the script ends: "
        "1.50 [1.50 to 1.50], 3 runs",
        "the longest window with which even a chain that cost nothing else would meet <= 1.1, (1.1 - 1) x script: "
        "1.00 s [1.00 s to 1.00 s], 3 runs",
    ]  # fmt: skip


def test_the_chain_steps_and_ansibles_share_come_from_the_module_result(data_dir):
    _run, files = write_performance.load_run(None)
    data = files["restart"]
    data["settings"]["stability_window_s"] = 2
    for sample in write_performance.samples(data, side="collection"):
        sample["gate_elapsed_s"] = sample["seconds"] - 0.5
        sample["chain_steps"] = [{"name": "stop", "elapsed_s": 1.0}, {"name": "gate", "elapsed_s": 7.0},
                                 {"name": "gate", "elapsed_s": 2.0}]  # fmt: skip
    context = {figure.key: figure for figure in write_performance.restart_figures(data)}["restart_10s"].context
    assert "the chain's steps as the module timed them (medians of 3 runs): stop 1.00 s, gate 9.00 s" in context
    assert "Ansible's share of the chain's task (its wall time minus the module's own elapsed time): " \
           "0.50 s [0.50 s to 0.50 s], 3 runs" in context  # fmt: skip
    assert any("a 2 s stability window sets" in line and ": 1.20 [1.20 to 1.20], 3 runs" in line for line in context)
