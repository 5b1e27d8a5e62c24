"""Small helpers for tests that drive lab hosts: shell commands, units, waiting for the engine."""

from __future__ import annotations

import json
import re
from pathlib import Path

# The sglang_service role on a lab host: what differs from a real host is which module the unit launches, and
# quicker timings.
SERVICE_LAB_VARS = {
    "sglang_service_name": "sglang-svc",
    "sglang_service_python": "/opt/sglang/venv/bin/python",
    "sglang_service_launch_module": "sglang_sim.launch_server",
    "sglang_service_model_path": "Qwen/Qwen3-8B",
    "sglang_service_tp_size": 2,
    "sglang_service_extra_args": ["--sim-load-time", "1"],
    "sglang_service_restart_sec": 1,
    "sglang_service_drain_timeout": 5,
    "sglang_service_scheduler_exit_sec": 2,
    "sglang_service_stop_margin_sec": 3,
    "sglang_service_gpu_free_wait_sec": 1,
    "sglang_service_probe_wait_timeout": 15,
}

HEALTH_WAIT = """
import sys, time, urllib.request
deadline = time.monotonic() + {timeout}
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen("http://127.0.0.1:{port}/health", timeout=1) as answer:
            if answer.status == 200:
                print(repr(time.time()))
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.01)
sys.exit(1)
"""


def sh(lab, host: str, command: str, timeout: float = 180) -> str:
    """Run a shell command inside a lab host; fail the test with its output if it fails."""
    proc = lab.exec(host, command, timeout=timeout)
    assert proc.returncode == 0, f"{command!r} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def install_unit(lab, host: str, name: str, text: str) -> None:
    sh(lab, host, f"cat > /etc/systemd/system/{name} <<'EOF'\n{text}EOF\nsystemctl daemon-reload")


def wait_healthy(lab, host: str, port: int = 30000, timeout: float = 120) -> float:
    """Wait until /health answers 200 on the host; return the host's wall-clock time when it did."""
    script = HEALTH_WAIT.format(port=port, timeout=timeout)
    return float(sh(lab, host, f"python3 - <<'EOF'\n{script}\nEOF", timeout=timeout + 30))


def start_ready_watch(lab, host: str, out_path: str, port: int = 30000, timeout: float = 120) -> None:
    """In the background on the host, write the wall-clock time at which /health first answers 200."""
    script = HEALTH_WAIT.format(port=port, timeout=timeout)
    sh(
        lab,
        host,
        f"cat > /run/ready_watch.py <<'EOF'\n{script}\nEOF\nrm -f {out_path}\n"
        # The whole background list gets its own stdio, or lab.exec would wait for it to finish.
        f"(python3 /run/ready_watch.py > {out_path}.tmp && mv {out_path}.tmp {out_path}) </dev/null >/dev/null 2>&1 &",
    )


def read_ready_time(lab, host: str, out_path: str) -> float:
    return float(sh(lab, host, f"until [ -s {out_path} ]; do sleep 0.05; done; cat {out_path}", timeout=150))


# ----- the fleet playbooks (deploy.yml, rollback.yml) on a lab fleet -----

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "playbooks" / "deploy.yml"
ROLLBACK = REPO / "playbooks" / "rollback.yml"
# The lab's inventory layer: the simulated engine, short load times (as `make demo` runs the playbooks).
LAB_LAYER = REPO / "tests" / "lab" / "inventory"
VENV_PYTHON = "/opt/sglang/venv/bin/python"
FLEET_UNIT = "sglang.service"
FLEET_UNIT_FILE = f"/etc/systemd/system/{FLEET_UNIT}"
FLEET_ENV_FILE = "/etc/llmops/sglang.env"
FLEET_KNOWN_GOOD = "/var/lib/llmops/known-good/sglang"
FORCE_REINSTALL = (
    f"{VENV_PYTHON} -m pip install -q --no-deps --no-index --force-reinstall /var/cache/llmops-lab/wheels/sglang-*.whl"
)


def run_playbook(lab, playbook, tmp_path, name, extra=None, inventories=()):
    """Run a fleet playbook with the lab layer; return (process, {host: record}) from its JSON summary."""
    summary = tmp_path / f"{name}.json"
    knob = "rollback_summary_path" if playbook == ROLLBACK else "deploy_summary_path"
    proc = lab.playbook(playbook, {knob: str(summary), **(extra or {})}, inventories=(LAB_LAYER, *inventories))
    records = {}
    if summary.exists():
        records = {row["host"]: row for row in json.loads(summary.read_text())["hosts"]}
    return proc, records


def output(proc) -> str:
    return f"rc={proc.returncode}\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"


def recap(proc) -> dict:
    return {
        host: {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", counts)}
        for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", proc.stdout, re.MULTILINE)
    }


def outcomes(records) -> dict:
    return {host: record["outcome"] for host, record in records.items()}


def main_pid(lab, host, unit=FLEET_UNIT) -> int:
    return int(lab.exec(host, f"systemctl show -p MainPID --value {unit}").stdout.strip() or 0)


def sha256(lab, host, path) -> str:
    return lab.exec(host, f"sha256sum {path} | cut -d' ' -f1").stdout.strip()


def serves(lab, host) -> dict:
    return lab.module(
        host,
        "llmops.inference.sglang_probe",
        {"unit": FLEET_UNIT, "url": "http://127.0.0.1:30000", "tp_size": 2, "fail_on_unhealthy": False},
    )


def verify_sources(lab, host) -> dict:
    result = lab.module(host, "llmops.inference.source_patch", {"python": VENV_PYTHON, "state": "verified"})
    assert result["_status"] == "SUCCESS", result
    return result


def known_good(lab, host) -> dict:
    """Both known-good manifests of the fleet's unit on ``host``."""
    result = lab.module(host, "llmops.inference.known_good", {"root": FLEET_KNOWN_GOOD})
    assert result["_status"] == "SUCCESS", result
    return {"current": result["current"], "previous": result["previous"]}
