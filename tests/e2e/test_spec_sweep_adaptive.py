"""From a sweep to SGLang's adaptive speculative decoding on lab hosts: the sweep derives the adaptive config from
its per-level results and proves it in the same run against the best static points; a top-k 2 sweep is refused
for adaptive and still reports the static choice; deploy.yml rolls the sweep's config out and rollback.yml removes
it; a config SGLang would reject is refused in preflight, naming the entry.

The sweep runs the engine of test_spec_sweep.py (50 ms per decode step, 1 s loads) with short loads; the proof runs
two rounds on the first host. The lab's model (tests/lab/README.md) puts the best steps at 4, 3, 2 and 2 at
concurrency 1, 4, 16 and 32.
"""

from __future__ import annotations

import json

import pytest
from labutil import DEPLOY, FLEET_KNOWN_GOOD, ROLLBACK, fleet_of, outcomes, output
from labutil import run_playbook as run
from test_spec_sweep import PLAYBOOK, ROLE_VARS, deploy, run_sweep, sweep_vars

pytestmark = pytest.mark.lab

LEVELS = [1, 4, 16, 32]
FLEET_DROPIN = "/etc/systemd/system/sglang.service.d/40-adaptive.conf"
FLEET_CONFIG = "/etc/llmops/sglang-adaptive.json"
SERVER_ADAPTIVE = (
    "import json, urllib.request; "
    "i = json.load(urllib.request.urlopen('http://127.0.0.1:30000/server_info', timeout=5)); "
    "print(json.dumps([i['speculative_adaptive'], i['speculative_adaptive_config']]))"
)
# The static base (steps 3, top-k 1); with an adaptive config the base leaves steps and top-k to SGLang (it starts
# at the middle candidate, top-k 1), so the base unit alone is valid too.
EAGLE = {
    "sglang_service_speculative_algorithm": "EAGLE",
    "sglang_service_speculative_num_steps": 3,
    "sglang_service_speculative_eagle_topk": 1,
}
ADAPTIVE = dict(EAGLE, sglang_service_speculative_num_steps=None, sglang_service_speculative_eagle_topk=None)


