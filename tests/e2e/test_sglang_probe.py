"""sglang_probe on real systemd against the simulated engine: failure 2 ("active" is not "serving").

Each fault is caught by the tier an operator would look at, with a reason that says what is wrong. Servers
start with a 1 s load, and cases that need separate servers run on separate hosts at the same time.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest
from labutil import install_unit, read_ready_time, sh, start_ready_watch, wait_healthy
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
ExecStart=/opt/sglang/venv/bin/python -m sglang_sim.launch_server --model-path {model} --tp-size 2 \
--host 127.0.0.1 --port 30000 --sim-load-time {load_time} {extra}
KillMode=control-group
{restart}
"""


def start_server(lab, host, faults: str = "", restart: str = "", load_time: float = 1, extra: str = "") -> None:
    text = UNIT_TEMPLATE.format(faults=faults, model=MODEL, restart=restart, load_time=load_time, extra=extra)
    install_unit(lab, host, UNIT, text)
    sh(lab, host, f"systemctl start {UNIT}")


def probe(lab, host, **args) -> dict:
    return lab.module(host, MODULE, {"unit": UNIT, "tp_size": 2, **args})


def tier(result: dict, name: str) -> dict:
    return next(entry for entry in result["tiers"] if entry["name"] == name)


def hosts_for(lab, count: int) -> list:
    """``count`` hosts, reusing hosts when the lab has fewer (then cases on one host run one after another)."""
    return [lab.hosts[index % len(lab.hosts)] for index in range(count)]


