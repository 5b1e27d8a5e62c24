"""The real gateway (smg 1.13.0) on lab hosts: the sglang_gateway role and the sglang_gateway_worker module.

Two hosts, each running a simulated engine (a plain unit) and a gateway replica (the role). The gateways and
the engines use one API key, as smg needs when it passes clients' keys on to the engines. The tests run in
order and build on each other: the role converges, the module adds both engines to both replicas, requests
flow, removals obey min_healthy, a replica that is down or a wrong key stop the module before any change,
and a load run through a gateway loses nothing while an engine leaves and rejoins both replicas.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gateway_lab import (
    ENGINE_PORT,
    ENGINE_UNIT,
    GATEWAY_PORT,
    GATEWAY_UNIT,
    REPO,
    apply_gateway_role,
    connect_hosts,
    gateway_url,
    gateway_workers,
    main_pid,
    recap,
    start_engine,
    unit_properties,
    worker_url,
)
from labutil import sh

pytestmark = pytest.mark.lab

KEY = "lab-gateway-key-7f3a"
MODULE = "llmops.inference.sglang_gateway_worker"
LOADGEN = REPO / "tests" / "e2e" / "loadgen.py"


@pytest.fixture(scope="module")
def topology(lab):
    """Engines on both hosts, routed to each other; the gateway role applied to both (its first run kept)."""
    lab.reset()
    for host in pair(lab):
        # A fresh host: nothing of the gateway left by an earlier test on this lab (its venv, its user).
        sh(
            lab,
            host,
            f"systemctl stop {GATEWAY_UNIT} 2>/dev/null; rm -rf /etc/systemd/system/{GATEWAY_UNIT} /opt/sglang-gateway;"
            " userdel sglang-gateway 2>/dev/null; groupdel sglang-gateway 2>/dev/null; true",
        )
    found = {host: address for host, address in connect_hosts(lab).items() if host in pair(lab)}
    for host in pair(lab):
        start_engine(lab, host, KEY)
    fresh_check = apply_gateway_role(lab, ",".join(pair(lab)), {"sglang_gateway_api_key": KEY}, check=True, diff=True)
    left_by_check = {
        host: lab.exec(
            host, f"ls -d /opt/sglang-gateway /etc/llmops/sglang-gateway.key /etc/systemd/system/{GATEWAY_UNIT}"
        ).stdout
        for host in pair(lab)
    }
    first = apply_gateway_role(lab, ",".join(pair(lab)), {"sglang_gateway_api_key": KEY})
    yield {"addresses": found, "first_run": first, "fresh_check": fresh_check, "left_by_check": left_by_check}
    for host in pair(lab):
        sh(lab, host, f"systemctl stop {GATEWAY_UNIT} {ENGINE_UNIT} 2>/dev/null; true")
    lab.reset()


def pair(lab) -> list:
    """The two hosts that each run an engine and a gateway replica (a larger lab's other hosts stay idle)."""
    return lab.hosts[:2]


def gateways(topology) -> list:
    return [gateway_url(address) for address in topology["addresses"].values()]


def workers(topology) -> list:
    return [worker_url(address) for address in topology["addresses"].values()]


def membership(lab, topology, state: str, worker: str, **args) -> dict:
    """Run the module on the first host against both gateway replicas."""
    options = {"gateways": gateways(topology), "worker_url": worker, "state": state, "api_key": KEY,
               "worker_api_key": KEY, "wait_timeout": 60, "poll_interval": 0.2, **args}  # fmt: skip
    check = options.pop("_check", False)
    diff = options.pop("_diff", False)
    return lab.module(lab.hosts[0], MODULE, options, check=check, diff=diff)


def listed(lab, topology) -> dict:
    return {host: sorted(worker[0] for worker in gateway_workers(lab, host, KEY)) for host in pair(lab)}


def test_check_mode_on_a_fresh_host_reports_changes_and_makes_none(lab, topology):
    checked = topology["fresh_check"]
    assert checked.returncode == 0, checked.stdout[-4000:]
    assert all(counts["changed"] > 0 and counts["failed"] == 0 for counts in recap(checked).values())
    assert "check mode: would install smg==1.13.0" in checked.stdout
    assert "check mode: would restart sglang-gateway.service" in checked.stdout
    assert topology["left_by_check"] == dict.fromkeys(pair(lab), "")


def test_the_role_converges_idempotently_with_a_hardened_unit(lab, topology):
    first = topology["first_run"]
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert all(counts["changed"] > 0 and counts["failed"] == 0 for counts in recap(first).values())
    pids = {host: main_pid(lab, host) for host in pair(lab)}
    assert all(pids.values())

    second = apply_gateway_role(lab, ",".join(pair(lab)), {"sglang_gateway_api_key": KEY})
    assert second.returncode == 0, second.stdout[-4000:]
    assert all(counts["changed"] == 0 for counts in recap(second).values()), second.stdout[-4000:]
    checked = apply_gateway_role(lab, ",".join(pair(lab)), {"sglang_gateway_api_key": KEY}, check=True, diff=True)
    assert checked.returncode == 0 and all(counts["changed"] == 0 for counts in recap(checked).values())
    assert {host: main_pid(lab, host) for host in pair(lab)} == pids, "a run without changes restarted the gateway"
    forced = apply_gateway_role(lab, lab.hosts[1], {"sglang_gateway_api_key": KEY}, tags="sglang_gateway_restart")
    assert forced.returncode == 0, forced.stdout[-3000:]
    assert main_pid(lab, lab.hosts[1]) != pids[lab.hosts[1]]
    pids[lab.hosts[1]] = main_pid(lab, lab.hosts[1])

    host = lab.hosts[0]
    props = unit_properties(
        lab, host,
        ["User", "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
         "CapabilityBoundingSet", "RestrictAddressFamilies", "MemoryDenyWriteExecute", "SystemCallFilter",
         "ActiveState", "NRestarts", "TimeoutStopUSec"],
    )  # fmt: skip
    assert props["User"] == "sglang-gateway"
    assert (props["NoNewPrivileges"], props["ProtectSystem"], props["ProtectHome"]) == ("yes", "strict", "yes")
    assert (props["PrivateTmp"], props["PrivateDevices"], props["MemoryDenyWriteExecute"]) == ("yes", "yes", "yes")
    assert props["CapabilityBoundingSet"] == ""
    assert set(props["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "LoadCredential=api_key:/etc/llmops/sglang-gateway.key" in sh(lab, host, f"systemctl cat {GATEWAY_UNIT}")
    assert props["SystemCallFilter"]
    assert props["ActiveState"] == "active" and props["NRestarts"] == "0"
    assert props["TimeoutStopUSec"] == "35s"
    pid = pids[host]
    assert sh(lab, host, f"ps -o user= -p {pid}").strip() == "sglang-gateway"
    status = sh(lab, host, f"cat /proc/{pid}/status")
    assert (
        "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status and "CapBnd:\t0000000000000000" in status
    )
    assert lab.exec(host, f"nsenter -t {pid} -m touch /usr/smg-probe").returncode != 0, (
        "ProtectSystem=strict not applied"
    )
    # The key is nowhere but in the root-only key file: not in the unit, the command line, the environment.
    assert sh(lab, host, "stat -c '%U %a' /etc/llmops/sglang-gateway.key").strip() == "root 600"
    for place in ("/etc/systemd/system/sglang-gateway.service", f"/proc/{pid}/cmdline", f"/proc/{pid}/environ",
                  "/etc/llmops/sglang-gateway.env"):  # fmt: skip
        assert lab.exec(host, f"grep -c {KEY} {place}").stdout.strip() in ("0", ""), place
    assert KEY not in sh(lab, host, f"journalctl -u {GATEWAY_UNIT} --no-pager")
    assert KEY not in first.stdout + second.stdout
    health = sh(
        lab,
        host,
        f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{GATEWAY_PORT}/health').status)\"",
    )
    assert health.strip() == "200"


def test_bad_role_input_is_named_and_changes_nothing(lab, topology):
    host = lab.hosts[0]
    before = sh(
        lab, host, f"sha256sum /etc/systemd/system/{GATEWAY_UNIT}; systemctl show -p MainPID --value {GATEWAY_UNIT}"
    )
    bad = apply_gateway_role(
        lab, host,
        {"sglang_gateway_api_key": KEY, "sglang_gateway_description": "gw\nExecStartPre=/bin/touch /tmp/pwned",
         "sglang_gateway_port": 70000, "sglang_gateway_extra_args": ["--api-key", "x"]},
    )  # fmt: skip
    assert bad.returncode != 0
    assert "sglang_gateway_description must not contain line breaks or other control characters" in bad.stdout
    assert "sglang_gateway_port must be an integer from 1 to 65535" in bad.stdout
    assert "sglang_gateway_extra_args must be a list of strings or numbers" in bad.stdout
    assert recap(bad)[host]["changed"] == 0
    after = sh(
        lab, host, f"sha256sum /etc/systemd/system/{GATEWAY_UNIT}; systemctl show -p MainPID --value {GATEWAY_UNIT}"
    )
    assert after == before
    assert lab.exec(host, "test -e /tmp/pwned").returncode != 0


def test_a_gateway_that_does_not_come_up_fails_with_its_state_and_journal_and_no_key(lab, topology):
    """smg refuses a flag (its value the API key): the host fails with the probe's reason, the unit's state
    (systemd_service's status) and the journal's tail (sglang_probe's, through the shared redactor); no key shows.
    The next good run brings the gateway back."""
    host = lab.hosts[1]
    bad = apply_gateway_role(
        lab, host, {"sglang_gateway_api_key": KEY, "sglang_gateway_extra_args": ["--no-such-flag", KEY]}
    )
    output = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert f"{GATEWAY_UNIT} did not come up within 60 s: " in output, output[-4000:]
    assert "ActiveState=" in output and "NRestarts=" in output, output[-4000:]
    assert "unrecognized arguments: --no-such-flag" in output, output[-4000:]
    assert KEY not in output
    sh(lab, host, f"systemctl reset-failed {GATEWAY_UNIT}; true")
    good = apply_gateway_role(lab, host, {"sglang_gateway_api_key": KEY})
    assert good.returncode == 0, good.stdout[-4000:]
    assert unit_properties(lab, host, ["ActiveState"])["ActiveState"] == "active"


def test_the_module_adds_each_engine_to_both_replicas(lab, topology):
    for worker in workers(topology):
        checked = membership(lab, topology, "present", worker, _check=True, _diff=True)
        assert checked["changed"] is True, checked
        assert [view["action"] for view in checked["gateways"]] == ["would add", "would add"]
        added = membership(lab, topology, "present", worker)
        assert added["changed"] is True, added
        assert [(view["action"], view["healthy"], view["api"]) for view in added["gateways"]] == [
            ("added", True, "smg"), ("added", True, "smg")
        ]  # fmt: skip
        assert {view["model"] for view in added["gateways"]} == {"Qwen/Qwen3-8B"}
        again = membership(lab, topology, "present", worker)
        assert again["changed"] is False
    assert listed(lab, topology) == {host: sorted(workers(topology)) for host in pair(lab)}
    assert KEY not in json.dumps(added)


def loadgen(topology, gateway: str, seconds: float, out) -> subprocess.Popen:
    key_file = out.with_suffix(".key")
    key_file.write_text(KEY)
    return subprocess.Popen(
        [sys.executable, str(LOADGEN), "--url", gateway, "--concurrency", "8", "--duration", str(seconds),
         "--max-new-tokens", "40", "--api-key-file", str(key_file), "--out", str(out), "--timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_requests_through_either_replica_reach_both_engines(lab, topology, tmp_path):
    for number, gateway in enumerate(gateways(topology)):
        proc = loadgen(topology, gateway, 3, tmp_path / f"load{number}.json")
        out, err = proc.communicate(timeout=120)
        summary = json.loads(out)
        assert proc.returncode == 0, (summary, err)
        assert summary["failed"] == 0 and summary["truncated"] == 0 and summary["ok"] > 8
    for host in pair(lab):
        # Both engines served some of them (round robin on each replica).
        assert int(sh(lab, host, f"journalctl -u {ENGINE_UNIT} --no-pager | grep -c 'POST /generate' || true")) > 0


def test_min_healthy_refuses_to_remove_the_last_healthy_engine(lab, topology):
    first, second = workers(topology)
    removed = membership(lab, topology, "absent", second)
    assert removed["changed"] is True
    assert [view["present"] for view in removed["gateways"]] == [False, False]
    refused = membership(lab, topology, "absent", first)
    assert refused["_status"] == "FAILED!", refused
    assert refused["msg"].startswith(f"refusing to remove {first} from any gateway (min_healthy=1):")
    assert "it would leave 0 healthy worker(s) of model Qwen/Qwen3-8B" in refused["msg"]
    assert listed(lab, topology) == {host: [first] for host in pair(lab)}
    assert membership(lab, topology, "present", second)["changed"] is True


def test_a_replica_that_is_down_stops_the_module_before_any_change(lab, topology):
    first = workers(topology)[0]
    down_host = lab.hosts[1]
    sh(lab, down_host, f"systemctl stop {GATEWAY_UNIT}")
    try:
        result = membership(lab, topology, "absent", first)
        assert result["_status"] == "FAILED!", result
        down = gateways(topology)[1]
        assert result["msg"].startswith("1 of 2 gateway(s) cannot be used, nothing was changed:")
        assert f"gateway {down}: cannot reach it (GET /workers:" in result["msg"]
        assert sorted(worker[0] for worker in gateway_workers(lab, lab.hosts[0], KEY)) == sorted(workers(topology))
    finally:
        # A restart forgets the workers added through the API: put them back on the restarted replica.
        restarted = apply_gateway_role(lab, down_host, {"sglang_gateway_api_key": KEY})
        assert restarted.returncode == 0, restarted.stdout[-3000:]
        for worker in workers(topology):
            membership(lab, topology, "present", worker)
    assert listed(lab, topology) == {host: sorted(workers(topology)) for host in pair(lab)}


def test_a_wrong_api_key_is_a_clear_error_and_changes_nothing(lab, topology):
    first = workers(topology)[0]
    result = membership(lab, topology, "absent", first, api_key="not-the-key", min_healthy=0)
    assert result["_status"] == "FAILED!", result
    assert "2 of 2 gateway(s) cannot be used, nothing was changed" in result["msg"]
    assert "GET /workers answered HTTP 401: the gateway refused api_key (Invalid API key)" in result["msg"]
    assert "not-the-key" not in json.dumps(result)
    assert listed(lab, topology) == {host: sorted(workers(topology)) for host in pair(lab)}


RUNNING_REQUESTS = """
import re, sys, time, urllib.request
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    text = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    found = re.search(r"^sglang:num_running_reqs(?:{{[^}}]*}})? ([0-9.]+)", text, re.M)
    if found and float(found.group(1)) > 0:
        sys.exit(0)
    time.sleep(0.05)
sys.exit("no running requests on the engine within 30 s")
"""


def wait_for_running_requests(lab, host: str) -> None:
    """Until the engine on ``host`` has requests in flight (the load reached it through the gateway)."""
    sh(lab, host, f"python3 - <<'EOF'\n{RUNNING_REQUESTS.format(port=ENGINE_PORT)}\nEOF", timeout=60)


def test_load_through_a_gateway_loses_nothing_while_an_engine_leaves_and_rejoins(lab, topology, tmp_path):
    second = workers(topology)[1]
    pids = {host: main_pid(lab, host) for host in pair(lab)}
    engine_pids = {host: main_pid(lab, host, ENGINE_UNIT) for host in pair(lab)}
    out = tmp_path / "load.json"
    proc = loadgen(topology, gateways(topology)[0], 20, out)
    wait_for_running_requests(lab, lab.hosts[1])
    removed = membership(lab, topology, "absent", second)
    assert removed["changed"] is True, removed
    added = membership(lab, topology, "present", second)
    assert added["changed"] is True, added
    stdout, stderr = proc.communicate(timeout=120)
    summary = json.loads(stdout)
    assert proc.returncode == 0, (summary, stderr)
    assert (summary["failed"], summary["truncated"]) == (0, 0), summary
    assert summary["ok"] > 40
    records = json.loads(out.read_text())["records"]
    assert all(record["done"] and record["completion_tokens"] == 40 for record in records)
    # Nothing restarted: gateways and engines kept their processes.
    assert {host: main_pid(lab, host) for host in pair(lab)} == pids
    assert {host: main_pid(lab, host, ENGINE_UNIT) for host in pair(lab)} == engine_pids
