"""Rolling deploys through the real gateway lose no request: deploy.yml and rollback.yml behind two smg replicas.

Two lab hosts run the fleet's engine (the sglang_service role through deploy.yml, listening on their lab address)
and a gateway replica each (the sglang_gateway role, real smg 1.13.0). Two engines are enough: with one host per
batch, the other serves every request while one restarts, which is the whole claim; a third host would only add
restarts. The inventory names both
replicas in sglang_service_gateways, so every restart chain takes its engine out of both, waits until the engine
has nothing in flight, restarts it, and adds it back once its gate passed. Streaming clients send long requests
through the first replica for the length of each run; the tests count the requests that failed or were cut short,
with the gateway step (a drain budget that covers the longest request: none is lost) and with it switched off
(sglang_service_gateways: [], and a stop budget far shorter than a request: every restart cuts requests, whatever
the timing). The tests run in order and share the fleet: bad input and a replica that is down stop a restart before
anything is stopped, a deploy that would take the last healthy worker away is refused, and a host whose gate fails
stays out of the gateways until it serves again. Each deploy sets a release value of its own, so a deploy always
changes the unit, also when a test runs again.
"""

from __future__ import annotations

import itertools
import json
import threading
import time

import loadgen
import pytest
import yaml
from gateway_lab import GATEWAY_PORT, GATEWAY_UNIT, apply_gateway_role, connect_hosts, gateway_url, gateway_workers
from labutil import DEPLOY, FLEET_ENV_FILE, FLEET_UNIT, ROLLBACK, main_pid, outcomes, output, sh, sha256, wait_answers
from labutil import run_playbook as run

pytestmark = pytest.mark.lab

KEY = "lab-zdt-key-5c1e"
ENGINE_PORT = 30000
# The lab's engine environment (tests/lab/inventory/group_vars/lab.yml); a deploy adds a variable to force a restart.
LAB_ENVIRONMENT = {"SGLANG_SIM_LOAD_TIME": "1", "SGLANG_SIM_DRAIN_TIME": "2"}
# Requests that last about 12 s (240 tokens at 50 ms), so every restart finds some in flight. The fleet's drain
# budget covers them with room to spare: the gateway step waits until the engine has none left, and nothing is lost.
TOKENS = 240
ENGINE_ARGS = ["--sim-token-latency-ms", "50"]
DRAIN_TIMEOUT = 60
CLIENTS = 8
# Without the gateway step the gateway keeps routing to the engine being stopped, and a stop budget far shorter than a
# request (drain 1 s + SGLang's 5 s drain check + scheduler exit 1 s, TimeoutStopSec 8 s) cuts what is in flight.
# The control sends one round of requests that outlast the whole deploy (200 s), so each is in flight on one of the
# engines when that engine stops, whatever the moment: every restart cuts some, on every run.
CONTROL_TOKENS = 4000
SHORT_STOP = {
    "sglang_service_drain_timeout": 1,
    "sglang_service_scheduler_exit_sec": 1,
    "sglang_service_stop_margin_sec": 1,
}


class Load:
    """CLIENTS streaming clients (loadgen's own requests) through one gateway until finish() is called, or until each
    sent ``rounds`` requests."""

    def __init__(self, url: str, tokens: int = TOKENS, rounds: int | None = None):
        self.rounds = rounds
        self.settings = loadgen.LoadSettings(
            url, concurrency=CLIENTS, duration=1800, max_new_tokens=tokens, api_key=KEY, timeout=tokens * 0.05 + 120
        )
        self.records = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.numbers = itertools.count(1)
        self.threads = [threading.Thread(target=self._client, args=(index,), daemon=True) for index in range(CLIENTS)]
        self.began = time.monotonic()
        for thread in self.threads:
            thread.start()

    def _client(self, index: int) -> None:
        for _round in itertools.count() if self.rounds is None else range(self.rounds):
            if self.stop.is_set():
                return
            with self.lock:
                number = next(self.numbers)
            record = loadgen.one_request(self.settings, number, index)
            with self.lock:
                self.records.append(record)

    def finish(self) -> dict:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=self.settings.timeout + 10)
        return loadgen.summarize(self.records, self.settings, time.monotonic() - self.began)


def release() -> dict:
    """The engine environment with a release value of its own: the deploy changes the unit on every attempt."""
    return {**LAB_ENVIRONMENT, "LLMOPS_ZDT_RELEASE": str(time.time_ns())}


