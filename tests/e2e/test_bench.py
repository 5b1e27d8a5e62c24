"""Benchmarks of one host's operations (``make bench``; not run by ``make test``): restart, reap, probe, progress tier
(on a hung engine and on a slow one).

Each one measures the collection side by side with the way the job is done without it, in rounds that alternate the
sides, and records every sample with benchdata (docs/performance/<run>/<benchmark>.json). No target is asserted
here: tests/bench/write_performance.py computes the figures and compares them with their targets.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
from pathlib import Path

import pytest
from benchdata import (
    BENCH_DIR,
    OPERATOR_UNIT,
    PLAYS,
    RUNS,
    UNIT,
    URL,
    Recorder,
    apply_role,
    baseline_checkout,
    baseline_vars,
    chain_restart,
    engine_of,
    engine_vars,
    fresh_hosts,
    in_turn,
    install_operator_unit,
    operator_restart,
    over_ssh,
    push_operator_scripts,
    timed_playbook,
)
from labutil import SERVICE_PATH, install_unit, role_default, sh, wait_ready

pytestmark = pytest.mark.bench

MODEL = "Qwen/Qwen3-8B"  # the hung engine's
# A short load (stress) and a realistic one: real SGLang starts take 30 s to minutes (CUDA graph capture alone 12 s
# for a main model, 63 s for an EAGLE draft).
RESTART_LOADS = [float(value) for value in os.environ.get("LLMOPS_BENCH_RESTART_LOADS", "5,60").split(",")]
# The operators' scripts ask as often as the restart chain does.
OPERATOR_POLL_S = 0.1
REAP_GRACE = 2.0
PROGRESS_WINDOW = float(os.environ.get("LLMOPS_BENCH_PROGRESS_WINDOW", "5"))
# The lab's fault for "generation stuck while /health answers"; the lab names it.
HANG_FAULT = os.environ.get("LLMOPS_BENCH_HANG_FAULT", "generate-hang")


# The baseline commit's gate had no stability window (its default was 0 s; this commit's 5 s is what refuses an
# engine that exits right after it became ready). The "same_gate" side restarts this commit's chain with the
# baseline's window, on the collection's hosts, so that the two commits are also compared doing the same work.
BASELINE_GATE = {"sglang_service_probe_stability_window": 0}


@pytest.fixture
def restart_hosts(lab):
    with fresh_hosts(lab, 3 * len(RESTART_LOADS)) as part:
        yield part


@pytest.fixture
def one_host(lab):
    with fresh_hosts(lab, 1) as part:
        yield part


@pytest.fixture(scope="module")
def baseline():
    with baseline_checkout() as checkout:
        yield checkout


def test_bench_restart_chain_against_systemctl_restart_and_a_health_loop(restart_hosts, baseline, tmp_path):
    """Per load: the role's chain (this commit's, with its gate and with the baseline's, and the baseline
    commit's) and the operator's scripts (a restart and a /health loop; the same with the chain's checks), each commit
    and the operator on hosts of their own."""
    lab = restart_hosts
    tree, collections, baseline_sha = baseline
    sides = {}
    for index, load in enumerate(RESTART_LOADS):
        ours, operator, before = lab.hosts[3 * index : 3 * index + 3]
        sides[load] = {"collection": ours, "operator": operator, "baseline": before}
    bench = Recorder(
        "restart",
        lab,
        {
            "loads_s": RESTART_LOADS,
            "hosts": sides,
            "baseline_commit": baseline_sha,
            "engine": {f"{load:g}": engine_vars(load) for load in RESTART_LOADS},
            "inventory": "tests/lab/inventory (the baseline side: that commit's own tests/lab/inventory)",
            "operator_script": "tests/bench/operator/restart.sh",
            "operator_checked_script": "tests/bench/operator/restart_checked.sh",
            "operator_checked_ssh": "the checked script as `ssh host restart_checked.sh` from the controller",
            "operator_poll_s": OPERATOR_POLL_S,
            "same_gate": BASELINE_GATE,
            "stability_window_s": role_default("sglang_service_probe_stability_window"),
        },
    )
    baseline_inventory = tree / "tests" / "lab" / "inventory"
    window = role_default("sglang_service_probe_stability_window")
    with bench.part("set-up: the role on its hosts, the operator's plain units"):
        # One load's hosts at a time; its two role runs side by side (set-up only, nothing here is measured).
        for load, hosts in sides.items():
            variables = engine_vars(load)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                ours = pool.submit(apply_role, lab, hosts["collection"], variables)
                theirs = pool.submit(
                    apply_role, lab, hosts["baseline"], baseline_vars(variables), collections, baseline_inventory
                )
                ours.result()
                try:
                    theirs.result()
                except AssertionError as exc:  # recorded: the baseline's samples then say why they failed
                    bench.note(f"baseline_setup_{load:g}s", str(exc)[-1500:])
            push_operator_scripts(lab, hosts["operator"])
            engine = engine_of(lab, hosts["collection"])
            install_operator_unit(lab, hosts["operator"], engine)
            operator = engine_of(lab, hosts["operator"], OPERATOR_UNIT)
            bench.note(f"engine_{load:g}s", json.dumps({"collection": engine, "operator": operator}))
    for round_number in range(RUNS):
        for load, hosts in sides.items():
            with bench.part(f"round {round_number + 1}, {load:g} s load"):
                variables = engine_vars(load)
                common = {"round": round_number, "load_s": load}
                sides_of_round = [
                    "collection", "operator", "operator_checked", "operator_checked_ssh", "baseline", "same_gate"
                ]  # fmt: skip
                for side in in_turn(round_number, sides_of_round):
                    host = hosts[
                        "operator" if side.startswith("operator") else {"same_gate": "collection"}.get(side, side)
                    ]
                    if side == "operator":
                        fields = operator_restart(lab, host)
                    elif side.startswith("operator_checked"):
                        fields = operator_restart(lab, host, "restart_checked.sh", window, ssh=side.endswith("_ssh"))
                    elif side == "collection":
                        fields = chain_restart(lab, host, variables, tmp_path)
                    elif side == "same_gate":
                        fields = chain_restart(lab, host, variables | BASELINE_GATE, tmp_path)
                    else:
                        fields = chain_restart(
                            lab, host, baseline_vars(variables), tmp_path, collections, baseline_inventory
                        )
                    bench.sample(**common, side=side, host=host, **fields)
    bench.finish()
    failed = [s for s in bench.data["samples"] if s["side"] == "collection" and not s["ok"]]
    assert not failed, failed[0]["error"]


def gpu_used(lab, host: str, gpu: int = 0) -> int:
    return int(sh(lab, host, f"nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i {gpu}"))


def start_holder(lab, host: str, mib: int = 2000) -> int:
    """A process holding GPU 0 memory that ignores SIGTERM (an orphaned scheduler, as the reaper meets it)."""
    pid = int(
        sh(
            lab,
            host,
            f"setsid simgpu-claim --hold --ignore-sigterm --gpu 0 --mib {mib} </dev/null >/dev/null 2>&1 & echo $!",
        )
    )
    sh(
        lab,
        host,
        f"until nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qx {pid}; do sleep 0.05; done",
        timeout=30,
    )
    return pid


def run_tasks(lab, host: str, tmp_path: Path, **steps):
    result = tmp_path / f"tasks-{host}.json"
    run = timed_playbook(
        lab, PLAYS / "bench_tasks.yml", {"bench_host": host, "bench_result": str(result), **steps}, timeout=600
    )
    assert run.proc.returncode == 0, run.output
    return run, json.loads(result.read_text())


def task_interval(run, name: str, host: str) -> dict:
    task = run.task(name, host)
    return {"start": task["start"], "stop": task["end"]}


def test_bench_reap_against_kill_sleep_kill_and_watching_nvidia_smi(one_host, tmp_path):
    """Per round: the operator's kill/sleep/kill/poll script (which also gives the lab's release lag), then the
    nvidia_reap task beside a ping task in one play."""
    lab = one_host
    host = lab.hosts[0]
    push_operator_scripts(lab, host)
    baseline_mib = gpu_used(lab, host)
    bench = Recorder(
        "reap",
        lab,
        {
            "grace_s": REAP_GRACE,
            "holder_mib": 2000,
            "operator_script": "tests/bench/operator/reap.sh",
            "operator_ssh": "the same script as `ssh host reap.sh` from the controller",
            "operator_poll_s": 0.02,
            "gpu_baseline_mib": baseline_mib,
            "release_lag_ms_file": sh(lab, host, "cat /var/lib/simgpu/release_lag_ms 2>/dev/null || echo none").strip(),
        },
    )
    for round_number in range(RUNS):
        with bench.part(f"round {round_number + 1}"):
            pid = start_holder(lab, host)
            out = sh(lab, host, f"{BENCH_DIR}/reap.sh {pid} {REAP_GRACE:g} 0 {baseline_mib} 0.02", timeout=180)
            start, killed, stop = (float(value) for value in out.split())
            bench.sample(
                round=round_number, side="operator", start=start, stop=stop, killed=killed, release_lag_s=stop - killed
            )
            pid = start_holder(lab, host)
            began, ended, proc = over_ssh(lab, host, f"{BENCH_DIR}/reap.sh {pid} {REAP_GRACE:g} 0 {baseline_mib} 0.02")
            bench.sample(round=round_number, side="operator_ssh", start=began, stop=ended, ok=proc.returncode == 0)
            pid = start_holder(lab, host)
            reap = {"pids": [pid], "grace": REAP_GRACE, "timeout": 30}
            run, results = run_tasks(lab, host, tmp_path, bench_reap=reap)
            bench.sample(round=round_number, side="first_use", **task_interval(run, "First use of nvidia_reap", host))
            result = results["reap"]
            bench.sample(
                round=round_number,
                side="collection",
                **task_interval(run, "Reap", host),
                changed=result.get("changed"),
                module_elapsed_s=result.get("elapsed_s"),
                ok=bool(result.get("changed")) and gpu_used(lab, host) <= baseline_mib,
            )
            bench.sample(
                round=round_number, side="ansible_task", **task_interval(run, "Ansible's own cost of a task", host)
            )
    bench.finish()


GENERATE_SCRIPT = """
import http.client, json, sys, time
body = {"text": sys.argv[1], "sampling_params": {"temperature": 0, "max_new_tokens": int(sys.argv[2])}, "stream": True}
connection = http.client.HTTPConnection("127.0.0.1", 30000, timeout=120)
start = time.time()
connection.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
done = any(line.strip() == b"data: [DONE]" for line in connection.getresponse())
print(json.dumps({"start": start, "stop": time.time(), "done": done}))
"""


def plain_generation(lab, host: str, prompt: str, tokens: int) -> dict:
    """The probe's own generation request, sent by a plain client on the host (curl -N would do the same)."""
    return json.loads(sh(lab, host, f"python3 - {shlex.quote(prompt)} {tokens} <<'EOF'\n{GENERATE_SCRIPT}\nEOF"))


