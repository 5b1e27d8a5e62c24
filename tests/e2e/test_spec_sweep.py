"""playbooks/spec_sweep.yml on lab hosts: a real sweep over the simulated engine, through the sglang_service role.

The hosts run the role's unit with the simulator as the launch module; its knobs come in through the role's
extra args, as any other inventory variable would (1 s loads, 10 ms per decode step so that a benchmark
measures decoding rather than HTTP overhead, and the default draft memory so that steps >= 9 fail the load
with CUDA out of memory on the lab's 80 GB GPUs).

Set LLMOPS_BENCH_OUT to a directory to get the measured timing figures as spec_sweep.json there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "spec_sweep.yml"
UNIT = "sglang-sweep"
DROPIN = f"/etc/systemd/system/{UNIT}.service.d/50-speculative.conf"
ROLE_VARS = {
    "sglang_service_name": UNIT,
    "sglang_service_python": "/opt/sglang/venv/bin/python",
    "sglang_service_launch_module": "sglang_sim.launch_server",
    "sglang_service_model_path": "Qwen/Qwen3-8B",
    "sglang_service_tp_size": 1,
    "sglang_service_speculative_algorithm": "EAGLE",
    "sglang_service_speculative_num_steps": 3,
    "sglang_service_speculative_eagle_topk": 1,
    "sglang_service_drain_timeout": 10,
    "sglang_service_restart_sec": 2,
    # A sweep killed inside a restart chain leaves the host lock to its lease; keep that short in the lab.
    "sglang_service_lock_lease_sec": 120,
    "sglang_service_lock_timeout": 150,
    "sglang_service_extra_args": [
        "--sim-load-time", "1",
        "--sim-warmup-time", "0.2",
        "--sim-token-latency-ms", "10",
        "--sim-mem-overhead-mib-per-draft-token", "1200",
    ],
}  # fmt: skip
BENCH = {"num_prompts": 8, "concurrency": 4, "max_new_tokens": 64}
DEPLOY = """\
- name: Deploy the SGLang unit for the sweep tests
  hosts: lab
  gather_facts: false
  roles:
    - llmops.inference.sglang_service
