"""Benchmark of playbooks/spec_sweep.yml (``make bench``; not run by ``make test``).

At a short (stress) load, per round, side by side: the whole sweep playbook on one host, the same grid and requests
as operators run it without the collection on a plain unit of the same engine (tests/bench/operator/spec_loop.sh, a
lean loop, and tests/bench/operator/bench_speculative.sh, SGLang's own scripts/playground/bench_speculative.py step
for step: a server per batch size and point, /health_generate every 10 s, 5 s after each), and a scaling pair of 12
points on one host and on three. At a realistic load (60 s, what real engines take to load), the playbook on one
host against the lean loop. The engine's own time comes from systemd (when it forked the engine's main process) and
the engine's log (its "ready" line), and from the plain client's timing of the same requests; nothing of the
collection is in it. Every sample goes to docs/performance/<run>/sweep.json and sweep_realistic.json.
"""

from __future__ import annotations

import configparser
import json
import os
import runpy
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from benchdata import (
    BENCH_DIR,
    LAB_INVENTORY,
    OPERATOR_UNIT,
    REPO,
    RUNS,
    UNIT,
    URL,
    Recorder,
    apply_role,
    engine_of,
    fresh_hosts,
    in_turn,
    install_operator_unit,
    push_operator_scripts,
    timed_playbook,
)
from labutil import role_default, sh

pytestmark = pytest.mark.bench

PLAYBOOK = REPO / "playbooks" / "spec_sweep.yml"
STEPS = [int(value) for value in os.environ.get("LLMOPS_BENCH_SWEEP_STEPS", "1,2,3,4,5,6").split(",")]
# The scaling pair: enough points that three hosts take four each.
SCALING_STEPS = [
    int(value) for value in os.environ.get("LLMOPS_BENCH_SCALING_STEPS", "1,2,3,4,5,6,7,8,9,10,11,12").split(",")
]
SHORT_LOAD_S = float(os.environ.get("LLMOPS_BENCH_SWEEP_LOAD_S", "5"))
# As the restart benchmark's realistic load (tests/e2e/test_bench.py): real SGLang starts take 30 s to minutes. Two
# points and the final restore keep each round near 7 minutes.
REALISTIC_LOAD_S = float(os.environ.get("LLMOPS_BENCH_SWEEP_REALISTIC_LOAD_S", "60"))
REALISTIC_STEPS = [int(value) for value in os.environ.get("LLMOPS_BENCH_SWEEP_REALISTIC_STEPS", "1,2").split(",")]
LEVELS = [int(value) for value in os.environ.get("LLMOPS_BENCH_SWEEP_LEVELS", "1,4").split(",")]
# Per level max(num_prompts, concurrency) requests, as sglang_bench sends them.
BENCH = {"num_prompts": 4, "max_new_tokens": 32}
SIZING = {"sweep_repeats": 1, "sweep_warmup_requests": 1}
# The playbook's default: a point's gate holds no stability window; the final restore holds the role's.
POINT_WINDOW_S = 0


def role_vars(load_s: float) -> dict:
    return {
        "sglang_service_model_path": "Qwen/Qwen3-8B",
        "sglang_service_tp_size": 1,
        "sglang_service_speculative_algorithm": "EAGLE",
        "sglang_service_speculative_num_steps": 3,
        "sglang_service_speculative_eagle_topk": 1,
        "sglang_service_speculative_num_draft_tokens": 4,
        "sglang_service_environment": {},
        "sglang_service_extra_args": [
            "--sim-load-time",
            f"{load_s:g}",
            "--sim-warmup-time",
            "0.2",
            "--sim-token-latency-ms",
            "10",
            # Half the default draft memory, so that the scaling pair's deepest points (12 steps) still load.
            "--sim-mem-overhead-mib-per-draft-token",
            "600",
        ],
    }


FORK_WATCH = """
import json, subprocess, sys, time
seen = set()
with open(sys.argv[2], "a") as out:
    while True:
        value = subprocess.run(["systemctl", "show", "-P", "ExecMainStartTimestampMonotonic", sys.argv[1]],
                               capture_output=True, text=True).stdout.strip()
        if value not in ("", "0") and value not in seen:
            seen.add(value)
            out.write(json.dumps({"fork": int(value) / 1e6 + time.time() - time.monotonic()}) + "\\n")
            out.flush()
        time.sleep(0.1)
"""
READY_LINES = """
import json, subprocess, sys
out = subprocess.run(["journalctl", "-u", sys.argv[1], "--since", "@" + sys.argv[2], "-o", "json", "--no-pager"],
                     capture_output=True, text=True, check=True).stdout
print(json.dumps([int(entry["__REALTIME_TIMESTAMP"]) / 1e6 for entry in map(json.loads, out.splitlines())
                  if "The server is fired up and ready to roll" in str(entry.get("MESSAGE", ""))]))
"""