def lost(summary: dict) -> int:
    return summary["failed"] + summary["truncated"]


def report(capsys, name: str, summary: dict, run_s: float) -> None:
    """The counts in the test output, whatever the assertions say next."""
    with capsys.disabled():
        print(
            f"\nzero-downtime, {name}: {summary['requests']} requests through the gateway in {run_s:.0f} s: "
            f"{summary['ok']} ok, {summary['failed']} failed, {summary['truncated']} truncated; latency p50 "
            f"{summary['latency_s']['p50']} s, p99 {summary['latency_s']['p99']} s; errors {summary['errors'][:3]}"
        )


def write_inventory(tmp_path, name: str, topology: dict, per_host: dict | None = None):
    """A layer of host variables: each engine listens on its lab address, behind both gateway replicas."""
    hosts = {}
    for host in topology["hosts"]:
        hosts[host] = {
            "sglang_service_host": "0.0.0.0",
            "sglang_service_api_key": KEY,
            "sglang_service_extra_args": ENGINE_ARGS,
            "sglang_service_drain_timeout": DRAIN_TIMEOUT,
            "sglang_service_gateways": topology["gateways"],
            "sglang_service_gateway_api_key": KEY,
            **(per_host or {}).get(host, {}),
        }
    path = tmp_path / f"{name}.inventory.yml"
    path.write_text(yaml.safe_dump({"lab": {"hosts": hosts}}))
    return path


def deploy(lab, tmp_path, topology, name, extra=None, per_host=None):
    layer = write_inventory(tmp_path, name, topology, per_host)
    knobs = {"deploy_batch": 1, "deploy_hosts": ",".join(topology["hosts"]), **(extra or {})}
    return run(lab, DEPLOY, tmp_path, name, knobs, inventories=(layer,))


def rollback(lab, tmp_path, topology, name, extra=None):
    layer = write_inventory(tmp_path, name, topology)
    knobs = {"rollback_batch": 1, "rollback_hosts": ",".join(topology["hosts"]), **(extra or {})}
    return run(lab, ROLLBACK, tmp_path, name, knobs, inventories=(layer,))


def listed(lab, topology) -> dict:
    """{gateway host: sorted (url, healthy) of its workers}."""
    return {
        host: sorted((url, healthy) for url, _status, healthy in gateway_workers(lab, host, KEY))
        for host in topology["gateway_hosts"]
    }


def everyone_in(topology) -> dict:
    return {host: sorted((url, True) for url in topology["workers"].values()) for host in topology["gateway_hosts"]}


def restart_chain(lab, host, topology, **options) -> dict:
    """The restart chain as the role runs it on ``host``, called directly."""
    args = {"unit": FLEET_UNIT, "url": f"http://127.0.0.1:{ENGINE_PORT}", "api_key": KEY, "gpus": ["0", "1"],
            "ready_when_active": True, "gateways": topology["gateways"], "gateway_api_key": KEY,
            "gateway_worker_url": topology["workers"][host], "gateway_wait_timeout": 60, "drain_timeout": 30,
            **options}  # fmt: skip
    return lab.module(host, "llmops.inference.sglang_restart", args)


@pytest.fixture(scope="module")
def topology(lab, tmp_path_factory):
    assert len(lab.hosts) >= 2, "set LLMOPS_LAB_HOSTS=2"
    hosts = lab.hosts[:2]
    lab.reset()
    addresses = connect_hosts(lab)
    gateway_hosts = hosts
    role = apply_gateway_role(lab, ":".join(gateway_hosts), {"sglang_gateway_api_key": KEY})
    assert role.returncode == 0, role.stdout[-4000:] + role.stderr[-2000:]
    found = {
        "hosts": hosts,
        "gateway_hosts": gateway_hosts,
        "gateways": [gateway_url(addresses[host]) for host in gateway_hosts],
        "workers": {host: f"http://{addresses[host]}:{ENGINE_PORT}" for host in hosts},
    }
    # The fleet's first deploy: the engines start and join both replicas.
    proc, records = deploy(lab, tmp_path_factory.mktemp("zdt"), found, "install", {"deploy_batch": "100%"})
    assert proc.returncode == 0, output(proc)
    assert set(outcomes(records).values()) == {"deployed"}, outcomes(records)
    assert listed(lab, found) == everyone_in(found)
    yield found
    lab.reset()