"""
RESTORE = """\
- name: Back to the base unit (what an operator does after trying a sweep's best point)
  hosts: lab
  gather_facts: false
  tasks:
    - name: Remove the speculative drop-in
      ansible.builtin.include_role:
        name: llmops.inference.sglang_service
        tasks_from: speculative_dropin
      vars:
        sglang_service_speculative_dropin_state: absent
    - name: Restart through the gated chain
      ansible.builtin.include_role:
        name: llmops.inference.sglang_service
        tasks_from: restart
"""
HOST_STATE = f"""
import json, os, subprocess, urllib.request
state = {{"dropin": os.path.exists("{DROPIN}"), "sweep_state": os.path.exists("/var/lib/llmops/sweep")}}
show = subprocess.run(["systemctl", "show", "-p", "ActiveState,MainPID", "{UNIT}.service"], capture_output=True,
                      text=True).stdout
state.update(line.split("=", 1) for line in show.split())
try:
    with urllib.request.urlopen("http://127.0.0.1:30000/server_info", timeout=5) as answer:
        info = json.load(answer)
    state["steps"] = info.get("speculative_num_steps")
    state["draft_tokens"] = info.get("speculative_num_draft_tokens")
except Exception as exc:
    state["steps"] = repr(exc)
try:
    state["lock_free"] = os.path.getsize("/run/lock/llmops-{UNIT}.lock") == 0
except OSError:
    state["lock_free"] = True
print(json.dumps(state))
"""
TIMINGS = {}


def host_state(lab, host) -> dict:
    proc = lab.exec(host, f"python3 - <<'EOF'\n{HOST_STATE}\nEOF")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_original(lab, host) -> None:
    state = host_state(lab, host)
    assert state["ActiveState"] == "active", state
    assert (state["steps"], state["draft_tokens"]) == (3, 4), state
    assert not state["dropin"], state
    assert not state["sweep_state"], state


def sweep_vars(results_dir: Path, hosts: str, steps: list, **extra) -> dict:
    variables = dict(
        ROLE_VARS,
        sweep_hosts=hosts,
        sweep_steps=steps,
        sweep_repeats=2,
        sweep_warmup_requests=1,
        sweep_bench=BENCH,
        sweep_results_dir=str(results_dir),
        # The lab's nspawn hosts now and then fail a start with status=219/CGROUP right after a stop; one more
        # restart rides that out (an out-of-memory load fails again and stays failed).
        sweep_retry_failed_load=True,
    )
    variables.update(extra)
    return variables


def run_sweep(lab, results_dir: Path, hosts: str, steps: list, **extra) -> dict:
    started = time.monotonic()
    proc = lab.playbook(PLAYBOOK, sweep_vars(results_dir, hosts, steps, **extra), timeout=900)
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    results = json.loads((results_dir / "results.json").read_text())
    results["playbook_wall_s"] = wall
    return results


def by_steps(results: dict) -> dict:
    return {record["point"]["steps"]: record for record in results["points"]}


def record_timings(name: str, values: dict) -> None:
    TIMINGS[name] = values
    out = os.environ.get("LLMOPS_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "spec_sweep.json").write_text(json.dumps(TIMINGS, indent=2, sort_keys=True) + "\n")
    print(f"spec_sweep timing {name}: {json.dumps(values, sort_keys=True)}")


@pytest.fixture(scope="module")
def sweep_lab(lab, tmp_path_factory):
    lab.reset()
    deploy = tmp_path_factory.mktemp("deploy") / "deploy.yml"
    deploy.write_text(DEPLOY)
    proc = lab.playbook(deploy, ROLE_VARS, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    yield lab
    lab.reset()


@pytest.fixture(scope="module")
def one_host_sweep(sweep_lab, tmp_path_factory):
    """Steps 1..10 on the first host; the lab's GPUs fit the draft memory of steps <= 8 only."""
    results_dir = tmp_path_factory.mktemp("one-host")
    return run_sweep(sweep_lab, results_dir, sweep_lab.hosts[0], list(range(1, 11))), results_dir


def test_steps_1_to_10_records_the_oom_points_plots_and_restores_the_original(sweep_lab, one_host_sweep):
    results, results_dir = one_host_sweep
    points = by_steps(results)
    assert sorted(points) == list(range(1, 11))
    for steps in (9, 10):
        assert points[steps]["status"] == "failed"
        assert "out of memory" in points[steps]["reason"].lower(), points[steps]["reason"]
        assert points[steps]["journal_tail"]
    measured = [points[steps] for steps in range(1, 9)]
    assert all(record["status"] == "measured" for record in measured), [r["reason"] for r in measured]
    assert all(len(record["repeats"]) == 2 for record in measured)
    summary = {row["steps"]: row for row in results["summary"]}
    accept = [summary[steps]["accept_length_median"] for steps in range(1, 9)]
    # the sim's model: 1.70, 2.19, 2.53, 2.77, 2.94, 3.06, 3.14, 3.20 - grows and saturates
    assert accept == sorted(accept)
    assert accept[1] - accept[0] > 3 * (accept[7] - accept[6])
    assert 1.5 < accept[0] < 1.9 and 3.0 < accept[7] < 3.4
    assert results["best"]["steps"] in range(2, 8)
    assert (results_dir / "results.png").read_bytes().startswith(b"\x89PNG")
    markdown = (results_dir / "results.md").read_text()
    assert "**best**" in markdown
    assert "steps 9, top-k 1, draft tokens 10" in markdown
    assert len((results_dir / "results.csv").read_text().splitlines()) == 1 + 8 * 2 + 2
    assert_original(sweep_lab, sweep_lab.hosts[0])
    timing = results["timing"]
    record_timings(
        "one_host",
        {key: timing[key] for key in ("sweep_wall_s", "load_bench_sum_s", "apply_sum_s", "overhead_ratio")}
        | {"points": 10, "playbook_wall_s": results["playbook_wall_s"]},
    )


def test_three_hosts_sweep_the_same_grid_faster_and_apply_the_best(sweep_lab, one_host_sweep, tmp_path):
    one, _one_results_dir = one_host_sweep
    three = run_sweep(sweep_lab, tmp_path / "results", "lab", list(range(1, 11)), sweep_apply="best")
    assert {record["host"] for record in three["points"]} == set(sweep_lab.hosts)
    assert [row["status"] for row in three["summary"]] == [row["status"] for row in one["summary"]]
    speedup = one["timing"]["sweep_wall_s"] / three["timing"]["sweep_wall_s"]
    playbook_speedup = one["playbook_wall_s"] / three["playbook_wall_s"]
    record_timings(
        "three_hosts",
        {
            "sweep_wall_s": three["timing"]["sweep_wall_s"],
            "playbook_wall_s": three["playbook_wall_s"],
            "speedup_sweep_wall": speedup,
            "speedup_playbook_wall": playbook_speedup,
        },
    )
    # 4 of the 10 points on the busiest host: at best 2.5x; on a loaded 2-core controller, clearly faster
    assert speedup > 1.6, (speedup, one["timing"], three["timing"])
    best = three["best"]
    for host in sweep_lab.hosts:
        state = host_state(sweep_lab, host)
        assert state["ActiveState"] == "active", state
        assert (state["steps"], state["draft_tokens"]) == (best["steps"], best["draft_tokens"]), state
        assert state["dropin"] and not state["sweep_state"], state

    restore = tmp_path / "restore.yml"
    restore.write_text(RESTORE)
    proc = sweep_lab.playbook(restore, ROLE_VARS, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    for host in sweep_lab.hosts:
        assert_original(sweep_lab, host)


def wait_until_benchmarking(lab, host, results_dir: Path, proc: subprocess.Popen, deadline: float) -> dict:
    """Poll until the host has finished two points and runs the third one's (steps 4) benchmark: its drop-in is
    loaded and the restart chain has released the host lock."""
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        if len(list((results_dir / "points").glob("*.json"))) >= 2:
            state = host_state(lab, host)
            if state["dropin"] and state["steps"] == 4 and state["lock_free"]:
                return state
        time.sleep(0.1)
    raise AssertionError("the sweep never reached the third point's benchmark")


def test_a_killed_sweep_resumes_and_ends_on_the_original_configuration(sweep_lab, tmp_path):
    host = sweep_lab.hosts[1]
    steps = [1, 2, 4]
    extra = {"sweep_repeats": 3, "sweep_resume": True}
    cmd = ["ansible-playbook", "-i", str(sweep_lab.inventory), str(PLAYBOOK)]
    cmd += ["-e", json.dumps(sweep_vars(tmp_path, host, steps) | extra)]
    proc = subprocess.Popen(cmd, env=sweep_lab.env(), start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        interrupted = wait_until_benchmarking(sweep_lab, host, tmp_path, proc, time.monotonic() + 300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert interrupted["dropin"]  # the host ran the third point when the sweep died
    first = {path.stem for path in (tmp_path / "points").glob("*.json")}
    assert len(first) == 2

    results = run_sweep(sweep_lab, tmp_path, host, steps, **extra)
    runs = [run["run_id"] for run in results["runs"]]
    assert len(runs) == 2
    assert sorted(results["runs"][1]["hosts"]) == [host]
    recorded = {record["point"]["id"]: record["run_id"] for record in results["points"]}
    assert len(recorded) == 3
    assert {point_id for point_id, run_id in recorded.items() if run_id == runs[0]} == first
    assert all(record["status"] == "measured" for record in results["points"])
    assert_original(sweep_lab, host)


@pytest.mark.parametrize("check", [False, True], ids=["bad-input", "check-mode"])
def test_bad_input_or_check_mode_leaves_the_host_alone(sweep_lab, tmp_path, check):
    host = sweep_lab.hosts[2]
    before = host_state(sweep_lab, host)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = (
        [
            ({"sweep_steps": []}, "sweep_steps must not be empty"),
            ({"sweep_steps": [2, 0]}, "sweep_steps must hold only integers >= 1, got 0"),
            ({"sweep_topk": 4}, "sweep_steps needs draft tokens for top-k 4"),
            ({"sweep_draft_tokens": 7}, "with top-k 1 SGLang sets draft tokens to steps + 1"),
            ({"sweep_results_dir": str(blocker / "results")}, "sweep_results_dir cannot be written on the controller"),
        ]
        if not check
        else [({}, None)]
    )
    for overrides, message in cases:
        results_dir = tmp_path / "results"
        variables = sweep_vars(results_dir, host, [2, 3]) | overrides
        proc = sweep_lab.playbook(PLAYBOOK, variables, check=check, timeout=300)
        output = proc.stdout + proc.stderr
        if message is None:
            assert proc.returncode == 0, output[-4000:]
            assert "2 point(s), 0 already recorded, 2 to run on 1 host(s)" in output
            assert not results_dir.exists()
        else:
            assert proc.returncode != 0, overrides
            assert message in output, output[-4000:]
    after = host_state(sweep_lab, host)
    assert after["MainPID"] == before["MainPID"]
    assert not after["dropin"]


@pytest.mark.skipif(not os.environ.get("LLMOPS_SWEEP_BENCH"), reason="benchmark: set LLMOPS_SWEEP_BENCH=1")
def test_benchmark_sweep_overhead_and_three_host_speedup(sweep_lab, tmp_path):
    """The figures of issue 9: sweep wall / sum(load + benchmark) on one host (target <= 1.15), and the speedup
    of three hosts over one on the same grid (target >= 2.4). Loads of LLMOPS_SWEEP_BENCH_LOAD_S seconds
    (default 30, a small model's real load time) and a benchmark of 3 x 16 requests per point."""
    load_s = os.environ.get("LLMOPS_SWEEP_BENCH_LOAD_S", "30")
    role_vars = dict(ROLE_VARS)
    role_vars["sglang_service_extra_args"] = [
        *("--sim-load-time", load_s, "--sim-warmup-time", "0.2", "--sim-token-latency-ms", "10"),
    ]
    deploy = tmp_path / "deploy.yml"
    deploy.write_text(DEPLOY)
    proc = sweep_lab.playbook(deploy, role_vars, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    grid = [1, 2, 3, 4, 5, 6]
    sizing = {"sweep_repeats": 3, "sweep_bench": {"num_prompts": 16, "concurrency": 4, "max_new_tokens": 128}}
    results = {}
    for name, hosts in (("one_host", sweep_lab.hosts[0]), ("three_hosts", "lab")):
        variables = sweep_vars(tmp_path / name, hosts, grid) | role_vars | sizing
        started = time.monotonic()
        proc = sweep_lab.playbook(PLAYBOOK, variables, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "results.json").read_text())
        results[name]["playbook_wall_s"] = time.monotonic() - started
        assert [record["status"] for record in results[name]["points"]] == ["measured"] * len(grid)
    one, three = results["one_host"]["timing"], results["three_hosts"]["timing"]
    figures = {
        "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs, lab hosts as systemd-nspawn containers",
        "command": "LLMOPS_SWEEP_BENCH=1 LLMOPS_BENCH_OUT=DIR pytest tests/e2e/test_spec_sweep.py -k benchmark",
        "setup": f"steps {grid[0]}..{grid[-1]}, simulated load {load_s} s, 3 x 16 requests of 128 tokens per point",
        "overhead_ratio_one_host": {"measured": one["overhead_ratio"], "target": "<= 1.15"},
        "speedup_three_hosts": {"measured": one["sweep_wall_s"] / three["sweep_wall_s"], "target": ">= 2.4"},
        "speedup_three_hosts_playbook_wall": results["one_host"]["playbook_wall_s"]
        / results["three_hosts"]["playbook_wall_s"],
        "one_host": one | {"playbook_wall_s": results["one_host"]["playbook_wall_s"]},
        "three_hosts": three | {"playbook_wall_s": results["three_hosts"]["playbook_wall_s"]},
    }
    record_timings("benchmark", figures)
    assert figures["overhead_ratio_one_host"]["measured"] > 1.0
    proc = sweep_lab.playbook(deploy, ROLE_VARS, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
