"""What a new user meets following the docs, on a 2-host lab fleet (real systemd, sshd, sglang sources): the fleet
playbooks with the lab's inventory layer, as `make demo` runs them.

- A speculative sweep that puts the original configuration back leaves the host's known-good snapshots and deploy
  record as it found them: rollback.yml still returns to what the last deploy replaced, and a deploy of the same
  inputs finds the host up to date.
- A role variable of the wrong type or out of range fails in the deploy's preflight, naming the variable and what it
  accepts, with nothing on any host changed; a typo in a role variable's name is named with the variable meant.
- A patch set that names a missing file fails in preflight, before the first of two batches changes anything.
- Of two deploys at once, the one that waited for the host lock reports the engine that runs when it ends.
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from labutil import (
    DEPLOY,
    FLEET_ENV_FILE,
    FLEET_UNIT_FILE,
    LAB_LAYER,
    REPO,
    ROLLBACK,
    batch_ran,
    fleet_of,
    known_good,
    main_pid,
    output,
    sha256,
)
from labutil import run_playbook as run

pytestmark = pytest.mark.lab

SWEEP = REPO / "playbooks" / "spec_sweep.yml"
LOCK_FILE = "/run/lock/llmops-sglang.lock"
# How many processes wait for the host lock's flock (/proc/locks lists a waiter as "N: -> FLOCK ...").
WAITERS = (
    f'awk -v ino="$(stat -c %i {LOCK_FILE})" '
    '\'$2 == "->" && index($0, ":" ino " ") {n++} END {print n + 0}\' /proc/locks'
)
# The lab's engine environment (tests/lab/inventory/group_vars/lab.yml) and a seed: a seed of its own makes a deploy
# that changes the host's environment file, and so its unit's inputs.
LAB_ENVIRONMENT = {"SGLANG_SIM_LOAD_TIME": "1", "SGLANG_SIM_DRAIN_TIME": "2"}
# A speculative algorithm on the base unit, so that a sweep has something to sweep.
SPECULATIVE = {
    "sglang_service_speculative_algorithm": "EAGLE",
    "sglang_service_speculative_num_steps": 3,
    "sglang_service_speculative_eagle_topk": 1,
}


def seeded(seed: str) -> dict:
    return {"sglang_service_environment": {**LAB_ENVIRONMENT, "SGLANG_SIM_SEED": seed}, **SPECULATIVE}


def fresh_seed() -> str:
    return str(time.time_ns() % 1_000_000_007)


@pytest.fixture(scope="module")
def fleet(lab):
    lab.reset_used()
    yield fleet_of(lab, 2)
    lab.reset()


@pytest.fixture(scope="module")
def deployed(fleet, tmp_path_factory):
    """Both hosts deployed and serving; their engine's pid and unit files for the tests that must not change them."""
    proc, _records = run(fleet, DEPLOY, tmp_path_factory.mktemp("deployed"), "deployed", {"deploy_batch": "100%"})
    assert proc.returncode == 0, output(proc)
    return fleet


def host_state(lab, host) -> dict:
    return {
        "pid": main_pid(lab, host),
        "unit": sha256(lab, host, FLEET_UNIT_FILE),
        "env": sha256(lab, host, FLEET_ENV_FILE),
    }


def one_point(host: str, role_vars: dict, results_dir, **extra) -> dict:
    """A sweep of one point (steps 2) at one load level on ``host``, as short as a sweep gets."""
    return {
        **role_vars,
        "sweep_hosts": host,
        "sweep_steps": [2],
        "sweep_concurrency": [1],
        "sweep_repeats": 1,
        "sweep_warmup_requests": 0,
        "sweep_bench": {"num_prompts": 2, "max_new_tokens": 16, "request_timeout": 30},
        "sweep_results_dir": str(results_dir),
        "sweep_retry_failed_load": True,
        **extra,
    }


def env_seed(lab, host) -> str:
    text = lab.exec(host, f"cat {FLEET_ENV_FILE}").stdout
    for line in text.splitlines():
        if line.startswith("SGLANG_SIM_SEED="):
            return line.split("=", 1)[1].strip('"')
    return ""


