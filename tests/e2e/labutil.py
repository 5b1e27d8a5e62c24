"""Small helpers for tests that drive lab hosts: shell commands, units, waiting for the engine."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import yaml

# The probe gate's stability window in the lab's tests: a lab engine that is going to fail does so within a second
# of its first /health 200, so 2 s refuses it as the role's 5 s default does on a real host. A test of that default
# window passes role_default("sglang_service_probe_stability_window").
# The reference gate is off in every test but its own (test_reference_gate.py, and the runbooks' fleet, which the
# reference gate's runbook reads): the tests change engine arguments on purpose (a speculative algorithm on, then off),
# and the gate would rightly hold each slower change to the known-good's speed.
LAB_GATE = {"sglang_service_probe_stability_window": 2, "sglang_service_reference": {"mode": "off"}}

# The sglang_service role on a lab host: what differs from a real host is which module the unit launches, and
# quicker timings. Budgets that a slow machine could outlast keep room for one at least twice as slow: the stop's
# margin (10 s: a stop whose processes exit in time ends at once, so the margin costs nothing then) and the gate's wait
# for readiness (120 s for a 1 s load: the gate passes as soon as the engine is ready). The host lock has no budget:
# its run renews it.
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
    "sglang_service_stop_margin_sec": 10,
    "sglang_service_gpu_free_wait_sec": 1,
    "sglang_service_probe_wait_timeout": 120,
    **LAB_GATE,
}

# What a unit that runs the lab's engine needs in its environment: SGLang's JIT kernel build runs a bare `ninja`,
# which the venv's bin/ holds (systemd's default PATH for services lacks it); root's ~/.cache/sglang is writable.
SERVICE_PATH = "PATH=/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"

# Polls GET PATH until it answers 200. Each request may take what is left of the wait: SGLang 0.5.23's /health runs
# a one-token generation and answers after a second or more.
ANSWER_WAIT = """
import sys, time, urllib.request
deadline = time.monotonic() + {timeout}
while time.monotonic() < deadline:
    left = max(deadline - time.monotonic(), 0.1)
    try:
        with urllib.request.urlopen("http://127.0.0.1:{port}{path}", timeout=left) as answer:
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


def wait_answers(lab, host: str, path: str, port: int = 30000, timeout: float = 120) -> float:
    """Wait until GET ``path`` answers 200 on the host; return the host's wall-clock time when it did."""
    script = ANSWER_WAIT.format(port=port, path=path, timeout=timeout)
    return float(sh(lab, host, f"python3 - <<'EOF'\n{script}\nEOF", timeout=timeout + 30))


def wait_healthy(lab, host: str, port: int = 30000, timeout: float = 120) -> float:
    """Wait until /health (a generation in SGLang 0.5.23) answers 200; return the host's wall-clock time then."""
    return wait_answers(lab, host, "/health", port, timeout)


def wait_ready(lab, host: str, port: int = 30000, timeout: float = 120) -> float:
    """Wait until /ready answers 200 (warm-up done, not draining); return the host's wall-clock time then."""
    return wait_answers(lab, host, "/ready", port, timeout)


def start_ready_watch(
    lab, host: str, out_path: str, port: int = 30000, timeout: float = 120, path: str = "/health"
) -> None:
    """In the background on the host, write the wall-clock time at which GET ``path`` first answers 200."""
    script = ANSWER_WAIT.format(port=port, path=path, timeout=timeout)
    sh(
        lab,
        host,
        f"cat > /run/ready_watch.py <<'EOF'\n{script}\nEOF\nrm -f {out_path}\n"
        # The whole background list gets its own stdio, or lab.exec would wait for it to finish.
        f"(python3 /run/ready_watch.py > {out_path}.tmp && mv {out_path}.tmp {out_path}) </dev/null >/dev/null 2>&1 &",
    )


def read_ready_time(lab, host: str, out_path: str) -> float:
    return float(sh(lab, host, f"until [ -s {out_path} ]; do sleep 0.05; done; cat {out_path}", timeout=150))


# -- the sglang_service role on lab hosts ------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "tests" / "e2e" / "playbooks"
ROLE_DEFAULTS = REPO / "roles" / "sglang_service" / "defaults" / "main.yml"


def role_default(name: str):
    """The sglang_service role's default for the variable ``name``."""
    return yaml.safe_load(ROLE_DEFAULTS.read_text())[name]


RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)
VENV_SITE = "/opt/sglang/venv/lib/python3.11/site-packages"


class Run:
    """One ansible-playbook run: its output, and the gate's verdict the play handed over."""

    def __init__(self, proc, result_path: Path):
        self.proc = proc
        self.output = proc.stdout + proc.stderr
        self.result_path = result_path

    @property
    def ok(self) -> bool:
        return self.proc.returncode == 0

    def changed(self, host: str) -> int:
        counts = {match[0]: int(match[2]) for match in RECAP.findall(self.proc.stdout)}
        return counts[host]

    def gate(self) -> dict:
        return json.loads(self.result_path.read_text()) if self.result_path.exists() else {}


