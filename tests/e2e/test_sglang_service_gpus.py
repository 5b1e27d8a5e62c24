"""Two services on one host with 4 GPUs: each engine is placed on its own GPUs, and a restart of one never touches
the other (its processes, its memory), nor does one's gate wait on the other's GPUs.

A GPU list that cannot work (a GPU the host lacks, one named twice, a negative index, a GPU another unit holds) is
refused in preflight against one serving engine on a 2-GPU host: its files and its process stay as they were."""

from __future__ import annotations

import pytest
from labutil import (
    SERVICE_LAB_VARS,
    alive,
    fingerprint,
    gpu_claims,
    install_unit,
    run_play,
    sh,
    unit_of,
    unit_show,
    wait_until,
)

pytestmark = pytest.mark.lab

A = {"sglang_service_name": "sglang-gpa", "sglang_service_port": 30000, "sglang_service_gpus": ["0", "1"]}
B = {"sglang_service_name": "sglang-gpb", "sglang_service_port": 30001, "sglang_service_gpus": ["2", "3"]}
UNIT_A, UNIT_B = "sglang-gpa.service", "sglang-gpb.service"
CUDA = "/usr/local/cuda"
NVCC = f"{CUDA}/bin/nvcc"


def gpus_of(lab, host: str, unit: str) -> set:
    """The GPUs the unit's processes hold simulated memory on."""
    return {gpu for pid, gpus in gpu_claims(lab, host).items() if unit_of(lab, host, pid) == unit for gpu in gpus}


@pytest.fixture
def host4(lab_gpus4):
    lab_gpus4.reset()
    yield lab_gpus4
    lab_gpus4.reset()


def test_two_services_stay_on_their_own_gpus_and_restart_independently(host4, tmp_path):
    """A names its GPUs by index, B by UUID: B's engine still gets indexes in CUDA_VISIBLE_DEVICES, so SGLang's custom
    all-reduce (which parses the list with int()) sets up instead of falling back to NCCL. The lab has no CUDA
    toolkit until a stand-in nvcc appears in /usr/local/cuda for B: A's preflight warns, B's unit exports it."""
    lab = host4
    try:
        check_two_services(lab, lab.hosts[0], tmp_path)
    finally:
        lab.exec(lab.hosts[0], f"rm -rf {CUDA}")


