"""sglang_probe on real systemd against the simulated engine: failure 2 ("active" is not "serving").

Each fault is caught by the tier an operator would look at, with a reason that says what is wrong. Servers
start with a 1 s load, and cases that need separate servers run on separate hosts at the same time.
"""

from __future__ import annotations

import re
import time

import pytest
from labutil import install_unit, read_ready_time, sh, start_ready_watch, wait_healthy
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.lab

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
--host 127.0.0.1 --port 30000 --sim-load-time {load_time}
KillMode=control-group
{restart}
"""


def start_server(lab, host, faults: str = "", restart: str = "", load_time: float = 1) -> None:
    text = UNIT_TEMPLATE.format(faults=faults, model=MODEL, restart=restart, load_time=load_time)
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
    assert [entry["status"] for entry in gate["tiers"]] == ["ok"] * 5 + ["skipped"]
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