def plain_generation_over_ssh(lab, host: str, prompt: str, tokens: int) -> dict:
    """The same request as ``ssh host python3 -`` from the controller, timed there."""
    began, ended, proc = over_ssh(lab, host, f"python3 - {shlex.quote(prompt)} {tokens}", stdin=GENERATE_SCRIPT)
    done = proc.returncode == 0 and json.loads(proc.stdout)["done"]
    return {"start": began, "stop": ended, "ok": done}


def test_bench_probe_against_its_own_generation_request(one_host, tmp_path):
    """Per round: the probe's generation sent by a plain client, then the sglang_probe task beside a ping task."""
    lab = one_host
    host = lab.hosts[0]
    variables = engine_vars(1)
    apply_role(lab, host, variables)
    probe = {"unit": UNIT, "tp_size": 2, "url": URL}
    prompt, tokens = "List the first five prime numbers.", 32  # the module's default prompt and length
    bench = Recorder("probe", lab, {"engine": variables, "probe": probe, "prompt": prompt, "max_new_tokens": tokens})
    for round_number in range(RUNS):
        with bench.part(f"round {round_number + 1}"):
            generation = plain_generation(lab, host, prompt, tokens)
            bench.sample(
                round=round_number,
                side="operator",
                start=generation["start"],
                stop=generation["stop"],
                ok=generation["done"],
            )
            bench.sample(
                round=round_number, side="operator_ssh", **plain_generation_over_ssh(lab, host, prompt, tokens)
            )
            run, results = run_tasks(lab, host, tmp_path, bench_probe=probe)
            bench.sample(round=round_number, side="first_use", **task_interval(run, "First use of sglang_probe", host))
            result = results["probe"]
            bench.sample(
                round=round_number,
                side="collection",
                **task_interval(run, "Probe", host),
                ok=bool(result.get("healthy")),
                module_elapsed_s=result.get("elapsed_s"),
                module_generation_s=(result.get("generation") or {}).get("latency_s"),
            )
            bench.sample(
                round=round_number, side="ansible_task", **task_interval(run, "Ansible's own cost of a task", host)
            )
    bench.finish()


