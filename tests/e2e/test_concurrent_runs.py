"""Two runs of the sglang_service role against one service at once, with different arguments, on real systemd: the
second waits for the host lock; each reports what it did, and the host ends with the last holder's settings.

The lock's own test (tests/unit/plugins/module_utils/test_host_lock.py) races two runs ten times in each order; this
one does it once in each order with ansible-playbook and the role, on one host. A run that gives up waiting is
test_sglang_service.py's test_second_run_fails_naming_the_holder_of_the_host_lock."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import pytest
from labutil import SERVICE_LAB_VARS, argv_of, lock_held, run_play, sh

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