def run_play(
    lab, tmp_path: Path, host: str, play: str, extra: dict | None = None, label: str = "run", **options
) -> Run:
    """Run ``tests/e2e/playbooks/<play>.yml`` on ``host`` with the lab's service variables and ``extra``."""
    result = tmp_path / f"{label}.gate.json"
    extra_vars = {**SERVICE_LAB_VARS, **(extra or {}), "svc_test_host": host, "svc_test_result": str(result)}
    return Run(lab.playbook(PLAYBOOKS / f"{play}.yml", extra_vars, **options), result)


def unit_show(lab, host: str, unit: str) -> dict:
    text = sh(lab, host, f"systemctl show {unit} -p ActiveState,SubState,MainPID,NRestarts,Result")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def alive(lab, host: str, pid: int) -> bool:
    return lab.exec(host, f"test -d /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status").returncode == 0


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)


def fingerprint(lab, host: str, paths: str) -> str:
    """Every file under ``paths`` with its checksum (missing paths are simply absent)."""
    return sh(lab, host, f"find {paths} -type f -exec sha256sum {{}} + 2>/dev/null | sort; true")


def proc_strings(lab, host: str, path: str) -> list:
    """The NUL-separated strings of a /proc file such as cmdline or environ, exactly as the kernel has them."""
    raw = base64.b64decode(sh(lab, host, f"base64 -w0 {path}"))
    return [part.decode() for part in raw.split(b"\0") if part]


def argv_of(lab, host: str, pid: int) -> list:
    return proc_strings(lab, host, f"/proc/{pid}/cmdline")


def environ_of(lab, host: str, pid: int) -> dict:
    return dict(item.split("=", 1) for item in proc_strings(lab, host, f"/proc/{pid}/environ") if "=" in item)


def lock_held(lab, host: str, path: str) -> bool:
    return lab.module(host, "llmops.inference.host_lock", {"path": path}, check=True)["held"]


def install_test_engine(lab, host: str) -> None:
    """The launch module llmops_test_engine (tests/e2e/files/llmops_test_engine.py) in the lab venv."""
    source = (REPO / "tests" / "e2e" / "files" / "llmops_test_engine.py").read_text()
    sh(lab, host, f"cat > {VENV_SITE}/llmops_test_engine.py <<'PYEOF'\n{source}PYEOF")


def gpu_claims(lab, host: str) -> dict:
    """{pid: [GPU index, ...]} of the live simulated GPU claims (simgpu's claims/gpu<INDEX>.pid<PID> files)."""
    claims = {}
    for name in sh(lab, host, "ls /var/lib/simgpu/claims 2>/dev/null; true").split():
        match = re.fullmatch(r"gpu(\d+)\.pid(\d+)", name)
        if match and alive(lab, host, int(match[2])):
            claims.setdefault(int(match[2]), []).append(int(match[1]))
    return claims


def unit_of(lab, host: str, pid: int) -> str:
    cgroup = sh(lab, host, f"cat /proc/{pid}/cgroup 2>/dev/null; true")
    found = re.findall(r"/([^/\n]+\.service)", cgroup)
    return found[-1] if found else ""


def restore_known_good(lab, host: str, root: str, which: str, dropin_dir: str) -> dict:
    """Put a known-good snapshot's unit files back with llmops.inference.known_good (state=restored)."""
    options = {"root": root, "state": "restored", "snapshot": which, "dropin_dir": dropin_dir}
    result = lab.module(host, "llmops.inference.known_good", options)
    assert not result.get("failed"), result
    return result


# ----- the fleet playbooks (deploy.yml, rollback.yml) on a lab fleet -----

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


def fleet_of(lab, count: int):
    """The lab's first ``count`` hosts as a fleet of their own: ``run_playbook`` deploys and rolls back only them.

    The caller resets the whole lab when it is done (``lab.reset()``). The fleet shares the lab's record of the hosts
    used, so that a ``clean_lab`` test after it, in the same module, finds them blank."""
    assert len(lab.hosts) >= count, f"this fleet needs {count} lab hosts, the lab has {len(lab.hosts)}"
    fleet = type(lab)(lab.name, lab.inventory, lab.hosts[:count])
    fleet.used = lab.used
    return fleet


def run_playbook(lab, playbook, tmp_path, name, extra=None, inventories=()):
    """Run a fleet playbook with the lab layer on ``lab.hosts`` (unless ``extra`` names the hosts); return
    (process, {host: record}) from its JSON summary."""
    summary = tmp_path / f"{name}.json"
    rollback = playbook == ROLLBACK
    knob = "rollback_summary_path" if rollback else "deploy_summary_path"
    hosts = {"rollback_hosts" if rollback else "deploy_hosts": ",".join(lab.hosts)}
    variables = {knob: str(summary), **hosts, **LAB_GATE, **(extra or {})}
    proc = lab.playbook(playbook, variables, inventories=(LAB_LAYER, *inventories))
    records = {}
    if summary.exists():
        records = {row["host"]: row for row in json.loads(summary.read_text())["hosts"]}
    return proc, records


def batch_ran(proc) -> bool:
    """Whether the play of the batches ran a task (a run refused at preflight plays it with no hosts)."""
    if "one batch at a time" not in proc.stdout:
        return False
    return "TASK [" in proc.stdout.split("one batch at a time", 1)[1].split("PLAY [", 1)[0]


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
