"""playbooks/deploy.yml and playbooks/rollback.yml on a 2-host lab fleet (real systemd, sshd, sglang sources).

The playbooks run with the lab's inventory layer (tests/lab/inventory: the simulated engine, short load times)
over the inventory the lab CLI writes, as `make demo` does. The tests run in order and share the fleet's state:
a clean deploy, a bad patch set (both hosts back on pristine sources), a host lost mid-deploy, two deploys at once.
Every test leaves the fleet's hosts serving on pristine sources. rollback.yml's return to the previous known-good,
byte for byte, is test_rollback_sources.py's.

Two hosts are enough for each claim about "every host" (batches of 100% run them together) and for a host lost
while another goes on; only the bad patch set needs a third host, one batch later, that the rollout never starts.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
from labutil import (
    DEPLOY,
    FLEET_ENV_FILE,
    REPO,
    ROLLBACK,
    VENV_PYTHON,
    batch_ran,
    fleet_of,
    main_pid,
    outcomes,
    output,
    recap,
    serves,
    verify_sources,
)
from labutil import run_playbook as run

pytestmark = pytest.mark.lab

EXAMPLE_PATCH = REPO / "docs" / "patches" / "eagle_lab" / "0001-register-llmops-demo-algorithm.diff"
PRISTINE = {"python": VENV_PYTHON, "state": "restored", "target_state_id": "pristine"}
ENV_FILE = FLEET_ENV_FILE
LOCK_FILE = "/run/lock/llmops-sglang.lock"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
# The lab's engine environment (tests/lab/inventory/group_vars/lab.yml) with one more variable: a unit change.
LAB_ENVIRONMENT = {"SGLANG_SIM_LOAD_TIME": "1", "SGLANG_SIM_DRAIN_TIME": "2"}
EAGLE_LAB = {"sglang_patch_set_name": "eagle_lab", "sglang_patch_files": [str(EXAMPLE_PATCH)]}


@pytest.fixture(scope="module")
def fleet(lab):
    lab.reset_used()
    yield fleet_of(lab, 2)
    for host in lab.hosts:
        lab.module(host, "llmops.inference.source_patch", PRISTINE)
    lab.reset()


def reachable(lab, host) -> bool:
    try:
        answer = lab.module(host, "ansible.builtin.ping", {"data": "pong"}, timeout=60)
    except subprocess.TimeoutExpired:
        return False
    return answer.get("ping") == "pong"


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


def seeded(seed: str) -> dict:
    """The lab's engine environment with a seed of its own: a deploy with it changes every host's unit."""
    return {"sglang_service_environment": {**LAB_ENVIRONMENT, "SGLANG_SIM_SEED": seed}}


def new_seed() -> str:
    return str(time.time_ns() % 1_000_000_007)


def in_background(function, *args, **kwargs):
    """Start function in a thread; the returned join() gives its result."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", function(*args, **kwargs)), daemon=True)
    thread.start()

    def join(timeout=900):
        thread.join(timeout)
        assert "value" in result, "the background run did not finish"
        return result["value"]

    return join


def test_clean_deploy_then_a_rerun_changes_and_restarts_nothing(fleet, tmp_path):
    proc, records = run(fleet, DEPLOY, tmp_path, "first", {"deploy_batch": "100%"})
    assert proc.returncode == 0, output(proc)
    assert outcomes(records) == dict.fromkeys(fleet.hosts, "deployed")
    for record in records.values():
        assert record["gate"]["healthy"] and record["gate"]["restarted"], record
        assert record["before"]["unit_sha256"] is None and record["after"]["unit_sha256"], record
        assert record["after"]["known_good_saved_at"] and record["after"]["patch_state"] == "pristine", record
        assert record["after"]["sglang_version"] == "0.5.23"
    pids = {host: main_pid(fleet, host) for host in fleet.hosts}
    assert all(pids.values()), pids

    proc, records = run(fleet, DEPLOY, tmp_path, "again", {"deploy_batch": "100%"})
    assert proc.returncode == 0, output(proc)
    assert outcomes(records) == dict.fromkeys(fleet.hosts, "unchanged")
    counts = recap(proc)
    assert all(counts[host]["changed"] == 0 and counts[host]["failed"] == 0 for host in fleet.hosts), counts
    assert {host: main_pid(fleet, host) for host in fleet.hosts} == pids


