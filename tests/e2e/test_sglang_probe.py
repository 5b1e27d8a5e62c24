"""sglang_probe on real systemd against the simulated engine: a unit systemd calls "active" is not yet "serving".

Each fault is caught by the tier an operator would look at, with a reason that says what is wrong. Servers
start with a 1 s load, and cases that need separate servers run on separate hosts at the same time. The engine
behaves as SGLang 0.5.23 does (tests/lab/README.md): /health runs a generation, /ready does not, a scheduler stuck
in a forward pass freezes its gauges, and GPU memory is released a moment after its holder exits.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest
from labutil import SERVICE_PATH, install_unit, read_ready_time, sh, start_ready_watch, wait_answers, wait_ready
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FLEET_PROBE = REPO / "playbooks" / "fleet_probe.yml"
MODULE = "llmops.inference.sglang_probe"
UNIT = "t-probe.service"
MODEL = "Qwen/Qwen3-8B"
URL = "http://127.0.0.1:30000"
TEXTFILE = "/run/sglang_probe.prom"
READY_FILE = "/run/probe-ready"

UNIT_TEMPLATE = """\
[Unit]
Description=sglang_probe test server ({faults})
StartLimitIntervalSec=0

[Service]
Environment=SGLANG_SIM_FAULTS={faults}
Environment={path}
ExecStart=/opt/sglang/venv/bin/python -m sglang_sim.launch_server --model-path {model} --tp-size 2 \
--host 127.0.0.1 --port 30000 --sim-load-time {load_time} {extra}
KillMode=control-group
{restart}
"""


def start_server(lab, host, faults: str = "", restart: str = "", load_time: float = 1, extra: str = "") -> None:
    text = UNIT_TEMPLATE.format(
        faults=faults, path=SERVICE_PATH, model=MODEL, restart=restart, load_time=load_time, extra=extra
    )
    install_unit(lab, host, UNIT, text)
    sh(lab, host, f"systemctl start {UNIT}")


def probe(lab, host, **args) -> dict:
    return lab.module(host, MODULE, {"unit": UNIT, "tp_size": 2, **args})


def tier(result: dict, name: str) -> dict:
    return next(entry for entry in result["tiers"] if entry["name"] == name)


def http_status(lab, host, path: str) -> int:
    """The status of GET ``path`` on the host's server."""
    code = (
        "import urllib.error, urllib.request\n"
        "try:\n"
        f"    print(urllib.request.urlopen('{URL}{path}', timeout=60).status)\n"
        "except urllib.error.HTTPError as error:\n"
        "    print(error.code)\n"
    )
    return int(sh(lab, host, f"python3 - <<'EOF'\n{code}EOF"))


def requests_logged(lab, host, path: str) -> int:
    """How many requests for ``path`` the server logged (uvicorn's access lines in the journal)."""
    journal = lab.exec(host, f"journalctl -u {UNIT} --no-pager -o cat").stdout
    return len(re.findall(rf'"GET {re.escape(path)} HTTP/1\.1"', journal))


def hosts_for(lab, count: int) -> list:
    """``count`` hosts, reusing hosts when the lab has fewer (then cases on one host run one after another)."""
    return [lab.hosts[index % len(lab.hosts)] for index in range(count)]


