"""A gateway replica lost in the middle of a rolling deploy: no worker stranded, no host left half-way.

Two lab hosts each run the fleet's engine (deploy.yml) and a gateway replica (the sglang_gateway role, real smg);
both engines are listed on both replicas. Steady traffic goes through replica 1 only. A deploy (one host per batch,
sglang_service_gateway_unreachable at its default, fail) restarts the first host; once that host is out of the
gateways and its engine stopped, replica 2 is killed (SIGKILL, then stopped so systemd does not bring it back).
The first host's gate passes, the re-add reaches replica 1 and not replica 2, the host fails and its automatic
rollback returns it to known-good through replica 1 alone. The test checks what an operator would: no request
through replica 1 failed, every worker is listed and healthy on replica 1, every engine runs what its files say,
the rollout stopped, and the deploy's output names the replica it could not reach.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from gateway_lab import GATEWAY_UNIT, apply_gateway_role, connect_hosts, gateway_url
from labutil import FLEET_ENV_FILE, environ_of, main_pid, outcomes, output, sh
from test_zero_downtime import KEY, LAB_ENVIRONMENT, Load, deploy, everyone_in, listed, report

pytestmark = pytest.mark.lab

ENGINE_PORT = 30000


@pytest.fixture(scope="module")
def topology(lab, tmp_path_factory):
    assert len(lab.hosts) >= 2, "set LLMOPS_LAB_HOSTS=2"
    hosts = lab.hosts[:2]
    lab.reset()
    addresses = connect_hosts(lab)
    role = apply_gateway_role(lab, ":".join(hosts), {"sglang_gateway_api_key": KEY})
    assert role.returncode == 0, role.stdout[-4000:] + role.stderr[-2000:]
    found = {
        "hosts": hosts,
        "gateway_hosts": hosts,
        "gateways": [gateway_url(addresses[host]) for host in hosts],
        "workers": {host: f"http://{addresses[host]}:{ENGINE_PORT}" for host in hosts},
    }
    proc, records = deploy(lab, tmp_path_factory.mktemp("replica-loss"), found, "install", {"deploy_batch": "100%"})
    assert proc.returncode == 0, output(proc)
    assert set(outcomes(records).values()) == {"deployed"}, outcomes(records)
    assert listed(lab, found) == everyone_in(found)
    yield found
    lab.reset()


def serving_on(gateway: str, worker: str) -> bool:
    """Whether the gateway lists the worker as ready and healthy (read from this machine, as the clients do)."""
    request = urllib.request.Request(gateway + "/workers", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        workers = json.loads(answer.read())["workers"]
    return any(entry["url"] == worker and entry.get("is_healthy") is True for entry in workers)


class ReplicaKiller:
    """Kills replica 2 once the first host is out of it and its engine was stopped (its MainPID changed): the
    restart chain has taken the worker out of every replica and has not added it back yet."""

    def __init__(self, lab, topology, host: str):
        self.lab = lab
        self.replica_host = topology["gateway_hosts"][1]
        self.replica = topology["gateways"][1]
        self.host = host
        self.worker = topology["workers"][host]
        self.pid = main_pid(lab, host)
        self.killed_at = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.is_set():
            try:
                out_of_replica = not serving_on(self.replica, self.worker)
            except OSError:
                out_of_replica = False
            if out_of_replica and main_pid(self.lab, self.host) != self.pid:
                sh(
                    self.lab,
                    self.replica_host,
                    f"systemctl kill --signal=SIGKILL {GATEWAY_UNIT}; systemctl stop {GATEWAY_UNIT}",
                )
                self.killed_at = time.monotonic()
                return
            self.stop.wait(0.2)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def engine_differs_from_files(lab, host: str, names) -> dict:
    """{variable: (in the environment file, in the running engine)} for each that differs, of the file's variables
    and ``names`` (None: not set)."""
    text = sh(lab, host, f"cat {FLEET_ENV_FILE}")
    wanted = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            wanted[key.strip()] = value.strip().strip('"')
    running = environ_of(lab, host, main_pid(lab, host))
    return {
        key: (wanted.get(key), running.get(key))
        for key in sorted({*wanted, *names})
        if running.get(key) != wanted.get(key)
    }


def test_a_replica_lost_mid_deploy_strands_no_worker_and_leaves_no_host_half_way(lab, topology, tmp_path, capsys):
    first, second = topology["hosts"]
    lost_replica = topology["gateways"][1]
    pid_second = main_pid(lab, second)
    load = Load(topology["gateways"][0])
    killer = ReplicaKiller(lab, topology, first)
    started = time.monotonic()
    environment = {**LAB_ENVIRONMENT, "LLMOPS_REPLICA_LOSS_RELEASE": "2"}
    try:
        proc, records = deploy(lab, tmp_path, topology, "replica-lost", {"sglang_service_environment": environment})
    finally:
        killer.finish()
    summary = load.finish()
    report(capsys, "deploy that loses gateway replica 2", summary, time.monotonic() - started)

    assert killer.killed_at is not None, "replica 2 was never killed: " + output(proc)
    # The rollout stops at the first host: its re-add could not reach replica 2 (gateway_unreachable: fail).
    assert proc.returncode != 0, output(proc)
    assert outcomes(records)[first] == "rolled back", records
    assert outcomes(records)[second] != "deployed", records
    assert main_pid(lab, second) == pid_second
    detail = records[first]["detail"]
    assert "restart chain failed at gateway_add" in detail, detail
    assert f"gateway {lost_replica}: cannot reach it" in detail, detail
    assert f"gateway {lost_replica}: cannot reach it" in proc.stdout, output(proc)
    # Its rollback went on past the lost replica, passed its gate, and says which replica it left aside.
    assert "gate passed after a clean restart" in detail, detail
    assert f"gateway replica(s) left aside, cannot be reached: {lost_replica}" in detail, detail
    # No request through replica 1 failed.
    assert (summary["failed"], summary["truncated"]) == (0, 0), summary
    assert summary["ok"] > 0, summary
    # Every worker is listed and healthy on replica 1; no engine runs settings other than its files'.
    replica_one = {"gateway_hosts": [topology["gateway_hosts"][0]]}
    assert listed(lab, topology | replica_one) == everyone_in(topology | replica_one)
    for host in topology["hosts"]:
        assert engine_differs_from_files(lab, host, environment) == {}, host