def requests_spec() -> dict:
    """The requests sglang_bench sends for this sizing (its built-in prompts), for the plain client."""
    prompts = runpy.run_path(str(REPO / "plugins" / "module_utils" / "bench_prompts.py"))["builtin_prompts"]
    return {
        "warmup": prompts(SIZING["sweep_warmup_requests"]),
        "levels": [{"concurrency": level, "prompts": prompts(max(BENCH["num_prompts"], level))} for level in LEVELS],
        "repeats": SIZING["sweep_repeats"],
        "max_new_tokens": BENCH["max_new_tokens"],
        "ignore_eos": True,
        "temperature": 0,
    }


class Grid(NamedTuple):
    """What one benchmark sweeps: the engine's simulated load and the steps."""

    load_s: float
    steps: list


SHORT = Grid(SHORT_LOAD_S, STEPS)
REALISTIC = Grid(REALISTIC_LOAD_S, REALISTIC_STEPS)


def sweep_vars(hosts: str, results_dir: Path, grid: Grid) -> dict:
    return dict(
        role_vars(grid.load_s),
        sweep_hosts=hosts,
        sweep_steps=grid.steps,
        sweep_concurrency=LEVELS,
        sweep_bench=BENCH,
        sweep_results_dir=str(results_dir),
        sweep_stability_window=POINT_WINDOW_S,
        **SIZING,
    )


def ansible_forks() -> int:
    """The forks of the playbook runs (tests/e2e/ansible.cfg): at least the hosts swept at once."""
    config = configparser.ConfigParser()
    config.read(REPO / "tests" / "e2e" / "ansible.cfg")
    return config.getint("defaults", "forks")


def engine_loads(lab, host: str, since: float) -> list:
    """(fork, ready) of each engine start since ``since``: systemd's fork of the main process, the engine's log line."""
    forks = [json.loads(line)["fork"] for line in sh(lab, host, "cat /run/bench-forks.jsonl").splitlines() if line]
    forks = [fork for fork in forks if fork >= since]  # not the engine that ran before the playbook
    readies = json.loads(sh(lab, host, f"python3 - {UNIT} {int(since) - 1} <<'EOF'\n{READY_LINES}\nEOF"))
    loads = []
    for index, fork in enumerate(forks):
        following = forks[index + 1] if index + 1 < len(forks) else float("inf")
        ready = next((ready for ready in readies if fork < ready < following), None)
        loads.append({"fork": fork, "ready": ready})
    return loads


def run_sweep(lab, hosts: list, results_dir: Path, grid: Grid) -> tuple:
    """The whole playbook, with the fork watcher on the first host; returns (Timed, results, engine loads)."""
    watched = hosts[0]
    sh(
        lab,
        watched,
        f"rm -f /run/bench-forks.jsonl; cat > /run/fork_watch.py <<'EOF'\n{FORK_WATCH}\nEOF\n"
        f"(python3 /run/fork_watch.py {UNIT} /run/bench-forks.jsonl) </dev/null >/dev/null 2>&1 &",
    )
    since = time.time()
    try:
        run = timed_playbook(
            lab, PLAYBOOK, sweep_vars(",".join(hosts), results_dir, grid), inventories=(LAB_INVENTORY,), timeout=1800
        )
    finally:
        sh(lab, watched, "pkill -f '[f]ork_watch.py'; true")
    assert run.proc.returncode == 0, run.output
    results = json.loads((results_dir / "results.json").read_text())
    return run, results, engine_loads(lab, watched, since)


def points_phase(run, host: str) -> dict:
    """From the start of the points play to the start of the host's final restore (tasks/sweep_finish.yml)."""
    plays = run.timeline.get("plays", [])
    restore = [
        task["start"]
        for task in run.timeline.get("tasks", [])
        if task["host"] == host and "sweep_finish" in (task["path"] or "") and task["start"]
    ]
    if len(plays) < 2 or not restore:
        return {"points_start": None, "points_stop": None}
    return {"points_start": plays[1]["start"], "points_stop": min(restore)}


def time_by_file(run, host: str) -> dict:
    """Seconds the host spent in tasks, per task file (roles/.../restart.yml, playbooks/tasks/sweep_point.yml, ...)."""
    totals = {}
    for task in run.timeline.get("tasks", []):
        if task["host"] != host or not task["start"]:
            continue
        path = Path((task["path"] or "?").rsplit(":", 1)[0])
        try:
            name = path.resolve().relative_to(REPO).as_posix()
        except ValueError:
            name = "/".join(path.parts[-3:])
        totals[name] = round(totals.get(name, 0.0) + task["end"] - task["start"], 3)
    return totals


def statuses(results: dict) -> list:
    return [record.get("status") for record in results.get("records", results.get("points", []))]


def one_host_sweep(lab, swept: list, _loop_host: str, results_dir: Path, grid: Grid) -> dict:
    run, results, loads = run_sweep(lab, swept[:1], results_dir, grid)
    return {
        "start": run.start,
        "stop": run.stop,
        "loads": loads,
        "statuses": statuses(results),
        "sweep_timing": results.get("timing"),
        "task_seconds_by_file": time_by_file(run, swept[0]),
        **points_phase(run, swept[0]),
    }