def test_healthy_host_passes_every_tier_and_the_gate_opens_soon_after_ready(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    start_server(lab, host, load_time=5)  # long enough that the gate is already waiting when the engine is ready
    start_ready_watch(lab, host, READY_FILE)

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
    assert gate["state"] == "serving" and gate["unreapable"] == []
    assert set(gate["gpu_memory_mib"]) == {"0", "1"} and min(gate["gpu_memory_mib"].values()) > 1024
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
    # Both times are the host's wall clock: /health's first 200 and the probe's end (the textfile's timestamp).
    finished = families["llmops_sglang_probe_last_run_timestamp_seconds"].samples[0].value
    ready = read_ready_time(lab, host, READY_FILE)
    gate_latency = finished - ready
    print(
        f"\ngate: waited {gate['waited_s']} s in {gate['attempts']} attempts; returned {gate_latency:.3f} s after "
        f"/health turned 200 (generation {gate['generation']['latency_s']} s of it)"
    )
    assert gate_latency < 1.0

    again = probe(lab, host, generate_timeout=10)
    overhead = again["elapsed_s"] - again["generation"]["latency_s"]
    per_tier = ", ".join(f"{entry['name']} {entry['elapsed_s']}" for entry in again["tiers"])
    print(
        f"probe: {again['elapsed_s']:.3f} s in all, generation {again['generation']['latency_s']:.3f} s, "
        f"overhead {overhead:.3f} s (tiers: {per_tier})"
    )
    assert overhead < 0.5

    checked = lab.module(host, MODULE, {"unit": UNIT, "textfile_path": "/run/never-written.prom"}, check=True)
    assert checked["healthy"] is True and checked["textfile_written"] is False

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
            wait_healthy(lab, host, timeout=60)
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
    assert took < 30

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


def send_requests_that_hang(lab, host, count: int) -> None:
    """Requests that the engine takes and never finishes, sent in the background; wait until they run."""
    client = shlex.quote(HANGING_CLIENT)
    sh(lab, host, f"for i in $(seq {count}); do (python3 -c {client} </dev/null >/dev/null 2>&1 &); done")
    sh(lab, host, f"python3 - <<'EOF'\n{WAIT_RUNNING.format(count=count)}\nEOF", timeout=60)


def sim_supports(lab, host, *needles: str) -> bool:
    """Whether the lab's engine double knows these fault names or flags (newer labs add them)."""
    listing = lab.exec(
        host,
        "/opt/sglang/venv/bin/python -c 'from sglang_sim import faults; print(*faults.FAULTS)';"
        " /opt/sglang/venv/bin/python -m sglang_sim.launch_server --help",
    ).stdout
    return all(needle in listing for needle in needles)


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
    wait_healthy(lab, host, timeout=60)

    idle = probe(lab, host, progress_window=3, tiers=["unit", "gpu", "progress", "health", "model"])
    assert idle["healthy"] is True, idle
    assert tier(idle, "progress")["reason"] == "idle: 0 running, 0 queued"
    assert tier(idle, "progress")["elapsed_s"] < 0.5, "an idle engine is judged at the first scrape"

    send_requests_that_hang(lab, host, 3)
    started = time.monotonic()
    hung = probe(lab, host, progress_window=3, generate_timeout=30, fail_on_unhealthy=False, textfile_path=TEXTFILE)
    took = time.monotonic() - started
    assert hung["failed_tier"] == "progress", hung
    assert hung["reason"] == "hung: 3 running, 0 queued, no token generated in 3 s"
    assert hung["state"] == "hung" and hung["msg"] == "sglang_probe: progress failed: " + hung["reason"]
    assert tier(hung, "generate")["status"] == "skipped", "no generation is sent to a hung engine"
    progress_cost = tier(hung, "progress")["elapsed_s"] - 3
    print(
        f"\nhung engine: named after {hung['elapsed_s']:.2f} s of probing ({took:.2f} s with Ansible), the progress "
        f"tier {progress_cost:.3f} s beyond its 3 s window"
    )
    assert progress_cost <= 0.3
    assert hung["elapsed_s"] <= 3 + 1
    families = {family.name: family for family in text_string_to_metric_families(sh(lab, host, f"cat {TEXTFILE}"))}
    states = {sample.labels["state"]: sample.value for sample in families["llmops_sglang_probe_state"].samples}
    assert states == {"serving": 0.0, "not_serving": 0.0, "hung": 1.0, "needs_gpu_reset": 0.0}
    assert families["llmops_sglang_probe_progress_running_requests"].samples[0].value == 3.0

    # The one-shot generate tier alone times out after its deadline and cannot say that requests are stuck.
    started = time.monotonic()
    alone = probe(lab, host, generate_timeout=6, fail_on_unhealthy=False)
    took_alone = time.monotonic() - started
    assert alone["failed_tier"] == "generate" and alone["state"] == "not_serving", alone
    assert alone["reason"] == "generation timed out: no response from /generate within 6.0 s"
    assert took_alone >= 6

    started = time.monotonic()
    report = fleet_probe(lab, host, window=3)
    print(f"fleet_probe named the hung host in {time.monotonic() - started:.2f} s")
    # The generate tier's request above hangs too: the engine now runs four.
    hung_line = rf"{host}: HUNG \(progress: hung: 4 running, 0 queued, no token generated in 3 s\) \| pid [1-9]"
    assert re.search(hung_line, report), report[-3000:]
    assert "fleet probe: 0 of 1 host(s) serve, 1 hung, 0 need a GPU reset" in report, report[-3000:]


LAB_FEATURE_HANG_AFTER = "the lab's fault hang-after-requests with --sim-hang-after-requests N (tests/lab/sglang_sim)"
LAB_FEATURE_STALL = "the lab's fault progress-stall (tests/lab/sglang_sim)"
LAB_FEATURE_VANISHED = "simulated GPU memory held by a PID that no longer exists (tests/lab/simgpu)"


def test_an_engine_that_hangs_after_some_requests_is_caught_by_soak_and_progress(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    if not sim_supports(lab, host, "hang-after-requests", "--sim-hang-after-requests"):
        pytest.skip(f"needs {LAB_FEATURE_HANG_AFTER}")
    start_server(lab, host, faults="hang-after-requests", extra="--enable-metrics --sim-hang-after-requests 4")
    wait_healthy(lab, host, timeout=60)

    once = probe(lab, host, generate_timeout=5, fail_on_unhealthy=False)
    assert once["healthy"] is True, "a one-shot generation at deploy time passes"
    soak = probe(lab, host, generate_timeout=5, soak_requests=10, soak_max_new_tokens=4, fail_on_unhealthy=False)
    assert soak["failed_tier"] == "soak", soak
    assert soak["soak"]["failed_request"] == 3, "requests 1 (generate) and 1-2 (soak) pass, the 4th hangs"
    assert soak["reason"].startswith("soak request 3 of 10 timed out")

    send_requests_that_hang(lab, host, 2)
    started = time.monotonic()
    report = fleet_probe(lab, host, window=3)
    assert re.search(rf"^.*{host}: HUNG \(progress: hung: [1-9]\d* running", report, re.MULTILINE), report
    assert time.monotonic() - started <= 3 + 10, "named within one window (plus Ansible's start)"


def test_progress_stall_is_named_while_health_answers(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    if not sim_supports(lab, host, "progress-stall"):
        pytest.skip(f"needs {LAB_FEATURE_STALL}")
    start_server(lab, host, faults="progress-stall", extra="--enable-metrics")
    wait_healthy(lab, host, timeout=60)
    send_requests_that_hang(lab, host, 2)
    result = probe(lab, host, progress_window=3, tiers=["progress", "health"], fail_on_unhealthy=False)
    assert result["failed_tier"] == "progress" and result["state"] == "hung", result
    assert tier(result, "health")["status"] == "skipped"
    assert probe(lab, host, tiers=["health"])["healthy"] is True, "/health alone says the engine is fine"


def test_a_stopped_host_whose_gpu_memory_stays_needs_a_gpu_reset(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    start_server(lab, host)
    wait_healthy(lab, host, timeout=60)
    sh(lab, host, f"systemctl stop {UNIT}")
    gone = int(sh(lab, host, "sh -c 'echo $$'"))
    sh(lab, host, f"echo 30000 > /var/lib/simgpu/claims/gpu0.pid{gone}")
    listed = sh(lab, host, "nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits").split()
    if str(gone) not in listed:
        pytest.skip(f"needs {LAB_FEATURE_VANISHED}")
    result = probe(lab, host, fail_on_unhealthy=False, textfile_path=TEXTFILE)
    assert result["state"] == "needs_gpu_reset", result
    assert result["reset_gpus"] == [0]
    assert result["reset_message"].startswith(f"GPU 0 needs a reset or a reboot: pid {gone} no longer exists")
    families = {family.name: family for family in text_string_to_metric_families(sh(lab, host, f"cat {TEXTFILE}"))}
    states = {sample.labels["state"]: sample.value for sample in families["llmops_sglang_probe_state"].samples}
    assert states["needs_gpu_reset"] == 1.0
    report = fleet_probe(lab, host, window=3)
    assert f"{host}: NEEDS GPU RESET (GPU 0 needs a reset or a reboot: pid {gone} no longer exists" in report