def test_bad_gateway_input_is_a_clear_error_and_no_host_is_stopped(lab, topology):
    host = topology["hosts"][-1]
    pid = main_pid(lab, host)
    nothing_listens = f"http://{topology['workers'][host].split('//')[1].split(':')[0]}:30099"
    cases = [
        ({"gateways": [*topology["gateways"], nothing_listens]}, f"gateway {nothing_listens}: cannot reach it"),
        ({"gateway_api_key": "not-the-key"}, "GET /workers answered HTTP 401: the gateway refused api_key"),
        ({"gateways": ["10.213.0.9:30080"]}, "gateways must be an absolute http:// or https:// URL"),
    ]
    for options, message in cases:
        result = restart_chain(lab, host, topology, **options)
        assert result["_status"] == "FAILED!", result
        assert message in result["msg"], result["msg"]
        assert "not-the-key" not in json.dumps(result)
    assert main_pid(lab, host) == pid
    assert listed(lab, topology) == everyone_in(topology)


def test_a_restart_leaves_both_replicas_and_rejoins_both(lab, topology):
    host = topology["hosts"][-1]
    pid = main_pid(lab, host)
    result = restart_chain(lab, host, topology)
    assert result.get("healthy") is True, result
    gateway = result["gateway"]
    assert gateway["removed_from"] == topology["gateways"] and gateway["added_to"] == topology["gateways"]
    assert gateway["in_gateways"] is True and gateway["drain"]["idle"] is True
    # smg lists a removed worker as draining (unhealthy, routed nothing) before it drops it: the chain went on then.
    assert gateway["draining_on"] == topology["gateways"], gateway
    names = [step["name"] for step in result["steps"]]
    assert names.index("gateway_drain") < names.index("drain_wait") < names.index("stop")
    assert names.index("gate") < names.index("gateway_add")
    assert main_pid(lab, host) != pid
    assert listed(lab, topology) == everyone_in(topology)


def test_one_replica_down_fails_before_any_host_is_stopped(lab, topology):
    # The engine of the first host, the replica of the second: the replica that is down is not the engine's own.
    host = topology["hosts"][0]
    down = topology["gateway_hosts"][1]
    pid = main_pid(lab, host)
    sh(lab, down, f"systemctl stop {GATEWAY_UNIT}")
    try:
        result = restart_chain(lab, host, topology)
        assert result["_status"] == "FAILED!", result
        assert result["gate"]["failed_step"] == "gateway_drain"
        failed_at = f"{FLEET_UNIT} restart chain failed at gateway_drain: "
        assert result["msg"].startswith(failed_at + "1 of 2 gateway(s) cannot be used, nothing was changed:")
        assert f"gateway {topology['gateways'][1]}: cannot reach it" in result["msg"]
        assert main_pid(lab, host) == pid
        up = topology["gateway_hosts"][0]
        assert listed(lab, topology | {"gateway_hosts": [up]}) == {up: everyone_in(topology)[up]}
    finally:
        # A restarted smg forgets the workers added through its API: add them back.
        sh(lab, down, f"systemctl start {GATEWAY_UNIT}")
        wait_answers(lab, down, "/health", port=GATEWAY_PORT, timeout=60)
        for worker in topology["workers"].values():
            added = lab.module(
                down,
                "llmops.inference.sglang_gateway_worker",
                {"gateways": [topology["gateways"][1]], "worker_url": worker, "state": "present", "api_key": KEY,
                 "worker_api_key": KEY, "wait_timeout": 60, "poll_interval": 0.2},
            )  # fmt: skip
            assert added["_status"] == "CHANGED", added
    assert listed(lab, topology) == everyone_in(topology)


def test_a_rolling_deploy_and_a_rollback_under_load_lose_no_request(lab, topology, tmp_path, capsys):
    pids = {host: main_pid(lab, host) for host in topology["hosts"]}
    load = Load(topology["gateways"][0])
    started = time.monotonic()
    deployed, records = deploy(lab, tmp_path, topology, "deploy", {"sglang_service_environment": release()})
    rolled, rollback_records = rollback(lab, tmp_path, topology, "rollback")
    summary = load.finish()
    report(capsys, "deploy and rollback with the gateway step", summary, time.monotonic() - started)

    assert deployed.returncode == 0, output(deployed)
    assert set(outcomes(records).values()) == {"deployed"}, outcomes(records)
    assert rolled.returncode == 0, output(rolled)
    assert set(outcomes(rollback_records).values()) == {"returned"}, outcomes(rollback_records)
    after = {host: main_pid(lab, host) for host in topology["hosts"]}
    assert all(after[host] != pids[host] for host in pids), (pids, after)
    assert (summary["failed"], summary["truncated"]) == (0, 0), summary
    assert summary["ok"] >= CLIENTS, summary
    assert listed(lab, topology) == everyone_in(topology)