HANG_UNIT = """\
[Unit]
Description=An engine whose generation hangs while /health answers
[Service]
Environment={path}
ExecStart=/opt/sglang/venv/bin/python -m sglang_sim.launch_server --model-path {model} --tp-size 1 --port 30000 \
 --enable-metrics --sim-load-time 0.5 --sim-warmup-time 0.2 --sim-fault {fault}
"""
STUCK_CLIENTS = """
import http.client, json, threading, time
def stuck():
    # Sent again while the engine refuses the connection: from then on it never answers.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", 30000, timeout=600)
        body = {"text": "a request the hung engine never answers", "sampling_params": {"max_new_tokens": 16}}
        try:
            connection.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
            connection.getresponse().read()
        except OSError:
            pass
        time.sleep(0.2)
threads = [threading.Thread(target=stuck) for _ in range(4)]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
"""
# The first generation gets the scheduler stuck in a forward pass; from then on its gauges keep that batch (one
# running request) whatever arrives later, as SGLang's scheduler does (tests/lab/README.md).
HELD = """
import re, sys, time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:30000/metrics", timeout=5).read().decode()
    except OSError:
        text = ""
    held = sum(float(m) for m in re.findall(r'^sglang:num_(?:running|queue)_reqs(?:\\{[^}]*\\})? (\\S+)', text, re.M))
    if held >= 1:
        sys.exit(0)
    time.sleep(0.1)
sys.exit("the hung engine never held a stuck request")
"""
# One GET as an operator's `curl -s -m TIMEOUT` sends it (the lab's hosts have no curl; urllib asks the same way).
OPERATOR_GET = """
import json, time, urllib.error, urllib.request
start = time.time()
try:
    status = urllib.request.urlopen("http://127.0.0.1:30000{path}", timeout={timeout}).status
except urllib.error.HTTPError as exc:
    status = exc.code
except OSError as exc:
    status = "timed out" if "timed out" in str(exc) else None
print(json.dumps({{"start": start, "stop": time.time(), "status": status}}))
"""


