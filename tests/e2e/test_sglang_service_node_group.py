"""One engine across two lab hosts (2 GPUs each, tp_size 4): the role renders --nnodes/--node-rank/--dist-init-addr
from sglang_service_node_group, refuses a group that cannot work before anything changes on either host, and the
simulated engine behaves as SGLang 0.5.23's multi-node launch: rank 0 serves only once rank 1 joined, rank 1 runs
its schedulers and a dummy health server, no API.

The first test runs the role's preflight and writes the unit from its templates (playbooks/service_node_group.yml),
then starts the ranks itself, one after the other. The others share one deploy of the whole role on three hosts - the
group on the first two, a single-node engine on the third - and show the group restarting as one: a change on rank 1
restarts both ranks and not the single engine, a member that cannot be reached stops a deploy before any change,
and rank 1 crashing during the restart fails the group naming it and leaves both ranks stopped, no GPU held. Then
deploy.yml and rollback.yml keep the group in one batch, and a rolling deploy of the group through the real
gateway (rank 0 the group's worker) loses no request, a deploy whose rank 1 crashes returns both ranks to
known-good, the fleet probe gates rank 1 on what it serves and reports the group as one engine, and a sweep
point restarts the group as one.

Run with three lab hosts (the default LLMOPS_LAB_HOSTS).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import loadgen
import pytest
import yaml
from gateway_lab import apply_gateway_role, connect_hosts, gateway_url, gateway_workers, worker_url
from labutil import (
    DEPLOY,
    LAB_LAYER,
    PLAYBOOKS,
    ROLLBACK,
    SERVICE_LAB_VARS,
    gpu_claims,
    outcomes,
    output,
    run_playbook,
    sh,
    unit_show,
    wait_healthy,
    wait_until,
)

pytestmark = pytest.mark.lab

FLEET_PROBE = Path(__file__).resolve().parents[2] / "playbooks" / "fleet_probe.yml"
SWEEP = Path(__file__).resolve().parents[2] / "playbooks" / "spec_sweep.yml"
UNIT = "sglang-mn.service"
# The engines' and the gateway's API key, once the engines are behind the gateway.
KEY = "lab-node-group-key-7d21"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/llmops/sglang-mn.env"
LOCK = "/run/lock/llmops-sglang-mn.lock"


def group_vars(lab, **overrides) -> dict:
    return {
        **SERVICE_LAB_VARS,
        "sglang_service_name": "sglang-mn",
        "sglang_service_tp_size": 4,
        "sglang_service_node_group": lab.hosts[:2],
        "sglang_service_dist_timeout": 60,
        "svc_test_host": ":".join(lab.hosts[:2]),
        **overrides,
    }


def apply(lab, tmp_path, **overrides):
    proc = lab.playbook(PLAYBOOKS / "service_node_group.yml", group_vars(lab, **overrides))
    return proc, proc.stdout + proc.stderr


def nothing_written(lab) -> None:
    for host in lab.hosts[:2]:
        assert sh(lab, host, f"ls {UNIT_PATH} {ENV_PATH} 2>/dev/null; true").strip() == "", host


def titles(lab, host: str) -> list:
    out = sh(lab, host, "ps -eo args= | grep '^sglang::' || true")
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def answers(lab, host: str, path: str) -> int:
    """The status of GET ``path`` on the host's engine, with the key the engines get once behind the gateway."""
    probe = (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    request = urllib.request.Request('http://127.0.0.1:30000{path}', "
        f"headers={{'Authorization': 'Bearer {KEY}'}})\n"
        "    print(urllib.request.urlopen(request, timeout=5).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"
        "except OSError:\n"
        "    print(0)\n"
    )
    return int(sh(lab, host, f"python3 - <<'EOF'\n{probe}EOF").strip())


def test_a_two_host_engine_is_refused_whole_then_rendered_and_ranks_start_together(clean_lab, tmp_path):
    lab = clean_lab
    assert len(lab.hosts) >= 2, "run with LLMOPS_LAB_HOSTS=2"
    rank0, rank1 = lab.hosts[:2]

    # tp_size that does not divide by the hosts: both hosts refuse, nothing is written on either.
    proc, out = apply(lab, tmp_path, sglang_service_tp_size=3)
    assert proc.returncode != 0
    assert "sglang_service_tp_size 3 does not divide by the 2 hosts of sglang_service_node_group" in out, out
    nothing_written(lab)

    # The hosts cannot reach each other yet: rank 1 cannot reach rank 0's address, and rank 0 stops with it.
    proc, out = apply(lab, tmp_path)
    assert proc.returncode != 0
    assert f"{rank1} cannot reach sglang_service_dist_init_addr" in out, out
    assert f"sglang_service_node_group names {rank1}, which is not in this play" in out, out
    nothing_written(lab)

    address = connect_hosts(lab)[rank0]
    proc, out = apply(lab, tmp_path)
    assert proc.returncode == 0, out
    for rank, host in enumerate((rank0, rank1)):
        exec_start = sh(lab, host, f"systemctl show -P ExecStart {UNIT}")
        assert "--tp-size 4 --host 127.0.0.1 --port 30000" in exec_start, exec_start
        assert f"--nnodes 2 --node-rank {rank} --dist-init-addr {address}:20000 --dist-timeout 60" in exec_start
        assert "CUDA_VISIBLE_DEVICES=0,1" in sh(lab, host, f"systemctl show -P Environment {UNIT}")

    # Start them apart: rank 0 waits for rank 1 in the rendezvous (its schedulers up, its store listening on the
    # dist-init port, no HTTP), and serves once rank 1 joined.
    sh(lab, rank0, f"systemctl start --no-block {UNIT}")
    waiting = ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    wait_until(
        lambda: titles(lab, rank0) == waiting and ":20000 " in sh(lab, rank0, "ss -Hltn 'sport = :20000'"),
        60,
        "rank 0 to wait in the rendezvous",
        interval=0.2,
    )
    assert sh(lab, rank0, f"systemctl show -P ActiveState {UNIT}").strip() == "activating"
    assert answers(lab, rank0, "/health") == 0
    joined_at = float(sh(lab, rank1, f"date +%s.%N; systemctl start --no-block {UNIT}").split()[0])
    ready_at = wait_healthy(lab, rank0, timeout=120)
    assert ready_at > joined_at
    assert answers(lab, rank0, "/v1/models") == 200

    # Rank 1: its two schedulers (TP2, TP3), no detokenizer; /health answers, the API does not.
    wait_healthy(lab, rank1, timeout=60)
    assert titles(lab, rank1) == ["sglang::scheduler_TP2", "sglang::scheduler_TP3"]
    assert answers(lab, rank1, "/v1/models") == 404
    assert answers(lab, rank1, "/model_info") == 404
    assert "Dummy health check server started" in sh(lab, rank1, f"journalctl -u {UNIT} --no-pager")

    # A plain `systemctl restart` of rank 0, outside the chain: its ShutdownReq ends rank 1 cleanly (exit 0, as the
    # real rank >= 1 returns), Restart=always brings rank 1 back by itself into the rendezvous, and the group serves
    # again with no further command, within dist_timeout (60 s) plus load time plus a margin. Rank 0 restarted as asked
    # and never crashed: its NRestarts (automatic restarts only) stays 0.
    since = sh(lab, rank1, "date '+%Y-%m-%d %H:%M:%S'").strip()
    sh(lab, rank0, f"systemctl restart --no-block {UNIT}")
    wait_until(
        lambda: int(sh(lab, rank1, f"systemctl show -P NRestarts {UNIT}").strip() or 0) >= 1,
        60,
        "rank 1 to end with rank 0 and come back by itself",
        interval=0.2,
    )
    wait_healthy(lab, rank0, timeout=60 + 120)
    assert answers(lab, rank0, "/v1/models") == 200
    wait_healthy(lab, rank1, timeout=60)
    assert sh(lab, rank0, f"systemctl show -P NRestarts {UNIT}").strip() == "0"
    journal = sh(lab, rank1, f"journalctl -u {UNIT} --no-pager --since '{since}'")
    assert "Scheduled restart job" in journal, journal
    assert "Failed with result" not in journal, journal

    # A hand-run stop of rank 1 has no drain to wait for: its schedulers end on systemd's SIGTERM, well before its
    # short TimeoutStopSec would SIGKILL them (Result=timeout).
    sh(lab, rank1, f"systemctl stop {UNIT}")
    assert titles(lab, rank1) == []
    result = sh(lab, rank1, f"systemctl show -P Result {UNIT}").strip()
    assert result != "timeout", result


# -- the group restarts as one -------------------------------------------------------------------------------

KNOWN_GOOD = "/var/lib/llmops/known-good/sglang-mn/current/manifest.json"


@dataclass
class Deployed:
    lab: object
    rank0: str
    rank1: str
    single: str
    workdir: Path
    # What every engine gets once the gateway runs (test_deploy_in_batches...): listen on the lab address, behind it.
    behind: dict = field(default_factory=dict)

    def apply(self, name: str, rank0=None, rank1=None, single=None, shared=None) -> tuple:
        """The role on the three hosts: the group's settings and each host's own (``rank0``, ...) as inventory host
        variables (extra variables would reach every host), the shared lab settings (and ``shared``) as extra
        variables."""
        inventory, extra = self._layer(name, rank0, rank1, single)
        proc = self.lab.playbook(PLAYBOOKS / "service_role.yml", {**extra, **(shared or {})}, inventories=(inventory,))
        return proc, output(proc)

    def deploy(self, name: str, rank0=None, rank1=None, single=None) -> tuple:
        """playbooks/deploy.yml on the three hosts, one host per batch, with the same variables as ``apply``."""
        inventory, extra = self._layer(name, rank0, rank1, single)
        extra = {key: value for key, value in extra.items() if key != "svc_test_host"} | {"deploy_batch": 1}
        return run_playbook(self.lab, DEPLOY, self.workdir, name, extra, inventories=(inventory,))

    def rollback(self, name: str) -> tuple:
        """playbooks/rollback.yml to the previous known-good snapshot on the group's two hosts, one host per batch
        (the single engine's previous snapshot is from before the gateway: the gateway could not reach it)."""
        inventory, extra = self._layer(name)
        extra = {key: value for key, value in extra.items() if key != "svc_test_host"}
        extra |= {"rollback_batch": 1, "rollback_hosts": f"{self.rank0},{self.rank1}"}
        return run_playbook(self.lab, ROLLBACK, self.workdir, name, extra, inventories=(inventory,))

    def probe(self, name: str) -> tuple:
        """playbooks/fleet_probe.yml on the three hosts: its output and the per-host results."""
        inventory, extra = self._layer(name)
        summary = self.workdir / f"{name}.json"
        extra = {key: value for key, value in extra.items() if key != "svc_test_host"}
        extra |= {"fleet_probe_hosts": ",".join(self.pids()), "fleet_probe_summary_path": str(summary)}
        proc = self.lab.playbook(FLEET_PROBE, extra, inventories=(LAB_LAYER, inventory))
        return proc, json.loads(summary.read_text()) if summary.exists() else {}

    def sweep(self, name: str, steps: list) -> tuple:
        """playbooks/spec_sweep.yml on the group's two hosts: one load level, one short run per point."""
        inventory, extra = self._layer(name)
        results_dir = self.workdir / name
        extra = {key: value for key, value in extra.items() if key != "svc_test_host"} | {
            "sweep_hosts": f"{self.rank0}:{self.rank1}",
            "sweep_steps": steps,
            "sweep_algorithm": "EAGLE",
            "sweep_concurrency": [1],
            "sweep_repeats": 1,
            "sweep_warmup_requests": 0,
            "sweep_bench": {"num_prompts": 2, "max_new_tokens": 16, "request_timeout": 20},
            "sweep_results_dir": str(results_dir),
        }
        proc = self.lab.playbook(SWEEP, extra, inventories=(LAB_LAYER, inventory))
        results = results_dir / "results.json"
        return proc, json.loads(results.read_text()) if results.exists() else {}

    def _layer(self, name: str, rank0=None, rank1=None, single=None) -> tuple:
        group = {
            "sglang_service_node_group": [self.rank0, self.rank1],
            "sglang_service_tp_size": 4,
            "sglang_service_gpus": [0, 1],
            "sglang_service_dist_timeout": 60,
        }
        hosts = {
            self.rank0: {**group, **self.behind, **(rank0 or {})},
            self.rank1: {**group, **self.behind, **(rank1 or {})},
            self.single: {"sglang_service_tp_size": 2, **self.behind, **(single or {})},
        }
        for host, values in hosts.items():
            values["svc_test_result"] = str(self.workdir / f"{name}-{host}.json")
        inventory = self.workdir / f"{name}.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        shared = {key: value for key, value in SERVICE_LAB_VARS.items() if key != "sglang_service_tp_size"}
        return inventory, {**shared, "sglang_service_name": "sglang-mn", "svc_test_host": ":".join(hosts)}

    def result(self, name: str, host: str) -> dict:
        return json.loads((self.workdir / f"{name}-{host}.json").read_text())

    def pids(self) -> dict:
        return {host: int(unit_show(self.lab, host, UNIT)["MainPID"]) for host in (self.rank0, self.rank1, self.single)}


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    assert len(lab.hosts) >= 3, "run with three lab hosts"
    lab.reset_used()
    rank0, rank1, single = lab.hosts[:3]
    connect_hosts(lab)
    group = Deployed(lab, rank0, rank1, single, tmp_path_factory.mktemp("node_group"))
    try:
        proc, out = group.apply("first")
        assert proc.returncode == 0, out
        yield group
    finally:
        lab.reset()


def test_a_change_on_rank_1_restarts_both_ranks_as_one_and_leaves_the_single_engine_alone(deployed):
    lab, rank0, rank1, single = deployed.lab, deployed.rank0, deployed.rank1, deployed.single
    # The first deploy brought all three to serving: the group's rank 0 generates, rank 1 answers its health check.
    assert answers(lab, rank0, "/v1/models") == 200 and answers(lab, rank1, "/health") == 200
    assert answers(lab, single, "/v1/models") == 200
    before = deployed.pids()
    verified = json.loads(sh(lab, rank0, f"cat {KNOWN_GOOD}"))["verified_at"]

    proc, out = deployed.apply("change", rank1={"sglang_service_environment": {"LLMOPS_TEST_RELEASE": "2"}})
    assert proc.returncode == 0, out
    after = deployed.pids()
    assert after[rank0] != before[rank0] and after[rank1] != before[rank1], (before, after)
    assert after[single] == before[single]
    gate0, gate1 = deployed.result("change", rank0), deployed.result("change", rank1)
    assert (gate0["phase"], gate0["node_rank"], gate0["healthy"]) == ("gate", 0, True), gate0["msg"]
    assert (gate1["phase"], gate1["node_rank"], gate1["healthy"]) == ("gate", 1, True), gate1["msg"]
    assert [tier["name"] for tier in gate1["gate"]["tiers"] if tier["status"] == "ok"] == ["unit", "gpu", "health"]
    assert "generate" in [tier["name"] for tier in gate0["gate"]["tiers"] if tier["status"] == "ok"]
    # The group saved its snapshots once both passed, a new one on each rank (rank 0's files did not change).
    assert json.loads(sh(lab, rank1, f"cat {KNOWN_GOOD}"))["main_pid"] == after[rank1]
    assert json.loads(sh(lab, rank0, f"cat {KNOWN_GOOD}"))["verified_at"] != verified


def test_a_member_that_cannot_be_reached_refuses_its_group_before_any_change(deployed):
    """deploy.yml with rank 1 unreachable: its preflight stops the deploy before any batch, so neither rank (nor
    any other host) changes."""
    lab, rank0, rank1 = deployed.lab, deployed.rank0, deployed.rank1
    before = deployed.pids()
    env_before = sh(lab, rank0, f"sha256sum {ENV_PATH}")
    release = {"sglang_service_environment": {"LLMOPS_TEST_RELEASE": "3"}}
    proc, _records = deployed.deploy("unreachable", rank0=release, rank1={**release, "ansible_port": 1})
    out = output(proc)
    assert proc.returncode != 0
    assert f"fatal: [{rank1}]: UNREACHABLE!" in out, out
    assert "PLAY [Deploy - one batch at a time] ****" in out and "skipping: no hosts matched" in out, out
    assert sh(lab, rank0, f"sha256sum {ENV_PATH}") == env_before
    assert deployed.pids() == before


def test_rank_1_crashing_in_the_restart_fails_the_group_naming_it_and_leaves_both_ranks_stopped(deployed):
    lab, rank0, rank1, single = deployed.lab, deployed.rank0, deployed.rank1, deployed.single
    single_pid = deployed.pids()[single]
    crash = {"sglang_service_environment": {"SGLANG_SIM_FAULTS": "crash-on-load"}}
    proc, out = deployed.apply("crash", rank1=crash)
    assert proc.returncode != 0
    assert f"rank 1 ({rank1}) failed its gate: unit tier" in out, out
    assert "Every member of the group is stopped and reaped" in out, out
    for host in (rank0, rank1):
        shown = unit_show(lab, host, UNIT)
        assert shown["ActiveState"] == "inactive" and shown["MainPID"] == "0", (host, shown)
        assert titles(lab, host) == [], host
        assert gpu_claims(lab, host) == {}, host
    assert deployed.pids()[single] == single_pid


def test_the_group_restarts_lock_taken_away_mid_phase_stops_the_group_naming_it(deployed, tmp_path):
    """The lock of rank 1 is broken while its engine loads (a slow load): the run stops changing hosts, names the
    lost lock, and stops both ranks (the stop after the failure takes the free lock anew), so that no rank runs
    with the other's inputs."""
    lab, rank0, rank1 = deployed.lab, deployed.rank0, deployed.rank1
    before = deployed.pids()
    slow = {
        "sglang_service_extra_args": ["--sim-load-time", "60"],
        "sglang_service_probe_wait_timeout": 600,  # the gate waits for the slow load
    }
    release = {"sglang_service_environment": {"LLMOPS_TEST_RELEASE": "lost-lock"}}
    result = {}
    run = threading.Thread(
        target=lambda: result.update(zip(("proc", "out"), deployed.apply("lost-lock", rank1=release, shared=slow)))
    )
    run.start()
    try:
        wait_until(
            lambda: (
                unit_show(lab, rank1, UNIT)["ActiveState"] == "activating"
                and int(unit_show(lab, rank1, UNIT)["MainPID"] or 0) not in (0, before[rank1])
            ),
            600,
            "rank 1's slow load",
        )
        broken = lab.module(rank1, "llmops.inference.host_lock", {"path": LOCK, "state": "absent", "force": True})
        assert broken["changed"] is True, broken
    finally:
        run.join(900)
    proc, out = result["proc"], result["out"]
    assert proc.returncode != 0
    assert f"lost the host lock {LOCK}" in out, out
    for host in (rank0, rank1):
        shown = unit_show(lab, host, UNIT)
        assert shown["ActiveState"] == "inactive" and shown["MainPID"] == "0", (host, shown, out[-4000:])
        assert titles(lab, host) == [], host
    # (The single-node engine restarted too: the slow load's arguments, extra variables, reached its unit as well.)
    for host in (rank0, rank1):
        assert lab.module(host, "llmops.inference.host_lock", {"path": LOCK}, check=True)["held"] is False
    # The group serves again after a run of the role on it (the next test starts from a serving group).
    proc, out = deployed.apply("after-lost-lock", rank1=release)
    assert proc.returncode == 0, out


def workers(deployed) -> list:
    """Sorted (url, healthy) of the workers the gateway on the single-node host lists."""
    return sorted((url, healthy) for url, _status, healthy in gateway_workers(deployed.lab, deployed.single, KEY))


def test_deploy_in_batches_of_one_keeps_the_group_in_one_batch_and_loses_no_request_through_the_gateway(
    deployed, tmp_path
):
    """After the crash above left both ranks stopped: the gateway (the real smg) starts on the single-node host, and
    deploy.yml, one host per batch, deploys the two ranks together (split across batches, the group's restart would
    refuse to run without its other member) and brings all three engines to serving, rank 0 and the single engine
    behind the gateway; then a change on rank 1 alone deploys both ranks, rank 0 too though it is up to date, and
    leaves the single engine, up to date, as it is. That second deploy runs while clients stream through the gateway
    and loses no request: rank 0 is the group's worker there (rank 1 serves no API), taken out before the group
    restarts and added back once its gate passed, and the single engine serves meanwhile. The tests after this one
    run behind the gateway."""
    lab, rank0, rank1, single = deployed.lab, deployed.rank0, deployed.rank1, deployed.single
    addresses = connect_hosts(lab)
    proc = apply_gateway_role(lab, single, {"sglang_gateway_api_key": KEY})
    assert proc.returncode == 0, output(proc)
    deployed.behind = {
        "sglang_service_host": "0.0.0.0",
        "sglang_service_api_key": KEY,
        "sglang_service_gateways": [gateway_url(addresses[single])],
        "sglang_service_gateway_api_key": KEY,
    }
    proc, records = deployed.deploy("deploy")
    assert proc.returncode == 0, output(proc)
    # Every host changes: the fleet's layer (tests/lab/inventory) gives the engines an environment of its own.
    assert outcomes(records) == {rank0: "deployed", rank1: "deployed", single: "deployed"}, output(proc)
    # Rank 0 is the group's worker in the gateway; rank 1 serves no API.
    assert workers(deployed) == sorted((worker_url(addresses[host]), True) for host in (rank0, single))
    assert answers(lab, rank0, "/v1/models") == 200 and answers(lab, rank1, "/health") == 200
    assert answers(lab, single, "/v1/models") == 200
    before = deployed.pids()
    listed = workers(deployed)

    stop = tmp_path / "stop-load"
    settings = loadgen.LoadSettings(deployed.behind["sglang_service_gateways"][0], concurrency=4, duration=600,
                                    max_new_tokens=64, api_key=KEY, timeout=60, stop_file=str(stop))  # fmt: skip
    load = {}
    clients = threading.Thread(target=lambda: load.update(loadgen.run_load(settings)), daemon=True)
    clients.start()
    try:
        rank1_change = {"sglang_service_environment": {"LLMOPS_TEST_RELEASE": "4"}}
        proc, records = deployed.deploy("deploy-rank1", rank1=rank1_change)
    finally:
        stop.touch()
        clients.join(timeout=120)
    assert proc.returncode == 0, output(proc)
    assert outcomes(records) == {rank0: "deployed", rank1: "deployed", single: "unchanged"}, output(proc)
    after = deployed.pids()
    assert after[rank0] != before[rank0] and after[rank1] != before[rank1], (before, after)
    assert after[single] == before[single]
    summary = load["summary"]
    assert summary["requests"] > 0 and summary["ok"] == summary["requests"], summary
    assert workers(deployed) == listed


def test_a_rollback_returns_the_ranks_together_and_the_engine_serves(deployed):
    """rollback.yml, one host per batch, returns both ranks to the known-good state of the group restart before the
    last one, in one batch, and restarts them as one engine (a rank restarted alone would never come up)."""
    lab, rank0, rank1 = deployed.lab, deployed.rank0, deployed.rank1
    before = deployed.pids()
    assert 'LLMOPS_TEST_RELEASE="4"' in sh(lab, rank1, f"cat {ENV_PATH}")
    rank0_env = sh(lab, rank0, f"sha256sum {ENV_PATH}")
    proc, records = deployed.rollback("rollback")
    assert proc.returncode == 0, output(proc)
    assert {host: outcomes(records)[host] for host in (rank0, rank1)} == {rank0: "returned", rank1: "returned"}
    after = deployed.pids()
    assert after[rank0] != before[rank0] and after[rank1] != before[rank1], (before, after)
    assert 'LLMOPS_TEST_RELEASE="4"' not in sh(lab, rank1, f"cat {ENV_PATH}")
    # Both ranks are back on the same group restart's state: rank 0's files did not change in the deploy undone, so
    # they stay as they are (not its own older snapshot, which would mix two states in one engine).
    assert sh(lab, rank0, f"sha256sum {ENV_PATH}") == rank0_env
    assert answers(lab, rank0, "/v1/models") == 200 and answers(lab, rank1, "/health") == 200


def test_a_deploy_whose_rank_1_crashes_returns_both_ranks_to_known_good_and_the_engine_serves(deployed):
    """deploy.yml with rank 1 crashing on load: the group's gate fails naming rank 1, the deploy returns both ranks
    to the known-good state the rollback above left and restarts them as one, and the engine serves again."""
    lab, rank0, rank1, single = deployed.lab, deployed.rank0, deployed.rank1, deployed.single
    env_before = {host: sh(lab, host, f"sha256sum {ENV_PATH}") for host in (rank0, rank1)}
    single_pid = deployed.pids()[single]
    crash = {"sglang_service_environment": {"SGLANG_SIM_FAULTS": "crash-on-load"}}
    proc, records = deployed.deploy("deploy-crash", rank1=crash)
    out = output(proc)
    assert proc.returncode != 0
    assert f"rank 1 ({rank1}) failed its gate: unit tier" in out, out
    assert {host: outcomes(records)[host] for host in (rank0, rank1)} == {rank0: "rolled back", rank1: "rolled back"}
    assert {host: sh(lab, host, f"sha256sum {ENV_PATH}") for host in (rank0, rank1)} == env_before
    assert answers(lab, rank0, "/v1/models") == 200 and answers(lab, rank1, "/health") == 200
    assert deployed.pids()[single] == single_pid


def test_the_fleet_probe_gates_rank_1_on_what_it_serves(deployed):
    """Rank 1 serves no API: the fleet probe checks its unit, GPUs and health server, reports it serving, and reports
    the group as one engine that serves."""
    rank0, rank1, single = deployed.rank0, deployed.rank1, deployed.single
    proc, results = deployed.probe("probe")
    assert proc.returncode == 0, output(proc)
    assert "fleet probe: 3 of 3 host(s) serve" in proc.stdout, output(proc)
    assert f"{rank1} (rank 1 of a multi-node engine: unit, GPU and health tiers): SERVING" in proc.stdout
    assert f"multi-node engine {rank0}, {rank1}: SERVING" in proc.stdout, output(proc)
    tiers = {tier["name"]: tier["status"] for tier in results[rank1]["tiers"]}
    assert [name for name, status in tiers.items() if status == "ok"] == ["unit", "gpu", "health"], tiers
    assert tiers["generate"] == "skipped", tiers
    for host in (rank0, single):
        assert results[host]["healthy"] and results[host]["generation"], results[host]


def test_a_sweep_point_restarts_the_group_as_one_and_the_sweep_restores_the_original(deployed):
    """spec_sweep.yml on the two ranks: the engine takes the point once, the point restarts both ranks and is
    measured through rank 0, and the engine ends on its original configuration (no speculative drop-in). (Points
    follow one another the same way on any engine: test_spec_sweep.py runs several per host.)"""
    lab, rank0, rank1 = deployed.lab, deployed.rank0, deployed.rank1
    before = deployed.pids()
    proc, results = deployed.sweep("sweep", [2])
    assert proc.returncode == 0, output(proc)
    records = {record["point"]["steps"]: record for record in results["records"]}
    assert sorted(records) == [2], results
    for steps, record in records.items():
        assert (record["status"], record["host"]) == ("measured", rank0), (steps, record.get("reason"))
    assert results["definition"]["gpus_per_engine"] == 4
    after = deployed.pids()
    assert after[rank0] != before[rank0] and after[rank1] != before[rank1], (before, after)
    dropin = "/etc/systemd/system/sglang-mn.service.d/50-speculative.conf"
    for host in (rank0, rank1):
        assert sh(lab, host, f"ls {dropin} /var/lib/llmops/sweep 2>/dev/null; true").strip() == "", host
        assert "--speculative" not in sh(lab, host, f"systemctl show -P ExecStart {UNIT}"), host
    assert answers(lab, rank0, "/v1/models") == 200 and answers(lab, rank1, "/health") == 200