def check_two_services(lab, host, tmp_path) -> None:
    assert SERVICE_LAB_VARS["sglang_service_tp_size"] == 2
    uuids = sh(lab, host, "nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
    b = {**B, "sglang_service_gpus": uuids[2:4]}
    for label, service in (("a", A), ("b", b)):
        run = run_play(lab, tmp_path, host, "service_role", service, f"up-{label}")
        assert run.ok, run.output
        assert run.gate()["healthy"] is True
        assert set(run.gate()["gpu"]["memory_mib"]) >= ({"0", "1"} if label == "a" else {"2", "3"})
        assert ("WARNING: no nvcc on" in run.output) is (label == "a"), run.output
        if label == "a":
            sh(lab, host, f"mkdir -p {CUDA}/bin && printf '#!/bin/sh\\n' > {NVCC} && chmod +x {NVCC}")
    unit_a, unit_b = UNIT_A, UNIT_B
    environment = {unit: sh(lab, host, f"systemctl show -P Environment {unit}") for unit in (unit_a, unit_b)}
    assert "CUDA_HOME" not in environment[unit_a]
    assert f"CUDA_HOME={CUDA}" in environment[unit_b].split() and f"{CUDA}/bin:" in environment[unit_b]
    assert gpus_of(lab, host, unit_a) == {0, 1}
    assert gpus_of(lab, host, unit_b) == {2, 3}
    main_b = unit_show(lab, host, unit_b)["MainPID"]
    environ = sh(lab, host, f"tr '\\0' '\\n' < /proc/{main_b}/environ").splitlines()
    assert "CUDA_VISIBLE_DEVICES=2,3" in environ and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in environ, environ
    assert f"gpu-free --gpus {uuids[2]},{uuids[3]} " in sh(lab, host, f"systemctl cat {unit_b}")
    assert "Setup Custom allreduce failed" not in sh(lab, host, f"journalctl -u {unit_b} --no-pager")

    before_b = unit_show(lab, host, unit_b)
    claims_b = {pid: gpus for pid, gpus in gpu_claims(lab, host).items() if unit_of(lab, host, pid) == unit_b}
    restart_a = run_play(lab, tmp_path, host, "service_restart", A, "restart-a")
    assert restart_a.ok, restart_a.output
    gate_a = restart_a.gate()
    assert gate_a["healthy"] is True and gate_a["gpu"]["reaped"] == []
    assert unit_show(lab, host, unit_b) == before_b
    assert {pid: gpus for pid, gpus in gpu_claims(lab, host).items() if unit_of(lab, host, pid) == unit_b} == claims_b
    assert gpus_of(lab, host, unit_a) == {0, 1}

    # B's gate checks GPUs 2 and 3 only: A holding 0 and 1 does not block it.
    restart_b = run_play(lab, tmp_path, host, "service_restart", b, "restart-b")
    assert restart_b.ok, restart_b.output
    assert restart_b.gate()["healthy"] is True
    assert gpus_of(lab, host, unit_b) == {2, 3}
    assert unit_show(lab, host, unit_a)["MainPID"] == str(gate_a["service"]["main_pid"])


# One engine at TP 1 on GPU 0 of a 2-GPU host, with a drop-in of its own; another unit holds GPU 1.
SERVING = {"sglang_service_name": "sglang-gpl", "sglang_service_tp_size": 1, "sglang_service_gpus": [0]}
SERVING_UNIT = "sglang-gpl.service"
WATCHED = "/etc/systemd/system /etc/llmops /usr/local/libexec/llmops /usr/local/lib/llmops /var/lib/llmops"
HOLDER_UNIT = """\
[Unit]
Description=Another team's job on GPU 1

[Service]
ExecStart=/bin/bash -c 'exec -a team-job /usr/bin/python3 /usr/local/bin/simgpu-claim --hold --gpu 1 --mib 4001'
"""
DROPIN = f"/etc/systemd/system/{SERVING_UNIT}.d/10-site.conf"


def engine_state(lab, host: str) -> dict:
    text = sh(lab, host, f"systemctl show {SERVING_UNIT} -p ActiveState,MainPID,ExecMainStartTimestampMonotonic")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def serving(lab, tmp_path_factory):
    """(host, holder pid): the engine serving on GPU 0, t-gpuhold.service holding 4001 MiB of GPU 1."""
    lab.reset()
    host = lab.hosts[0]
    tmp_path = tmp_path_factory.mktemp("serving")
    install_unit(lab, host, "t-gpuhold.service", HOLDER_UNIT)
    sh(lab, host, "systemctl start t-gpuhold.service")
    holder = int(sh(lab, host, "systemctl show -P MainPID t-gpuhold.service"))
    wait_until(lambda: holder in gpu_claims(lab, host), 20, "the other unit to hold GPU 1")
    sh(lab, host, f"mkdir -p {DROPIN.rsplit('/', 1)[0]} && printf '[Service]\\nEnvironment=SITE=lab\\n' > {DROPIN}")
    up = run_play(lab, tmp_path, host, "service_role", SERVING, "up")
    assert up.ok, up.output
    # Its own engine holds GPU 0 now: that is no reason to refuse the same list again.
    again = run_play(lab, tmp_path, host, "service_role", SERVING, "again")
    assert again.ok, again.output
    yield host, holder
    lab.reset()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            {"sglang_service_gpus": [7]},
            "sglang_service_gpus must name GPUs this host has: 7 is not one of them (this host has 0 (GPU-",
        ),
        (
            {"sglang_service_gpus": [0, 0], "sglang_service_tp_size": 2},
            "sglang_service_gpus must name each GPU once: 0 is named 2 times (GPU 0, GPU-",
        ),
        (
            {"sglang_service_gpus": [-1]},
            "sglang_service_gpus must be a list of GPU indices (integers >= 0) or UUIDs (GPU-... or MIG-...); empty "
            "means 0 .. tp_size-1; got [-1]",
        ),
        (
            {"sglang_service_gpus": [1]},
            "sglang_service_gpus must name GPUs that no process outside sglang-gpl.service holds: GPU 1 (GPU-",
        ),
    ],
    ids=["absent-7", "twice-0", "negative", "held-by-another-unit"],
)
def test_a_gpu_list_that_cannot_work_is_refused_before_any_change(lab, serving, tmp_path, bad, message):
    host, holder = serving
    files, engine = fingerprint(lab, host, WATCHED), engine_state(lab, host)
    assert engine["ActiveState"] == "active" and DROPIN in files
    run = run_play(lab, tmp_path, host, "service_role", {**SERVING, **bad}, "bad")
    assert not run.ok
    assert message in run.output, run.output
    if bad["sglang_service_gpus"] == [1]:
        assert f"holds 4001 MiB of pid {holder} 'team-job' of the active unit t-gpuhold.service" in run.output, (
            run.output
        )
    assert fingerprint(lab, host, WATCHED) == files
    assert engine_state(lab, host) == engine
    assert alive(lab, host, holder)