def start_busy_engine(lab, host: str, unit: str, unit_text: str, clients: str, name: str, seconds: int) -> None:
    """Start ``unit`` and wait until it is ready, then run ``clients`` on the host in the background (at most
    ``seconds``) until the scheduler's gauges hold a request.

    Ready first: a request that arrives during the warm-up hangs the warm-up too, and the engine that never became
    ready answers /health 503 at once; the benchmarks are of engines that serve."""
    install_unit(lab, host, unit, unit_text)
    sh(lab, host, f"systemctl start {unit}")
    wait_ready(lab, host, timeout=60)
    sh(
        lab,
        host,
        f"cat > /run/{name}.py <<'EOF'\n{clients}\nEOF\n"
        f"(timeout {seconds} python3 /run/{name}.py) </dev/null >/dev/null 2>&1 &",
    )
    sh(lab, host, f"python3 - <<'EOF'\n{HELD}\nEOF", timeout=90)


def progress_tasks(unit: str) -> dict:
    """bench_tasks.yml's probes of ``unit``: the full probe with the progress tier, each tier alone."""
    alone = {"unit": unit, "tp_size": 1, "url": URL, "fail_on_unhealthy": False}
    return {
        "bench_probe": alone | {"progress_window": PROGRESS_WINDOW, "generate_timeout": 60},
        "bench_progress": alone | {"tiers": ["progress"], "progress_window": PROGRESS_WINDOW},
        "bench_unit_tier": alone | {"tiers": ["unit"]},
    }


def operator_get(lab, host: str, path: str, timeout: float) -> dict:
    get = OPERATOR_GET.format(path=path, timeout=timeout)
    return json.loads(sh(lab, host, f"python3 - <<'EOF'\n{get}\nEOF", timeout=timeout + 30))


# bench_tasks.yml's probe tasks: the task's name and the sample's side, by the key of its result.
PROBE_TASKS = {
    "probe": ("Probe", "collection"),
    "progress": ("Probe the progress tier alone", "tier"),
    "unit_tier": ("Probe the unit tier alone", "unit_tier"),
}


def sample_probes(bench, run, results: dict, host: str, round_number: int, keys: tuple, named_hang: str) -> None:
    """One sample per probe task of ``keys``; the field ``named_hang`` says whether it named the engine hung."""
    for key in keys:
        name, side = PROBE_TASKS[key]
        result = results[key]
        bench.sample(
            round=round_number,
            side=side,
            **task_interval(run, name, host),
            healthy=result.get("healthy"),
            failed_tier=result.get("failed_tier"),
            state=result.get("state"),
            module_elapsed_s=result.get("elapsed_s"),
            reason=str(result.get("reason", ""))[:300],
            **{named_hang: result.get("failed_tier") == "progress"},
        )


