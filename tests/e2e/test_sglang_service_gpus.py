"""Two services on one host with 4 GPUs: each engine is placed on its own GPUs, and a restart of one never touches
the other (its processes, its memory), nor does one's gate wait on the other's GPUs."""

from __future__ import annotations

import pytest
from labutil import SERVICE_LAB_VARS, gpu_claims, run_play, unit_of, unit_show

pytestmark = pytest.mark.lab

A = {"sglang_service_name": "sglang-gpa", "sglang_service_port": 30000, "sglang_service_gpus": ["0", "1"]}
B = {"sglang_service_name": "sglang-gpb", "sglang_service_port": 30001, "sglang_service_gpus": ["2", "3"]}


def gpus_of(lab, host: str, unit: str) -> set:
    """The GPUs the unit's processes hold simulated memory on."""
    return {gpu for pid, gpus in gpu_claims(lab, host).items() if unit_of(lab, host, pid) == unit for gpu in gpus}


@pytest.fixture
def host4(lab_gpus4):
    lab_gpus4.reset()
    yield lab_gpus4
    lab_gpus4.reset()


def test_two_services_stay_on_their_own_gpus_and_restart_independently(host4, tmp_path):
    lab = host4
    host = lab.hosts[0]
    assert SERVICE_LAB_VARS["sglang_service_tp_size"] == 2
    for label, service in (("a", A), ("b", B)):
        run = run_play(lab, tmp_path, host, "service_role", service, f"up-{label}")
        assert run.ok, run.output
        assert run.gate()["healthy"] is True
        assert set(run.gate()["gpu_memory_mib"]) >= set(service["sglang_service_gpus"])
    unit_a, unit_b = "sglang-gpa.service", "sglang-gpb.service"
    assert gpus_of(lab, host, unit_a) == {0, 1}
    assert gpus_of(lab, host, unit_b) == {2, 3}

    before_b = unit_show(lab, host, unit_b)
    claims_b = {pid: gpus for pid, gpus in gpu_claims(lab, host).items() if unit_of(lab, host, pid) == unit_b}
    restart_a = run_play(lab, tmp_path, host, "service_restart", A, "restart-a")
    assert restart_a.ok, restart_a.output
    gate_a = restart_a.gate()
    assert gate_a["healthy"] is True and gate_a["reaped"] == []
    assert unit_show(lab, host, unit_b) == before_b
    assert {pid: gpus for pid, gpus in gpu_claims(lab, host).items() if unit_of(lab, host, pid) == unit_b} == claims_b
    assert gpus_of(lab, host, unit_a) == {0, 1}

    # B's gate checks GPUs 2 and 3 only: A holding 0 and 1 does not block it.
    restart_b = run_play(lab, tmp_path, host, "service_restart", B, "restart-b")
    assert restart_b.ok, restart_b.output
    assert restart_b.gate()["healthy"] is True
    assert gpus_of(lab, host, unit_b) == {2, 3}
    assert unit_show(lab, host, unit_a)["MainPID"] == str(gate_a["main_pid"])