def test_healthy_host_passes_every_tier_and_the_gate_opens_once_ready(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    # Long enough that the gate is already waiting when the engine is ready, even when the module's own start (an
    # ad-hoc ansible run) takes seconds on a crowded machine.
    start_server(lab, host, load_time=15)
    start_ready_watch(lab, host, READY_FILE, path="/ready")

    gate = probe(lab, host, wait_timeout=60, stability_window=1, expected_model=MODEL, textfile_path=TEXTFILE)
    assert gate["_status"] == "SUCCESS", gate
    assert gate["healthy"] is True and gate["changed"] is False
    assert [(entry["name"], entry["status"]) for entry in gate["tiers"]] == [
        ("unit", "ok"),
        ("gpu", "ok"),
        ("progress", "skipped"),
        ("health", "ok"),
        ("model", "ok"),
        ("generate", "ok"),
        ("floors", "skipped"),
        ("soak", "skipped"),
    ]
    assert tier(gate, "health")["reason"] == "HTTP 200 on /ready"
    assert gate["state"] == "serving" and gate["unreapable"] == []
    held = gate["gpu_memory_mib"]  # every GPU of the host; the unit's are 0 and 1
    assert {"0", "1"} <= set(held) and min(held["0"], held["1"]) > 1024
    assert gate["generation"]["completion_tokens"] == 32 and gate["generation"]["text"]
    assert gate["n_restarts"] == 0 and gate["main_pid"] > 0
    assert gate["speculative"]["algorithm"] is None
    assert gate["waited_s"] > 0 and gate["attempts"] > 1

    families = {family.name: family for family in text_string_to_metric_families(sh(lab, host, f"cat {TEXTFILE}"))}
    assert families["llmops_sglang_probe_healthy"].samples[0].value == 1.0
    assert {sample.labels["tier"] for sample in families["llmops_sglang_probe_tier_ok"].samples} == {
        "unit",
        "gpu",
        "health",
        "model",
        "generate",
    }
    # Both times are the host's wall clock: /ready's first 200 and the probe's end (the textfile's timestamp).
    finished = families["llmops_sglang_probe_last_run_timestamp_seconds"].samples[0].value
    ready = read_ready_time(lab, host, READY_FILE)
    print(
        f"\ngate: waited {gate['waited_s']} s in {gate['attempts']} attempts; returned {finished - ready:.3f} s after "
        f"/ready turned 200 (generation {gate['generation']['latency_s']} s of it)"
    )
    assert finished > ready, "the gate returned after the server was ready, not before"

    again = probe(lab, host, generate_timeout=10)
    assert again["healthy"] is True, again
    per_tier = ", ".join(f"{entry['name']} {entry['elapsed_s']}" for entry in again["tiers"])
    print(
        f"probe: {again['elapsed_s']:.3f} s in all, generation {again['generation']['latency_s']:.3f} s "
        f"(tiers: {per_tier})"
    )
    # Readiness came from /ready: SGLang's /health is a generation of its own, which the probe never sends.
    assert requests_logged(lab, host, "/ready") >= gate["attempts"] + again["attempts"]
    assert requests_logged(lab, host, "/health") == 0

    no_textfile = {"unit": UNIT, "tp_size": 2, "textfile_path": "/run/never-written.prom"}
    checked = lab.module(host, MODULE, no_textfile, check=True)
    assert checked["healthy"] is True and checked["textfile_written"] is False, checked

    wrong = probe(lab, host, expected_model="meta-llama/Llama-3.1-8B")
    assert wrong["_status"] == "FAILED!"
    assert wrong["failed_tier"] == "model"
    assert wrong["msg"] == (
        "sglang_probe: model failed: server serves 'Qwen/Qwen3-8B' (model_path 'Qwen/Qwen3-8B', /v1/models ids "
        "['Qwen/Qwen3-8B']), expected 'meta-llama/Llama-3.1-8B'"
    )

    bad = probe(lab, host, expect_regex="(unclosed")
    assert bad["_status"] == "FAILED!" and bad["option"] == "expect_regex"

    # Without --enable-metrics /metrics answers 404: the progress tier says so and the host still serves.
    no_metrics = probe(lab, host, progress_window=2, soak_requests=5, soak_max_new_tokens=4)
    assert no_metrics["healthy"] is True, no_metrics
    assert tier(no_metrics, "progress")["status"] == "skipped"
    assert tier(no_metrics, "progress")["reason"].startswith("/metrics answered HTTP 404")
    assert no_metrics["soak"]["completed"] == 5 and len(no_metrics["soak"]["latencies_s"]) == 5
    for args, option in (({"progress_window": 0}, "progress_window"), ({"soak_requests": -1}, "soak_requests")):
        refused = probe(lab, host, **args)
        assert refused["_status"] == "FAILED!" and refused["option"] == option, refused
        assert refused["msg"].startswith(option) and "tiers" not in refused, "nothing probed"


def test_each_fault_is_caught_by_its_tier(clean_lab):
    lab = clean_lab
    cases = {
        "never-load": {},
        "generate-hang": {"generate_timeout": 3},
        "degenerate": {"max_new_tokens": 8},
    }
    by_host = {}
    for host, fault in zip(hosts_for(lab, len(cases)), cases):
        by_host.setdefault(host, []).append(fault)
    results = {}
    for round_number in range(max(len(faults) for faults in by_host.values())):
        batch = [(host, faults[round_number]) for host, faults in by_host.items() if round_number < len(faults)]
        for host, fault in batch:
            lab.exec(host, f"systemctl stop {UNIT}; rm -rf /var/lib/simgpu/claims/*")
            start_server(lab, host, faults=fault)
        for host, fault in batch:
            if fault == "never-load":
                # The model never loads, so the warm-up never answers: the server stays Starting, and only the
                # endpoints the tokenizer manager answers alone (/v1/models, /model_info) say it is up.
                wait_answers(lab, host, "/v1/models", timeout=60)
                results["never-load, readiness"] = probe(lab, host, tiers=["health"], fail_on_unhealthy=False)
                results["never-load, /health"] = http_status(lab, host, "/health")
            else:
                wait_ready(lab, host, timeout=60)
            results[fault] = probe(lab, host, fail_on_unhealthy=False, **cases[fault])

    never = results["never-load"]
    assert never["_status"] == "SUCCESS" and never["healthy"] is False, never
    assert never["failed_tier"] == "gpu"
    assert (
        never["reason"]
        == "unit active but its processes hold 0 MiB on GPU 0 (1 MiB used on the GPU in all): model not loaded"
    )
    assert never["msg"] == "sglang_probe: gpu failed: " + never["reason"]
    assert tier(never, "unit")["status"] == "ok"
    readiness = results["never-load, readiness"]
    assert readiness["failed_tier"] == "health", readiness
    assert readiness["reason"] == "/ready returned HTTP 503 (starting, paused, draining or unhealthy)"
    assert results["never-load, /health"] == 503

    hang = results["generate-hang"]
    assert hang["failed_tier"] == "generate"
    assert hang["reason"] == "generation timed out: no response from /generate within 3.0 s"
    assert [tier(hang, name)["status"] for name in ("unit", "gpu", "health", "model")] == ["ok"] * 4

    degenerate = results["degenerate"]
    assert degenerate["failed_tier"] == "generate"
    assert degenerate["reason"] == "degenerate output: '!!!!!!!!' (one character repeated 8 times)"


def test_crash_loop_is_caught_by_the_unit_tier_without_waiting_out_the_timeout(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    start_server(lab, host, faults="crash-on-load", restart="Restart=on-failure\nRestartSec=1")

    started = time.monotonic()
    gate = probe(lab, host, wait_timeout=120)
    took = time.monotonic() - started
    assert gate["_status"] == "FAILED!"
    assert gate["failed_tier"] == "unit", gate
    match = re.fullmatch(
        r"unit restarting: MainPID (\d+) -> (\d+), NRestarts (\d+) -> (\d+) within (\d+\.\d) s", gate["reason"]
    )
    assert match, gate["reason"]
    before_pid, after_pid, before_n, after_n = (int(value) for value in match.groups()[:4])
    assert 0 < before_pid != after_pid and after_n > before_n
    assert gate["msg"] == "sglang_probe: unit failed: " + gate["reason"]
    print(f"\ncrash loop: gave up after {gate['waited_s']} s ({took:.1f} s with Ansible): {gate['reason']}")
    assert took < 120, "the wait ends at the restart, not at wait_timeout"

    windowed = probe(lab, host, stability_window=6, fail_on_unhealthy=False)
    assert windowed["failed_tier"] == "unit"
    assert re.fullmatch(
        r"unit restarting: MainPID [1-9]\d* -> \d+, NRestarts \d+ -> \d+ within \d+\.\d s", windowed["reason"]
    )
    print(f"single probe with a 6 s window: {windowed['reason']}")


HANGING_CLIENT = (
    "import json, urllib.request; body = json.dumps({'text': 'hello', 'sampling_params': {'max_new_tokens': 64}});"
    "urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:30000/generate', body.encode(),"
    " {'Content-Type': 'application/json'}), timeout=600).read()"
)
WAIT_RUNNING = """
import re, sys, time, urllib.request
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    text = urllib.request.urlopen("http://127.0.0.1:30000/metrics", timeout=2).read().decode()
    found = re.search(r"^sglang:num_running_reqs\\S* (\\S+)$", text, re.MULTILINE)
    if found and float(found.group(1)) >= {count}:
        sys.exit(0)
    time.sleep(0.1)
sys.exit("requests never ran")
"""


def send_requests_that_hang(lab, host, count: int, running: int) -> None:
    """Send ``count`` requests that never finish, in the background; wait until /metrics shows ``running``."""
    client = shlex.quote(HANGING_CLIENT)
    sh(lab, host, f"for i in $(seq {count}); do (python3 -c {client} </dev/null >/dev/null 2>&1 &); done")
    sh(lab, host, f"python3 - <<'EOF'\n{WAIT_RUNNING.format(count=running)}\nEOF", timeout=60)


def fleet_probe(lab, host, window: float, **extra) -> str:
    variables = {
        "fleet_probe_hosts": host,
        "fleet_probe_progress_window": window,
        "sglang_service_name": UNIT[: -len(".service")],
        "sglang_service_tp_size": 2,
        "sglang_service_model_path": MODEL,
        **extra,
    }
    proc = lab.playbook(FLEET_PROBE, variables, timeout=300)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


def test_progress_tier_names_a_hung_engine_within_one_window(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    start_server(lab, host, faults="generate-hang", extra="--enable-metrics")
    wait_ready(lab, host, timeout=60)

    idle = probe(lab, host, progress_window=3, tiers=["unit", "gpu", "progress", "health", "model"])
    assert idle["healthy"] is True, idle
    assert tier(idle, "progress")["reason"] == "idle: 0 running, 0 queued"
    assert idle["progress"]["observed_s"] == 0, "an idle engine is judged at the first scrape"

    # The first generation gets the scheduler stuck in a forward pass; it stops updating its gauges, which keep
    # the batch it was running (that one request) whatever arrives later, as SGLang's scheduler does.
    send_requests_that_hang(lab, host, 2, running=1)
    hung = probe(lab, host, progress_window=3, generate_timeout=30, fail_on_unhealthy=False, textfile_path=TEXTFILE)
    assert hung["failed_tier"] == "progress", hung
    assert hung["reason"] == "hung: 1 running, 0 queued, no token generated in 3 s"
    assert hung["state"] == "hung" and hung["msg"] == "sglang_probe: progress failed: " + hung["reason"]
    assert (hung["progress"]["verdict"], hung["progress"]["generated_tokens"]) == ("hung", 0)
    assert hung["progress"]["observed_s"] >= 3, "judged hung only once the whole window passed"
    assert tier(hung, "generate")["status"] == "skipped", "no generation is sent to a hung engine"
    print(
        f"\nhung engine: named after {hung['elapsed_s']:.2f} s of probing, the progress tier "
        f"{tier(hung, 'progress')['elapsed_s']:.3f} s for its 3 s window"
    )
    families = {family.name: family for family in text_string_to_metric_families(sh(lab, host, f"cat {TEXTFILE}"))}
    states = {sample.labels["state"]: sample.value for sample in families["llmops_sglang_probe_state"].samples}
    assert states == {"serving": 0.0, "not_serving": 0.0, "hung": 1.0, "needs_gpu_reset": 0.0}
    assert families["llmops_sglang_probe_progress_running_requests"].samples[0].value == 1.0

    # Without the progress tier, readiness still says 200 (no health check has failed) and the one-shot
    # generation times out after its deadline, which cannot say that requests are stuck.
    started = time.monotonic()
    alone = probe(lab, host, generate_timeout=6, fail_on_unhealthy=False)
    took_alone = time.monotonic() - started
    assert alone["failed_tier"] == "generate" and alone["state"] == "not_serving", alone
    assert alone["reason"] == "generation timed out: no response from /generate within 6.0 s"
    assert tier(alone, "health")["reason"] == "HTTP 200 on /ready"
    assert took_alone >= 6

    started = time.monotonic()
    report = fleet_probe(lab, host, window=3)
    print(f"fleet_probe named the hung host in {time.monotonic() - started:.2f} s")
    hung_line = rf"{host}: HUNG \(progress: hung: 1 running, 0 queued, no token generated in 3 s\) \| pid [1-9]"
    assert re.search(hung_line, report), report[-3000:]
    assert "fleet probe: 0 of 1 host(s) serve, 1 hung, 0 need a GPU reset" in report, report[-3000:]


def test_an_engine_that_hangs_after_some_requests_is_caught_by_soak_and_progress(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    start_server(lab, host, faults="hang-after-requests=4", extra="--enable-metrics")
    wait_ready(lab, host, timeout=60)

    once = probe(lab, host, generate_timeout=5, fail_on_unhealthy=False)
    assert once["healthy"] is True, "a one-shot generation at deploy time passes"
    soak = probe(lab, host, generate_timeout=5, soak_requests=10, soak_max_new_tokens=4, fail_on_unhealthy=False)
    assert soak["failed_tier"] == "soak", soak
    # Generations 1 (the first probe's), 2 (this probe's generate tier), 3 and 4 (soak requests 1 and 2) are
    # served; the fifth, soak request 3, gets the scheduler stuck.
    assert soak["soak"]["failed_request"] == 3 and soak["soak"]["completed"] == 2, soak["soak"]
    assert soak["reason"].startswith("soak request 3 of 10 timed out: no response from /generate within 5.0 s")

    report = fleet_probe(lab, host, window=3)
    hung_line = rf"{host}: HUNG \(progress: hung: 1 running, 0 queued, no token generated in 3 s\)"
    assert re.search(hung_line, report), report[-3000:]


def test_progress_stall_is_named_while_health_answers(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    start_server(lab, host, faults="progress-stall", extra="--enable-metrics")
    wait_ready(lab, host, timeout=60)
    send_requests_that_hang(lab, host, 2, running=2)
    result = probe(lab, host, progress_window=3, tiers=["progress", "health"], fail_on_unhealthy=False)
    assert result["failed_tier"] == "progress" and result["state"] == "hung", result
    assert result["reason"] == "hung: 2 running, 0 queued, no token generated in 3 s"
    assert tier(result, "health")["status"] == "skipped"
    assert probe(lab, host, tiers=["health"])["healthy"] is True, "/ready alone says the engine is fine"
    assert http_status(lab, host, "/health") == 200, "so does SGLang's generating /health: the idle loop answers it"


def test_a_stopped_host_whose_gpu_memory_stays_needs_a_gpu_reset(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    start_server(lab, host)
    wait_ready(lab, host, timeout=60)
    # A release lag long enough that the probe still sees the stopped engine's memory being released, and shorter
    # than the 2 s the probe gives memory without a holder before it calls it unreapable.
    sh(lab, host, "echo 1900 > /var/lib/simgpu/release_lag_ms")
    try:
        sh(lab, host, f"systemctl stop {UNIT}")
        stuck = sh(lab, host, "simgpu-claim --stuck --force --gpu 0 --mib 30000")
        assert "which no longer exists" in stuck, stuck
        assert sh(lab, host, "nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits").split() == []
        result = probe(lab, host, fail_on_unhealthy=False, textfile_path=TEXTFILE)
    finally:
        sh(lab, host, "rm -f /var/lib/simgpu/release_lag_ms")
    assert result["failed_tier"] == "unit", result
    assert result["state"] == "needs_gpu_reset", result
    # NVML lists live processes only: the memory shows as used with no process listed (nvidia-smi's "No running
    # processes found"), and GPU 1, whose memory the driver was still releasing, is not reported.
    assert result["reset_gpus"] == [0]
    reset = (
        "GPU 0 needs a reset or a reboot: 30001 MiB used beyond the driver's 454 MiB reservation that no listed "
        "process holds (more than 1024 MiB)"
    )
    assert result["reset_message"] == reset
    assert [(entry["gpu"], entry["pid"], entry["mib"]) for entry in result["unreapable"]] == [(0, None, 30001)]
    families = {family.name: family for family in text_string_to_metric_families(sh(lab, host, f"cat {TEXTFILE}"))}
    states = {sample.labels["state"]: sample.value for sample in families["llmops_sglang_probe_state"].samples}
    assert states["needs_gpu_reset"] == 1.0
    report = fleet_probe(lab, host, window=3)
    assert f"{host}: NEEDS GPU RESET ({reset})" in report, report[-3000:]

    # The runbook's reset frees it; the stopped host is then only not serving.
    assert "GPU 0 reset" in sh(lab, host, "simgpu-claim --reset-gpu 0")
    after = probe(lab, host, fail_on_unhealthy=False)
    assert (after["state"], after["unreapable"]) == ("not_serving", []), after