def test_without_the_gateway_step_the_same_load_loses_requests(lab, topology, tmp_path, capsys):
    load = Load(topology["gateways"][0], tokens=CONTROL_TOKENS, rounds=1)
    started = time.monotonic()
    extra = {"sglang_service_environment": release(), "sglang_service_gateways": [], **SHORT_STOP}
    deployed, records = deploy(lab, tmp_path, topology, "deploy-no-gateway", extra)
    summary = load.finish()
    report(capsys, "deploy without the gateway step (sglang_service_gateways: [])", summary, time.monotonic() - started)

    assert deployed.returncode == 0, output(deployed)
    assert set(outcomes(records).values()) == {"deployed"}, outcomes(records)
    assert lost(summary) > 0, summary
    # The workers never left the gateways; each is healthy again once it restarted.
    assert lab_wait_listed(lab, topology) == everyone_in(topology)


def lab_wait_listed(lab, topology, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = listed(lab, topology)
        if found == everyone_in(topology) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_a_deploy_that_would_remove_the_last_healthy_worker_refuses_before_touching_it(lab, topology, tmp_path):
    first, *others = topology["hosts"]
    for host in others:
        removed = lab.module(
            first,
            "llmops.inference.sglang_gateway_worker",
            {"gateways": topology["gateways"], "worker_url": topology["workers"][host], "state": "absent",
             "api_key": KEY, "wait_timeout": 60, "poll_interval": 0.2},
        )  # fmt: skip
        assert removed["_status"] == "CHANGED", removed
    pid = main_pid(lab, first)
    env_before = sha256(lab, first, FLEET_ENV_FILE)
    try:
        proc, records = deploy(
            lab, tmp_path, topology, "last-worker", {"deploy_hosts": first, "sglang_service_environment": release()}
        )
        assert proc.returncode != 0, output(proc)
        assert outcomes(records) == {first: "failed"}, records
        detail = records[first]["detail"]
        assert f"refusing to remove {topology['workers'][first]} from any gateway (min_healthy=1)" in detail, detail
        assert "it would leave 0 healthy worker(s) of model Qwen/Qwen2.5-7B-Instruct" in detail, detail
        assert "healthy others: none" in detail, detail
        assert "(nothing was changed, so nothing was rolled back)" in detail, detail
        assert main_pid(lab, first) == pid
        assert sha256(lab, first, FLEET_ENV_FILE) == env_before
        in_both = {host: [(topology["workers"][first], True)] for host in topology["gateway_hosts"]}
        assert listed(lab, topology) == in_both
    finally:
        for host in others:
            lab.module(
                first,
                "llmops.inference.sglang_gateway_worker",
                {"gateways": topology["gateways"], "worker_url": topology["workers"][host], "state": "present",
                 "api_key": KEY, "worker_api_key": KEY, "wait_timeout": 60, "poll_interval": 0.2},
            )  # fmt: skip
    assert listed(lab, topology) == everyone_in(topology)


def test_a_host_whose_gate_fails_stays_out_of_the_gateways_while_the_others_serve(lab, topology, tmp_path, capsys):
    bad = topology["hosts"][-1]
    load = Load(topology["gateways"][0])
    started = time.monotonic()
    faulty = {bad: {"sglang_service_environment": {**release(), "SGLANG_SIM_FAULTS": "degenerate"}}}
    # Host variables (not extra vars, which would win over them): only the host deployed gets the fault.
    proc, records = deploy(lab, tmp_path, topology, "gate-fails", {"deploy_hosts": bad}, faulty)
    summary = load.finish()
    report(capsys, "a deploy whose gate fails, with the gateway step", summary, time.monotonic() - started)

    assert proc.returncode != 0, output(proc)
    assert outcomes(records) == {bad: "rolled back"}, records
    detail = records[bad]["detail"]
    assert f"({topology['workers'][bad]} is left out of its gateway(s): {', '.join(topology['gateways'])})" in detail
    assert (summary["failed"], summary["truncated"]) == (0, 0), summary
    # The rollback to its known-good state passed its gate, and that put it back.
    assert listed(lab, topology) == everyone_in(topology)