def test_a_sweep_that_restores_the_original_leaves_rollback_and_up_to_date_as_they_were(deployed, tmp_path):
    host = deployed.hosts[0]
    one = fleet_of(deployed, 1)
    first, second = fresh_seed(), fresh_seed() + "1"

    proc, records = run(one, DEPLOY, tmp_path, "deploy_a", seeded(first))
    assert proc.returncode == 0 and records[host]["outcome"] == "deployed", output(proc)
    proc, records = run(one, DEPLOY, tmp_path, "deploy_b", seeded(second))
    assert proc.returncode == 0 and records[host]["outcome"] == "deployed", output(proc)

    snapshots = known_good(deployed, host)
    proc = deployed.playbook(
        SWEEP, one_point(host, seeded(second), tmp_path / "sweep"), inventories=(LAB_LAYER,), timeout=900
    )
    assert proc.returncode == 0, output(proc)
    assert env_seed(deployed, host) == second
    # The snapshots as the sweep found them: none saved, none evicted.
    assert known_good(deployed, host) == snapshots

    # The same inputs as the last deploy: the host is up to date, the sweep notwithstanding.
    proc, records = run(one, DEPLOY, tmp_path, "deploy_b_again", seeded(second))
    assert proc.returncode == 0, output(proc)
    assert records[host]["outcome"] == "unchanged", records[host]
    assert "up to date" in records[host]["detail"] and "not touched" in records[host]["detail"], records[host]

    # previous is still what the last deploy replaced: deploy A's unit files.
    proc, records = run(one, ROLLBACK, tmp_path, "rollback", seeded(second))
    assert proc.returncode == 0, output(proc)
    assert records[host]["outcome"] == "returned", records[host]
    assert env_seed(deployed, host) == first
    assert deployed.exec(host, "systemctl is-active sglang.service").stdout.strip() == "active"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"sglang_service_gpus": "0,1"},
            "sglang_service_gpus must be a list (one element per item, such as [0, 1]; not a comma-separated string); "
            'got "0,1" (a string)',
        ),
        ({"sglang_service_gpus": 1}, "sglang_service_gpus must be a list (one element per item"),
        ({"sglang_service_port": 70000}, "sglang_service_port must be an integer from 1 to 65535; got 70000"),
    ],
    ids=["gpus-string", "gpus-int", "port-range"],
)
def test_a_role_variable_of_the_wrong_type_or_range_fails_in_preflight_naming_it(
    deployed, tmp_path, variables, message
):
    before = {host: host_state(deployed, host) for host in deployed.hosts}
    proc, _records = run(deployed, DEPLOY, tmp_path, "bad_variable", {"deploy_batch": "100%", **variables})
    assert proc.returncode != 0 and message in proc.stdout, output(proc)
    assert not batch_ran(proc), "the deploy got past its preflight"
    assert "assertion" not in proc.stdout, output(proc)
    assert {host: host_state(deployed, host) for host in deployed.hosts} == before


def test_a_typo_in_a_role_variable_is_named_with_the_variable_meant(deployed, tmp_path):
    typo = {"deploy_batch": "100%", "sglang_service_drain_timout": 300}
    proc, _records = run(deployed, DEPLOY, tmp_path, "typo", typo)
    assert proc.returncode == 0, output(proc)
    assert "sglang_service_drain_timout (did you mean sglang_service_drain_timeout?)" in proc.stdout, output(proc)

    before = {host: host_state(deployed, host) for host in deployed.hosts}
    strict = {"deploy_batch": "100%", "sglang_service_drain_timout": 300, "sglang_service_strict_vars": True}
    proc, _records = run(deployed, DEPLOY, tmp_path, "typo_strict", strict)
    assert proc.returncode != 0, output(proc)
    assert "sglang_service_drain_timout (did you mean sglang_service_drain_timeout?)" in proc.stdout, output(proc)
    assert not batch_ran(proc), "the deploy got past its preflight"
    assert {host: host_state(deployed, host) for host in deployed.hosts} == before