def operator_script(script: str, lab, loop_host: str, grid: Grid) -> dict:
    command = f"{BENCH_DIR}/{script} {OPERATOR_UNIT} {URL} {BENCH_DIR}/requests.json " + " ".join(map(str, grid.steps))
    lines = [json.loads(line) for line in sh(lab, loop_host, command, timeout=3600).splitlines() if line[:1] == "{"]
    return {"start": lines[0]["start"], "stop": lines[-1]["stop"], "points": lines}


def operator_loop(lab, _swept: list, loop_host: str, _results_dir: Path, grid: Grid) -> dict:
    return operator_script("spec_loop.sh", lab, loop_host, grid)


def bench_speculative(lab, _swept: list, loop_host: str, _results_dir: Path, grid: Grid) -> dict:
    return operator_script("bench_speculative.sh", lab, loop_host, grid)


def scaling_one_host(lab, swept: list, _loop_host: str, results_dir: Path, grid: Grid) -> dict:
    run, results, _loads = run_sweep(lab, swept[:1], results_dir, grid._replace(steps=SCALING_STEPS))
    return {"start": run.start, "stop": run.stop, "statuses": statuses(results)}


def scaling_three_hosts(lab, swept: list, _loop_host: str, results_dir: Path, grid: Grid) -> dict:
    run, results, _loads = run_sweep(lab, swept, results_dir, grid._replace(steps=SCALING_STEPS))
    return {"start": run.start, "stop": run.stop, "statuses": statuses(results)}


def measure(lab, name: str, grid: Grid, sides: dict, swept: list, loop_host: str, tmp_path: Path, **settings) -> None:
    """The role on the swept hosts and the operator's plain unit on ``loop_host``, then RUNS rounds of ``sides``
    in turn, every sample to docs/performance/<run>/<name>.json."""
    spec = requests_spec()
    bench = Recorder(
        name,
        lab,
        {
            "steps": grid.steps,
            "load_s": grid.load_s,
            "levels": [level["concurrency"] for level in spec["levels"]],
            "bench": BENCH,
            **SIZING,
            "role": role_vars(grid.load_s),
            "requests": {
                "warmup": len(spec["warmup"]),
                "per_level": [len(level["prompts"]) for level in spec["levels"]],
            },
            "operator_script": "tests/bench/operator/spec_loop.sh with tests/bench/operator/plain_bench.py",
            "operator_poll_s": 0.1,
            "stability_window_s": {
                "points": POINT_WINDOW_S,
                "final_restore": role_default("sglang_service_probe_stability_window"),
            },
            "role_preflight": "with each host's first point",
            **settings,
        },
    )
    with bench.part("set-up: the role on the swept hosts, the operator's plain unit"):
        apply_role(lab, ",".join(swept), role_vars(grid.load_s))
        push_operator_scripts(lab, loop_host)
        install_operator_unit(lab, loop_host, engine_of(lab, swept[0]))
        sh(lab, loop_host, f"cat > {BENCH_DIR}/requests.json <<'EOF'\n{json.dumps(spec)}\nEOF")
        bench.note(
            "engine",
            json.dumps({"collection": engine_of(lab, swept[0]), "operator": engine_of(lab, loop_host, OPERATOR_UNIT)}),
        )
    for round_number in range(RUNS):
        for side in in_turn(round_number, list(sides)):
            with bench.part(f"round {round_number + 1}: {side}"):
                fields = sides[side](lab, swept, loop_host, tmp_path / f"{side}-{round_number}", grid)
                bench.sample(round=round_number, side=side, **fields)
    bench.finish()


@pytest.fixture
def four_hosts(lab):
    """3 hosts for the sweep, 1 for the operator's loop."""
    with fresh_hosts(lab, 4) as part:
        yield part


@pytest.fixture
def two_hosts(lab):
    """1 host for the sweep, 1 for the operator's loop."""
    with fresh_hosts(lab, 2) as part:
        yield part


def test_bench_sweep_at_a_short_load_against_the_loops_and_on_three_hosts(four_hosts, tmp_path):
    lab = four_hosts
    swept, loop_host = lab.hosts[:3], lab.hosts[3]
    sides = {
        "one_host": one_host_sweep,
        "operator": operator_loop,
        "bench_speculative": bench_speculative,
        "scaling_one_host": scaling_one_host,
        "scaling_three_hosts": scaling_three_hosts,
    }
    measure(
        lab,
        "sweep",
        SHORT,
        sides,
        swept,
        loop_host,
        tmp_path,
        hosts={"one_host": swept[:1], "scaling": swept, "operator": loop_host},
        scaling={"steps": SCALING_STEPS, "hosts": len(swept), "forks": ansible_forks()},
        bench_speculative_script="tests/bench/operator/bench_speculative.sh with tests/bench/operator/plain_bench.py",
    )


def test_bench_sweep_at_a_realistic_load_against_the_lean_loop(two_hosts, tmp_path):
    lab = two_hosts
    swept, loop_host = lab.hosts[:1], lab.hosts[1]
    sides = {"one_host": one_host_sweep, "operator": operator_loop}
    measure(
        lab,
        "sweep_realistic",
        REALISTIC,
        sides,
        swept,
        loop_host,
        tmp_path,
        hosts={"one_host": swept, "operator": loop_host},
    )
