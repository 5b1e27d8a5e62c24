"""Two runs of the sglang_service role against one service at once, with different arguments, on real systemd: the
second waits for the host lock; each reports what it did, and the host ends with the last holder's settings. A run
whose restart outlasts any estimate keeps its lock (its run renews it), and a run killed with SIGKILL lets another
take the lock within the renewal period plus margin.

The lock's own test (tests/unit/plugins/module_utils/test_host_lock.py) races two runs ten times in each order; this
one does it once in each order with ansible-playbook and the role, on one host. A run that gives up waiting is
test_sglang_service.py's test_second_run_fails_naming_the_holder_of_the_host_lock."""

from __future__ import annotations

import concurrent.futures
import json
import re
import signal
import subprocess
import threading
import time

import pytest
from labutil import LAB_LAYER, PLAYBOOKS, SERVICE_LAB_VARS, argv_of, lock_held, run_play, sh, wait_until

pytestmark = pytest.mark.lab

NAME = SERVICE_LAB_VARS["sglang_service_name"]
UNIT = f"{NAME}.service"
LOCK = f"/run/lock/llmops-{NAME}.lock"
MODEL_INFO = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:30000/model_info').read().decode())"
# The lock task's result at -v: how long the run waited for the lock.
WAITED = re.compile(r"acquired /run/lock/\S+ after ([0-9.]+) s")


def together(lab, tmp_path, host: str, runs: list, gap: float = 1.0) -> dict:
    """Start the role runs ``(label, extra vars)`` ``gap`` s apart, in this order; their Runs by label."""
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        futures = {}
        for label, extra in runs:
            futures[label] = pool.submit(run_play, lab, tmp_path, host, "service_role", extra, label, verbosity=1)
            time.sleep(gap)
        return {label: future.result() for label, future in futures.items()}


def served_name(lab, host: str) -> str:
    return json.loads(sh(lab, host, f'python3 -c "{MODEL_INFO}"'))["served_model_name"]


def launched_served_name(lab, host: str) -> str:
    """The --served-model-name the unit's engine was started with."""
    argv = argv_of(lab, host, int(sh(lab, host, f"systemctl show -P MainPID {UNIT}")))
    return argv[argv.index("--served-model-name") + 1]