def test_a_missing_patch_file_fails_before_the_first_of_two_batches(deployed, tmp_path):
    # Only the host of the second batch has a patch set, and its file is missing: the first batch's host, whose
    # deploy would change its environment file, must not change either.
    later = deployed.hosts[1]
    missing = str(tmp_path / "no-such.diff")
    layer = tmp_path / "inventory"
    (layer / "host_vars").mkdir(parents=True)
    (layer / "hosts.yml").write_text("all: {}\n")
    (layer / "host_vars" / f"{later}.yml").write_text(
        f"sglang_patch_set_name: missing\nsglang_patch_files: ['{missing}']\n"
    )
    before = {host: host_state(deployed, host) for host in deployed.hosts}
    knobs = {"deploy_batch": 1, **seeded(fresh_seed())}
    proc, _records = run(deployed, DEPLOY, tmp_path, "missing_patch", knobs, inventories=(layer,))
    assert proc.returncode != 0, output(proc)
    assert f"not found on the controller: {missing}" in proc.stdout, output(proc)
    assert not batch_ran(proc), "the deploy got past its preflight"
    assert {host: host_state(deployed, host) for host in deployed.hosts} == before


def test_the_deploy_that_waited_for_the_lock_reports_the_engine_that_runs(deployed, tmp_path):
    host = deployed.hosts[0]
    one = fleet_of(deployed, 1)
    # Both runs pass their preflight while the lock is held by hand, so both see the engine before either restarts it;
    # one then restarts it, and the other, which waited, finds nothing to change.
    # Taken by an ad-hoc call, whose run ends at once: a lock that nobody renews, held for its margin.
    take = {"path": LOCK_FILE, "owner": {"play": "test"}, "keep": False, "renew_margin": 600}
    held = deployed.module(host, "llmops.inference.host_lock", take)
    assert held.get("token"), held
    change = {**seeded(fresh_seed()), "sglang_service_lock_timeout": 600}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(run, one, DEPLOY, tmp_path, f"together_{index}", change) for index in range(2)]
        try:
            deadline = time.monotonic() + 600
            while int(deployed.exec(host, WAITERS).stdout.strip() or 0) < 2:
                assert time.monotonic() < deadline, "the two deploys did not both wait for the host lock"
                assert not any(future.done() for future in runs), [output(future.result()[0]) for future in runs]
                time.sleep(0.5)
        finally:
            release = {"path": LOCK_FILE, "state": "absent", "token": held["token"]}
            deployed.module(host, "llmops.inference.host_lock", release)
        done = [future.result() for future in runs]
    for proc, _records in done:
        assert proc.returncode == 0, output(proc)
    outcomes = sorted(records[host]["outcome"] for _proc, records in done)
    assert outcomes == ["deployed", "unchanged"], outcomes
    running = main_pid(deployed, host)
    for _proc, records in done:
        assert records[host]["after"]["main_pid"] == running, records[host]


def test_a_sweep_that_applies_its_choice_records_a_snapshot_with_the_patch_state(deployed, tmp_path):
    # Last in this file: the host ends on the sweep's point.
    host = deployed.hosts[0]
    role_vars = seeded(fresh_seed())
    proc, records = run(fleet_of(deployed, 1), DEPLOY, tmp_path, "deploy", role_vars)
    assert proc.returncode == 0 and records[host]["outcome"] == "deployed", output(proc)
    before = known_good(deployed, host)

    sweep = one_point(host, role_vars, tmp_path / "sweep", sweep_apply="best")
    proc = deployed.playbook(SWEEP, sweep, inventories=(LAB_LAYER,), timeout=900)
    assert proc.returncode == 0, output(proc)
    after = known_good(deployed, host)
    assert after["current"]["saved_at"] != before["current"]["saved_at"], after
    assert after["current"]["patch_state_id"] == "pristine", after["current"]
    assert after["previous"]["saved_at"] == before["current"]["saved_at"], after
