"""The engine's API key never reaches the journal nor Ansible's output, on one lab host.

SGLang 0.5.23 logs `server_args={...}` with `api_key` in clear at every start (the lab's engine does too, see
tests/lab/README.md). The run, in order: deploy.yml, a plain `systemctl restart`, fleet_probe.yml, rollback.yml
(returning a hand-edited environment file to the known-good one: a gated restart), the smallest spec_sweep.yml
(one point at one level: a drop-in start and the original's start), and a start that fails after the engine
logged its arguments. Each playbook runs at -vvv; none may print the key, and the unit's journal must hold no
text of it while still holding every start's `server_args=` line, masked.
"""

from __future__ import annotations

import json
import re

import pytest
from labutil import DEPLOY, FLEET_ENV_FILE, LAB_LAYER, REPO, ROLLBACK, sh, unit_show, wait_healthy

pytestmark = pytest.mark.lab

KEY = "llmops-K3y-9fQ2wXr7Lm"
UNIT = "sglang.service"
FLEET_PROBE = REPO / "playbooks" / "fleet_probe.yml"
SWEEP = REPO / "playbooks" / "spec_sweep.yml"
FAULT_DROPIN = f"/run/systemd/system/{UNIT}.d/90-crash.conf"
# The smallest sweep the playbook accepts: one point, one load level, one repeat of one short request.
SWEEP_VARS = {
    "sweep_algorithm": "EAGLE",
    "sweep_steps": [1],
    "sweep_concurrency": [1],
    "sweep_repeats": 1,
    "sweep_warmup_requests": 1,
    "sweep_bench": {"num_prompts": 1, "max_new_tokens": 8, "request_timeout": 30},
}


def run(lab, playbook, tmp_path, name, inventories, extra=None):
    proc = lab.playbook(playbook, extra or {}, inventories=(LAB_LAYER, *inventories), verbosity=3, timeout=900)
    return {"rc": proc.returncode, "text": proc.stdout + proc.stderr, "name": name}


def tail(result) -> str:
    """The end of a run's output, the key masked so that a failing assertion does not print it either."""
    return result["text"][-6000:].replace(KEY, "<THE KEY>")


@pytest.fixture(scope="module")
def runs(lab, tmp_path_factory):
    lab.reset()
    host = lab.hosts[0]
    # Only this module's starts: earlier tests on the host ran engines of the same unit name without a key.
    cursor = sh(lab, host, "journalctl -n 1 --show-cursor -o cat --no-pager | sed -n 's/^-- cursor: //p'").strip()
    since = f"--after-cursor='{cursor}'" if cursor else ""
    tmp_path = tmp_path_factory.mktemp("secrecy")
    key_layer = tmp_path / "key.yml"
    # Where an operator keeps it: the inventory (a vault in production).
    key_layer.write_text(json.dumps({"lab": {"vars": {"sglang_service_api_key": KEY}}}))
    layers = (key_layer,)
    results = {}
    try:
        results["deploy"] = run(lab, DEPLOY, tmp_path, "deploy", layers, {"deploy_hosts": host})
        assert results["deploy"]["rc"] == 0, tail(results["deploy"])

        sh(lab, host, f"systemctl restart {UNIT}")
        wait_healthy(lab, host)

        results["fleet_probe"] = run(lab, FLEET_PROBE, tmp_path, "fleet_probe", layers, {"fleet_probe_hosts": host})
        assert results["fleet_probe"]["rc"] == 0, tail(results["fleet_probe"])

        # Drift from the known-good unit files: rollback to the current snapshot restarts the host through the chain.
        sh(lab, host, f"echo SGLANG_SIM_DRIFT=1 >> {FLEET_ENV_FILE}")
        results["rollback"] = run(
            lab, ROLLBACK, tmp_path, "rollback", layers, {"rollback_hosts": host, "rollback_snapshot": "current"}
        )
        assert results["rollback"]["rc"] == 0, tail(results["rollback"])

        sweep_extra = dict(SWEEP_VARS, sweep_hosts=host, sweep_results_dir=str(tmp_path / "sweep"))
        results["spec_sweep"] = run(lab, SWEEP, tmp_path, "spec_sweep", layers, sweep_extra)
        assert results["spec_sweep"]["rc"] == 0, tail(results["spec_sweep"])

        # A start that fails after the engine logged its arguments (a scheduler crashes while loading).
        sh(
            lab,
            host,
            f"mkdir -p {FAULT_DROPIN.rsplit('/', 1)[0]} && "
            f"printf '[Service]\\nEnvironment=SGLANG_SIM_FAULTS=crash-on-load\\nRestart=no\\n' > {FAULT_DROPIN} && "
            "systemctl daemon-reload",
        )
        failed = lab.exec(host, f"systemctl restart {UNIT}", timeout=300)
        results["failed_start"] = {"rc": failed.returncode, "show": unit_show(lab, host, UNIT)}
        sh(lab, host, f"rm -f {FAULT_DROPIN}; systemctl daemon-reload; systemctl reset-failed {UNIT}; true")

        results["journal"] = sh(lab, host, f"journalctl -u {UNIT} --no-pager -o cat {since}")
        yield results
    finally:
        lab.reset()


@pytest.mark.parametrize("playbook", ["deploy", "fleet_probe", "rollback", "spec_sweep"])
def test_no_playbook_prints_the_key_at_vvv(runs, playbook):
    result = runs[playbook]
    assert result["rc"] == 0, tail(result)
    found = [m.start() for m in re.finditer(re.escape(KEY), result["text"])]
    context = [result["text"][max(0, i - 300) : i].replace(KEY, "<THE KEY>") for i in found[:3]]
    assert not found, f"{playbook} printed the key {len(found)} time(s); before the first:\n" + "\n---\n".join(context)


def test_the_failing_start_failed(runs):
    assert runs["failed_start"]["rc"] != 0, runs["failed_start"]
    assert runs["failed_start"]["show"]["ActiveState"] == "failed", runs["failed_start"]


def test_the_journal_holds_every_start_but_no_text_of_the_key(runs):
    journal = runs["journal"]
    lines = [line for line in journal.splitlines() if "server_args=" in line]
    # deploy, restart, rollback, the sweep's point and original, the failing start: six starts at least.
    assert len(lines) >= 6, journal[-4000:].replace(KEY, "<THE KEY>")
    assert all("'api_key': '********'" in line for line in lines), lines[0][:400].replace(KEY, "<THE KEY>")
    found = [line.replace(KEY, "<THE KEY>")[:300] for line in journal.splitlines() if KEY in line]
    assert not found, found