def test_a_bad_patch_set_rolls_its_host_back_and_stops_the_rollout(lab, fleet, tmp_path):
    # The fleet's two hosts in the first batch, a third one (never deployed) in the batch the failure stops.
    good, bad = fleet.hosts
    assert len(lab.hosts) >= 3, "set LLMOPS_LAB_HOSTS=3"
    later = next(host for host in lab.hosts if host not in fleet.hosts)
    broken = tmp_path / "spec_info.py"
    broken.write_text("class SpeculativeAlgorithm(:\n")
    per_host = tmp_path / "inventory.yml"
    per_host.write_text(
        json.dumps(
            {
                "lab": {
                    "hosts": {
                        good: EAGLE_LAB,
                        bad: {
                            "sglang_patch_set_name": "broken",
                            "sglang_patch_replacements": [{"src": str(broken), "dest": SPEC_INFO}],
                            "sglang_patch_compile_check": "warn",
                        },
                    }
                }
            }
        )
    )
    untouched = main_pid(lab, later)
    proc, records = run(
        fleet,
        DEPLOY,
        tmp_path,
        "bad",
        {"deploy_batch": 2, "deploy_rollback_batch_on_failure": True, "deploy_hosts": f"{good},{bad},{later}"},
        inventories=(per_host,),
    )
    assert proc.returncode != 0, output(proc)
    assert outcomes(records) == {good: "reverted", bad: "rolled back", later: "not started"}, output(proc)
    assert not records[bad]["rollback"]["error"] and records[bad]["rollback"]["gate"]["healthy"]
    assert "failed its gate" in records[bad]["detail"] and "gate passed" in records[bad]["detail"]
    counts = recap(proc)
    assert counts[bad]["failed"] == 1 and counts[good]["failed"] == 0, counts
    assert counts[later]["changed"] == 0 and counts[later]["failed"] == 0, counts
    assert f"{bad}: ROLLED BACK" in proc.stdout and f"{later}: NOT STARTED" in proc.stdout
    for host in (good, bad):
        assert serves(fleet, host)["healthy"]
        assert verify_sources(fleet, host)["verify"]["pristine"]
    assert main_pid(lab, later) == untouched


def test_a_host_lost_mid_deploy_converges_on_the_next_run(fleet, tmp_path):
    # Two hosts in one batch: the rollout goes on with the other one and then stops.
    lost = fleet.hosts[1]
    # A seed of its own: the deploy changes the hosts on every attempt, also when the test runs again.
    seed = str(time.time_ns() % 1_000_000_007)
    change = {
        "sglang_service_environment": {**LAB_ENVIRONMENT, "SGLANG_SIM_SEED": seed},
        "deploy_hosts": ",".join(fleet.hosts[:2]),
        "deploy_batch": "100%",
    }
    join = in_background(run, fleet, DEPLOY, tmp_path, "lost", change)
    try:
        # Cut the host off once this run has started changing it (the environment file is written under the lock).
        wait_until(lambda: f'SGLANG_SIM_SEED="{seed}"' in fleet.exec(lost, f"cat {ENV_FILE}").stdout, 300, "the change")
        fleet.exec(lost, "ip link set host0 down", check=True)
    finally:
        proc, records = join()
        fleet.exec(lost, "ip link set host0 up", check=True)
    assert proc.returncode != 0, output(proc)
    assert records[lost]["outcome"] == "in progress", records[lost]
    assert recap(proc)[lost]["unreachable"] == 1

    wait_until(lambda: reachable(fleet, lost), 120, "SSH to come back")
    proc, records = run(fleet, DEPLOY, tmp_path, "converged", change)
    assert proc.returncode == 0, output(proc)
    assert all(record["gate"]["healthy"] for record in records.values()), records
    assert f'SGLANG_SIM_SEED="{seed}"' in fleet.exec(lost, f"cat {ENV_FILE}").stdout
    assert all(serves(fleet, host)["healthy"] for host in fleet.hosts[:2])


def test_a_second_deploy_on_a_locked_host_fails_clearly_and_changes_nothing(fleet, tmp_path):
    host = fleet.hosts[0]
    # A longer load keeps the first run's restart chain, and so the host lock, busy for a while.
    # A seed of its own, so that the first run changes the host (and takes its lock) on every attempt.
    environment = {
        **LAB_ENVIRONMENT,
        "SGLANG_SIM_LOAD_TIME": "15",
        "SGLANG_SIM_SEED": str(time.time_ns() % 1_000_000_007),
    }
    slow = {"sglang_service_environment": environment, "deploy_hosts": host}
    first = in_background(run, fleet, DEPLOY, tmp_path, "first_run", slow)
    try:
        wait_until(lambda: '"owner"' in fleet.exec(host, f"cat {LOCK_FILE}").stdout, 300, "the first run's lock")
        second, second_records = run(fleet, DEPLOY, tmp_path, "second_run", {**slow, "sglang_service_lock_timeout": 1})
    finally:
        proc, records = first()
    assert second.returncode != 0, output(second)
    detail = second_records[host]["detail"]
    assert second_records[host]["outcome"] == "failed" and "is held by" in detail, second_records[host]
    assert "nothing was rolled back" in detail

    assert proc.returncode == 0, output(proc)
    assert records[host]["outcome"] == "deployed"
    assert records[host]["after"]["main_pid"] == main_pid(fleet, host)


def three_hosts(lab):
    assert len(lab.hosts) >= 3, "set LLMOPS_LAB_HOSTS=3"
    return fleet_of(lab, 3)


def cut_off(lab, host):
    """The host unreachable over SSH: its link down, so that a connection already open (a ControlMaster) fails too."""
    lab.exec(host, "ip link set host0 down", check=True)