@pytest.fixture(scope="module")
def adaptive_sweep(lab, tmp_path_factory):
    """Steps 1-6 x concurrency 1, 4, 16, 32 on every host, one run per level, then two rounds of the proof."""
    lab.reset()
    deploy(lab, tmp_path_factory, ROLE_VARS)
    results_dir = tmp_path_factory.mktemp("adaptive")
    # The grid (6 points, 2 per host) and then 12 loads of the proof one after the other on the first host: about
    # 10 and 15 minutes on a crowded 2-core machine.
    variables = sweep_vars(
        results_dir, "lab", [1, 2, 3, 4, 5, 6], sweep_concurrency=LEVELS, sweep_repeats=1, sweep_prove_rounds=2
    )
    proc = lab.playbook(PLAYBOOK, variables, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    results = json.loads((results_dir / "results.json").read_text())
    lab.reset()
    return results, results_dir


@pytest.mark.long
def test_the_sweep_writes_an_adaptive_config_keyed_by_its_levels_from_the_best_points(adaptive_sweep):
    results, results_dir = adaptive_sweep
    config = json.loads((results_dir / "results-adaptive-config.json").read_text())
    assert list(config) == [str(level) for level in LEVELS]
    adaptive = results["deployable"]["adaptive"]
    assert adaptive["config"] == config and adaptive["refused"] is None
    medians = {(row["steps"], row["concurrency"]): row["output_throughput_median"] for row in results["summary"]}
    for entry in adaptive["entries"]:
        level, steps = entry["concurrency"], config[entry["key"]]["candidate_steps"]
        best = max(medians[(s, level)] for s in range(1, 7))
        near = [s for s in range(1, 7) if medians[(s, level)] >= best * (1 - adaptive["margin"])]
        assert steps == near, (level, steps, {s: medians[(s, level)] for s in range(1, 7)})
        assert entry["best"]["steps"] in steps
    assert results["deployable"]["static"]["args"][0] == "--speculative-num-steps"
    markdown = (results_dir / "results.md").read_text()
    assert (
        "## Deployable configuration" in markdown and "## The deployable configuration, proven in this run" in markdown
    )


@pytest.mark.long
def test_the_same_run_proves_the_adaptive_config_against_the_best_static_points(adaptive_sweep):
    results, _results_dir = adaptive_sweep
    proof = results["proof"]
    assert proof["rounds"] == 2
    arms = {arm["arm"]: arm for arm in proof["arms"]}
    assert {"adaptive-derived", "adaptive-default", "no-speculation"} <= set(arms)
    for arm in proof["arms"]:
        for level in arm["levels"]:
            assert level["rounds"] == 2 and level["low"] <= level["ratio"] <= level["high"], (arm["arm"], level)
            if level["target"] is not None:  # a spread that crosses the target reads inconclusive
                crossing = level["low"] < level["target"] <= level["high"]
                assert (level["verdict"] == "inconclusive") == crossing, level
    derived = {level["concurrency"]: level for level in arms["adaptive-derived"]["levels"]}
    # Within 3 % of each level's best static point, on the median over the rounds.
    assert all(derived[level]["ratio"] >= 0.97 for level in LEVELS), derived
    averaged = proof["averaged"]
    assert averaged["adaptive_vs_best_static"]["ratio"] > 1.0, averaged
    assert averaged["adaptive_vs_sglang_default"]["ratio"] > 1.0, averaged
    assert all(figure["low"] <= figure["ratio"] <= figure["high"] for figure in averaged.values())


def test_a_top_k_2_sweep_is_refused_for_adaptive_and_still_reports_the_static_choice(lab, tmp_path_factory):
    lab.reset()
    deploy(lab, tmp_path_factory, ROLE_VARS)
    results_dir = tmp_path_factory.mktemp("topk2")
    host = lab.hosts[0]
    results = run_sweep(
        lab, results_dir, host, [2, 3], sweep_topk=2, sweep_draft_tokens=6, sweep_concurrency=[1],
        sweep_repeats=1, sweep_prove_rounds=0,
    )  # fmt: skip
    adaptive = results["deployable"]["adaptive"]
    assert adaptive["config"] is None
    assert adaptive["refused"]["reason"] == "speculative_eagle_topk=2 (only topk=1 is supported)"
    static = results["deployable"]["static"]
    assert static["point"]["topk"] == 2 and "--speculative-eagle-topk" in static["args"]
    assert not (results_dir / "results-adaptive-config.json").exists()
    assert "No adaptive config: SGLang would not run adaptive" in (results_dir / "results.md").read_text()
    lab.reset()


def host_files(lab, host) -> dict:
    proc = lab.exec(host, f"stat -c '%a %U %G' {FLEET_CONFIG} {FLEET_DROPIN} 2>&1; cat {FLEET_CONFIG} 2>/dev/null")
    info = lab.exec(host, f"python3 -c {SERVER_ADAPTIVE!r}")
    return {"stat": proc.stdout, "server": json.loads(info.stdout) if info.returncode == 0 else info.stderr}


@pytest.mark.long
def test_deploy_brings_three_hosts_to_serve_the_sweeps_config_and_a_rollback_removes_it(lab, adaptive_sweep, tmp_path):
    _results, results_dir = adaptive_sweep
    fleet = fleet_of(lab, 3)
    proc, records = run(fleet, DEPLOY, tmp_path, "plain", EAGLE)
    assert proc.returncode == 0 and outcomes(records) == dict.fromkeys(fleet.hosts, "deployed"), output(proc)
    with_config = dict(ADAPTIVE, sglang_service_speculative_adaptive_config=str(results_dir / "results.json"))
    proc, records = run(fleet, DEPLOY, tmp_path, "adaptive", with_config)
    assert proc.returncode == 0 and outcomes(records) == dict.fromkeys(fleet.hosts, "deployed"), output(proc)
    config = json.loads((results_dir / "results-adaptive-config.json").read_text())
    for host in fleet.hosts:
        files = host_files(lab, host)
        assert files["stat"].startswith("644 root root\n644 root root\n"), files
        assert json.loads(files["stat"].split("\n", 2)[2]) == config
        assert files["server"] == [True, FLEET_CONFIG], files
        manifest = json.loads(lab.exec(host, f"cat {FLEET_KNOWN_GOOD}/current/manifest.json").stdout)
        assert {"adaptive_config", "dropins/40-adaptive.conf"} <= set(manifest["files"]), manifest["files"]
    proc, records = run(fleet, ROLLBACK, tmp_path, "back", EAGLE)
    assert proc.returncode == 0, output(proc)
    for host in fleet.hosts:
        files = host_files(lab, host)
        assert "No such file" in files["stat"] and files["server"] == [False, None], files
    lab.reset()


def test_a_config_sglang_would_reject_is_refused_in_preflight_naming_the_entry(lab, tmp_path):
    fleet = fleet_of(lab, 1)
    proc, _records = run(fleet, DEPLOY, tmp_path, "plain", EAGLE)
    assert proc.returncode == 0, output(proc)
    host = fleet.hosts[0]
    before = lab.exec(host, "ls -l --time-style=+%s /etc/systemd/system/sglang.service.d /etc/llmops; "
                            "systemctl show -p MainPID --value sglang").stdout  # fmt: skip
    for config, named in (
        ({"1": {"candidate_steps": [3]}, "x4": {"candidate_steps": [2]}}, "entry 'x4': the key is not a batch size"),
        ({"1": {"candidate_steps": [3]}, "16": {"candidate_steps": []}}, "entry '16': candidate_steps must be"),
    ):
        bad = dict(ADAPTIVE, sglang_service_speculative_adaptive_config=config)
        proc, _records = run(fleet, DEPLOY, tmp_path, "bad", bad)
        assert proc.returncode != 0 and named in proc.stdout, output(proc)
        after = lab.exec(host, "ls -l --time-style=+%s /etc/systemd/system/sglang.service.d /etc/llmops; "
                               "systemctl show -p MainPID --value sglang").stdout  # fmt: skip
        assert after == before
    lab.reset()
