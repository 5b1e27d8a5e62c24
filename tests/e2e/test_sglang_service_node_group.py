"""One engine across two lab hosts (2 GPUs each, tp_size 4): the role renders --nnodes/--node-rank/--dist-init-addr
from sglang_service_node_group, refuses a group that cannot work before anything changes on either host, and the
simulated engine behaves as SGLang 0.5.23's multi-node launch: rank 0 serves only once rank 1 joined, rank 1 runs
its schedulers and a dummy health server, no API.

The play (playbooks/service_node_group.yml) runs the role's preflight and writes the unit from its templates; the
ranks are started here, one after the other, since the restart chain restarts and gates each host on its own.

Run with LLMOPS_LAB_HOSTS=2 (the two first hosts of the lab are the group).
"""

from __future__ import annotations

import time

import pytest
from gateway_lab import connect_hosts
from labutil import PLAYBOOKS, SERVICE_LAB_VARS, sh, wait_healthy

pytestmark = pytest.mark.lab

UNIT = "sglang-mn.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/llmops/sglang-mn.env"


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
    probe = (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    print(urllib.request.urlopen('http://127.0.0.1:30000{path}', timeout=5).status)\n"
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

    # Start them apart: rank 0 waits for rank 1 (no HTTP), and serves once it joined.
    sh(lab, rank0, f"systemctl start --no-block {UNIT}")
    time.sleep(8)
    assert sh(lab, rank0, f"systemctl show -P ActiveState {UNIT}").strip() == "activating"
    assert answers(lab, rank0, "/health") == 0
    assert titles(lab, rank0) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
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

    # Rank 0's stop drains, and its ShutdownReq ends rank 1's engine too, cleanly.
    sh(lab, rank0, f"systemctl stop {UNIT}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sh(lab, rank1, f"systemctl show -P ActiveState {UNIT}").strip() != "inactive":
        time.sleep(1)
    assert titles(lab, rank1) == []
    shown = sh(lab, rank1, f"systemctl show -p Result -p ExecMainStatus {UNIT}").split()
    assert set(shown) == {"Result=success", "ExecMainStatus=0"}, shown