def reconnect(lab, host):
    lab.exec(host, "ip link set host0 up", check=True)
    wait_until(lambda: reachable(lab, host), 120, "SSH to come back")


def test_a_deploy_with_one_of_three_hosts_unreachable_is_refused_and_its_summary_says_nothing_changed(lab, tmp_path):
    three = three_hosts(lab)
    *reached, lost = three.hosts
    pids = {host: main_pid(lab, host) for host in reached}
    seed = new_seed()
    cut_off(lab, lost)
    try:
        proc, records = run(three, DEPLOY, tmp_path, "refused", {**seeded(seed), "deploy_batch": "100%"})
    finally:
        reconnect(lab, lost)
    assert proc.returncode != 0, output(proc)
    assert not batch_ran(proc), output(proc)
    note = json.loads((tmp_path / "refused.json").read_text())["note"]
    assert note == f"REFUSED at preflight, nothing changed on any host: {lost} unreachable", note
    assert note in proc.stdout
    assert outcomes(records) == {**dict.fromkeys(reached, "refused"), lost: "unreachable"}, records
    for host in reached:
        assert records[host]["detail"] == f"nothing changed: the deploy was refused at preflight ({lost} unreachable)"
        assert f"{host}: REFUSED - nothing changed" in proc.stdout
        assert f'SGLANG_SIM_SEED="{seed}"' not in lab.exec(host, f"cat {ENV_FILE}").stdout
        assert main_pid(lab, host) == pids[host]
    assert f"{lost}: UNREACHABLE - not reached at preflight" in proc.stdout


def test_a_rollback_with_one_of_three_hosts_unreachable_returns_the_other_two_and_names_it(lab, tmp_path):
    three = three_hosts(lab)
    *reached, lost = three.hosts
    # Two deploys: every host's previous known-good is the first one's unit (its seed).
    known_good, later = new_seed(), new_seed()
    for name, seed in (("known_good", known_good), ("later", later)):
        proc, records = run(three, DEPLOY, tmp_path, name, {**seeded(seed), "deploy_batch": "100%"})
        assert proc.returncode == 0, output(proc)
    cut_off(lab, lost)
    try:
        proc, records = run(three, ROLLBACK, tmp_path, "rollback", {"rollback_batch": "100%"})
    finally:
        reconnect(lab, lost)
    assert proc.returncode != 0, output(proc)
    assert outcomes(records) == {**dict.fromkeys(reached, "returned"), lost: "skipped"}, output(proc)
    assert "unreachable at preflight: not rolled back" in records[lost]["detail"]
    note = json.loads((tmp_path / "rollback.json").read_text())["note"]
    assert note.startswith(f"SKIPPED 1 host(s), left as they were: {lost} "), note
    assert f"{lost}: SKIPPED - unreachable at preflight" in proc.stdout
    for host in reached:
        assert f'SGLANG_SIM_SEED="{known_good}"' in lab.exec(host, f"cat {ENV_FILE}").stdout
        assert serves(lab, host)["healthy"]
    assert f'SGLANG_SIM_SEED="{later}"' in lab.exec(lost, f"cat {ENV_FILE}").stdout

    # rollback_require_all_reachable restores the refusal: nothing changes.
    cut_off(lab, reached[0])
    try:
        proc, records = run(
            three, ROLLBACK, tmp_path, "strict", {"rollback_batch": "100%", "rollback_require_all_reachable": True}
        )
    finally:
        reconnect(lab, reached[0])
    assert proc.returncode != 0 and not batch_ran(proc), output(proc)
    assert outcomes(records) == {reached[0]: "unreachable", reached[1]: "refused", lost: "refused"}, output(proc)
    assert f'SGLANG_SIM_SEED="{later}"' in lab.exec(lost, f"cat {ENV_FILE}").stdout


@pytest.mark.parametrize(
    ("playbook", "knobs", "message"),
    [
        (DEPLOY, {"deploy_batch": 0}, "deploy_batch must be a number of hosts per batch (1 or more)"),
        (DEPLOY, {"deploy_batch": "150%"}, "above 0% and at most 100%"),
        (DEPLOY, {"deploy_hosts": "no_such_group"}, "deploy_hosts must name a group or host pattern with hosts"),
        (ROLLBACK, {"rollback_backup_id": "20000101T000000Z-nope"}, "backup id '20000101T000000Z-nope' not found"),
        (ROLLBACK, {"rollback_snapshot": "oldest"}, "rollback_snapshot must be previous"),
    ],
)
def test_bad_input_is_refused_before_any_host_changes(fleet, tmp_path, playbook, knobs, message):
    pids = {host: main_pid(fleet, host) for host in fleet.hosts}
    proc, _records = run(fleet, playbook, tmp_path, "bad_input", knobs)
    assert proc.returncode != 0 and message in proc.stdout, output(proc)
    assert not batch_ran(proc), output(proc)
    assert {host: main_pid(fleet, host) for host in fleet.hosts} == pids