def test_two_runs_at_once_each_report_what_they_did_in_either_order(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    for order in (("a", "b"), ("b", "a")):
        # Names new to the host in each order, so that both runs change it and restart through the chain.
        labels = [f"{name}-{order[0]}-first" for name in order]
        runs = [(label, {"sglang_service_served_model_name": f"run-{label}"}) for label in labels]

        done = together(clean_lab, tmp_path, host, runs)

        for label, run in done.items():
            assert run.ok, f"order {order}: run {label} failed:\n{run.output[-6000:]}"
            assert run.gate()["healthy"] is True, run.gate()
        waited = {label: float(WAITED.search(run.output).group(1)) for label, run in done.items()}
        last = max(waited, key=waited.get)
        assert waited[last] > 1, f"order {order}: the runs did not contend for the lock: {waited}"
        assert launched_served_name(clean_lab, host) == served_name(clean_lab, host) == f"run-{last}"
        assert sh(clean_lab, host, f"systemctl is-active {UNIT}").strip() == "active"
        assert lock_held(clean_lab, host, LOCK) is False


# A load far longer than the lab's old fixed lease (60 s, tests/lab/inventory): only a lock renewed by its run holds
# through it. The runs read the lab's inventory layer, as a fleet run does.
SLOW_LOAD_S = 75
SLOW = {
    "sglang_service_extra_args": ["--sim-load-time", str(SLOW_LOAD_S)],
    # The gate waits for the slow load (the default of 15 s is for the 1 s load of SERVICE_LAB_VARS).
    "sglang_service_probe_wait_timeout": SLOW_LOAD_S + 240,
}


def lock_token(lab, host: str) -> str:
    text = lab.exec(host, f"cat {LOCK} 2>/dev/null").stdout.strip()
    return json.loads(text).get("token", "") if text.startswith("{") else ""


def active_state(lab, host: str) -> str:
    return lab.exec(host, f"systemctl show -P ActiveState {UNIT}").stdout.strip()


def test_a_restart_slower_than_any_lease_keeps_its_lock_and_a_second_run_waits_for_it(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    samples, done = [], threading.Event()

    def sample():
        while not done.is_set():
            samples.append((lock_token(clean_lab, host), active_state(clean_lab, host)))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(
            run_play,
            clean_lab,
            tmp_path,
            host,
            "service_role",
            {**SLOW, "sglang_service_served_model_name": "slow"},
            "slow",
            verbosity=1,
            inventories=(LAB_LAYER,),
        )
        token = wait_until(lambda: lock_token(clean_lab, host), 600, "the first run's lock")
        sampler.start()
        wait_until(lambda: active_state(clean_lab, host) == "activating", 600, "the slow load")
        second = pool.submit(
            run_play,
            clean_lab,
            tmp_path,
            host,
            "service_role",
            {"sglang_service_served_model_name": "after"},
            "after",
            verbosity=1,
            inventories=(LAB_LAYER,),
        )
        slow, after = first.result(), second.result()
    done.set()
    sampler.join()

    assert slow.ok, slow.output[-6000:]
    assert slow.gate()["healthy"] is True
    # Through the whole load, until the engine was ready (its ready gate made the unit active), the first run held the
    # lock with the token it took it with.
    loading = [held for held, state in samples[: next(i for i, s in enumerate(samples) if s[1] == "active")]]
    assert loading and set(loading) == {token}, samples
    assert after.ok, after.output[-6000:]
    waited = float(WAITED.search(after.output).group(1))
    assert waited > 1, f"the second run did not wait for the first: {waited} s"
    assert served_name(clean_lab, host) == "after"
    assert lock_held(clean_lab, host, LOCK) is False


def start_play(lab, tmp_path, host: str, extra: dict, label: str) -> subprocess.Popen:
    """The service role's play, started in the background (to be killed)."""
    variables = {**SERVICE_LAB_VARS, **extra, "svc_test_host": host, "svc_test_result": str(tmp_path / f"{label}.json")}
    argv = ["ansible-playbook", "-i", str(lab.inventory), "-i", str(LAB_LAYER), str(PLAYBOOKS / "service_role.yml")]
    argv += ["-e", json.dumps(variables)]
    log = open(tmp_path / f"{label}.log", "w", encoding="utf-8")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=lab.env())


def test_a_run_killed_mid_restart_lets_another_take_the_lock_within_the_renewal_period_plus_margin(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    # The lab's renewal terms, shorter than the defaults (30 + 60 s) so that the bound is below the old fixed lease
    # (60 s) that a killed run held the lock for; the keeper lets go at once when its run is gone, whatever the terms.
    terms = {"sglang_service_lock_renew_period": 10, "sglang_service_lock_renew_margin": 20}
    bound = 10 + 20
    killed = start_play(
        clean_lab, tmp_path, host, {**SLOW, **terms, "sglang_service_served_model_name": "killed"}, "killed"
    )
    try:
        wait_until(lambda: lock_token(clean_lab, host), 600, "the killed run's lock")
        wait_until(lambda: active_state(clean_lab, host) == "activating", 600, "its restart")
        killed.send_signal(signal.SIGKILL)
        killed.wait(60)
        after = run_play(
            clean_lab,
            tmp_path,
            host,
            "service_role",
            {**terms, "sglang_service_served_model_name": "after-kill"},
            "after-kill",
            verbosity=1,
            inventories=(LAB_LAYER,),
        )
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait(60)
    assert after.ok, after.output[-6000:]
    waited = float(WAITED.search(after.output).group(1))
    assert waited <= bound, f"the next run waited {waited} s for the lock of a killed run (bound {bound} s)"
    assert served_name(clean_lab, host) == "after-kill"
    assert after.gate()["healthy"] is True