def test_bench_progress_tier_on_a_hung_engine(one_host, tmp_path):
    """Per round: the operator's /health check (curl -sf once), then in one play a ping, the full probe with the
    progress tier, the progress tier alone and the unit tier alone, on an engine whose generation is stuck."""
    lab = one_host
    host = lab.hosts[0]
    unit = "t-bench-hang.service"
    bench = Recorder("progress", lab, {"window_s": PROGRESS_WINDOW, "fault": HANG_FAULT, "stuck_clients": 4})
    try:
        unit_text = HANG_UNIT.format(model=MODEL, fault=HANG_FAULT, path=SERVICE_PATH)
        start_busy_engine(lab, host, unit, unit_text, STUCK_CLIENTS, "stuck", 600)
        tasks = progress_tasks(unit)
        for round_number in range(RUNS):
            with bench.part(f"round {round_number + 1}"):
                health = operator_get(lab, host, "/health", 60)
                bench.sample(
                    round=round_number,
                    side="operator",
                    start=health["start"],
                    stop=health["stop"],
                    status=health["status"],
                    detected=health["status"] != 200,
                )
                run, results = run_tasks(lab, host, tmp_path, **tasks)
                sample_probes(bench, run, results, host, round_number, ("probe", "progress", "unit_tier"), "detected")
                bench.sample(
                    round=round_number, side="ansible_task", **task_interval(run, "Ansible's own cost of a task", host)
                )
                bench.sample(
                    round=round_number, side="first_use", **task_interval(run, "First use of sglang_probe", host)
                )
    finally:
        sh(lab, host, "pkill -f '[s]tuck.py'; true")
    bench.finish()


SLOW_UNIT = """\
[Unit]
Description=An engine that decodes {tokens_per_s:g} tokens per second
[Service]
Environment={path}
ExecStart=/opt/sglang/venv/bin/python -m sglang_sim.launch_server --model-path {model} --tp-size 1 --port 30000 \
 --enable-metrics --sim-load-time 0.5 --sim-warmup-time 0.2 --sim-token-latency-ms {latency_ms:g}
"""
# Requests that outlast the benchmark: at 2 tokens per second each takes about 2000 s.
SLOW_CLIENTS = """
import http.client, json, threading, time
def busy():
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", 30000, timeout=900)
        params = {"max_new_tokens": 4000, "ignore_eos": True}
        body = {"text": "a request that decodes slowly", "sampling_params": params}
        try:
            connection.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
            connection.getresponse().read()
        except OSError:
            time.sleep(0.2)
threads = [threading.Thread(target=busy) for _ in range(4)]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
"""
SLOW_TOKENS_PER_S = 2.0


def test_bench_progress_tier_on_a_slow_engine(one_host, tmp_path):
    """Per round: an operator's `curl -m 5 /health_generate`, then the full probe with the progress tier and the
    progress tier alone, on an engine that decodes 2 tokens per second while 4 requests run: a slow engine that
    progresses is no hang."""
    lab = one_host
    host = lab.hosts[0]
    unit = "t-bench-slow.service"
    latency_ms = 1000.0 / SLOW_TOKENS_PER_S
    settings = {"window_s": PROGRESS_WINDOW, "tokens_per_s": SLOW_TOKENS_PER_S, "busy_clients": 4}
    bench = Recorder("progress_slow", lab, settings)
    text = SLOW_UNIT.format(tokens_per_s=SLOW_TOKENS_PER_S, latency_ms=latency_ms, model=MODEL, path=SERVICE_PATH)
    try:
        # The scheduler's gauges show the requests only at its next stats log (every 40 decode steps: 20 s here).
        start_busy_engine(lab, host, unit, text, SLOW_CLIENTS, "slow", 900)
        tasks = progress_tasks(unit)
        del tasks["bench_unit_tier"]
        for round_number in range(RUNS):
            with bench.part(f"round {round_number + 1}"):
                health = operator_get(lab, host, "/health_generate", 5)
                bench.sample(
                    round=round_number, side="operator", start=health["start"], stop=health["stop"],
                    status=health["status"],
                )  # fmt: skip
                run, results = run_tasks(lab, host, tmp_path, **tasks)
                sample_probes(bench, run, results, host, round_number, ("probe", "progress"), "hung")
    finally:
        sh(lab, host, "pkill -f '[s]low.py'; true")
    bench.finish()
