"""Shared pieces of the simgpu tests: a private build, a temporary state directory, holders, probes, CLIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SIMGPU = Path(__file__).resolve().parents[1] / "simgpu"
CLAIM_TOOL = SIMGPU / "simgpu_claim.py"
MIB = 1024 * 1024
TOTAL_MIB = 81559
GPU_NAME = "NVIDIA H100 80GB HBM3"
UUIDS = ["GPU-3b1c0f1e-0000-4000-8000-000000000000", "GPU-3b1c0f1e-0000-4000-8000-000000000001"]
NOT_AVAILABLE = 0xFFFFFFFF

# Runs under real nvidia-ml-py in a child process; answers one JSON line per "snapshot" line on stdin,
# so one initialised NVML session can watch the state change.
PYNVML_PROBE = r"""
import json, sys
import pynvml as n

def procs(entries):
    return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in entries]

def snapshot():
    gpus = []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        m, m2 = n.nvmlDeviceGetMemoryInfo(h), n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        u = n.nvmlDeviceGetUtilizationRates(h)
        uuid = n.nvmlDeviceGetUUID(h)
        gpus.append({
            "index": n.nvmlDeviceGetIndex(h), "name": n.nvmlDeviceGetName(h), "uuid": uuid,
            "index_by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid)),
            "memory": [m.total, m.free, m.used],
            "memory_v2": [m2.version, m2.total, m2.reserved, m2.free, m2.used],
            "compute": procs(n.nvmlDeviceGetComputeRunningProcesses(h)),
            "compute_v2": procs(n.nvmlDeviceGetComputeRunningProcesses_v2(h)),
            "graphics": len(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
            "utilization": [u.gpu, u.memory],
        })
    return {"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion_v2(), "gpus": gpus}

n.nvmlInit()
for line in sys.stdin:
    print(json.dumps(snapshot()), flush=True)
n.nvmlShutdown()
"""


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    """Build into a private directory so the check does not race the lab's own build."""
    build_dir = tmp_path_factory.mktemp("simgpu-build")
    done = subprocess.run(
        ["make", "-C", str(SIMGPU), f"BUILD={build_dir}"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return build_dir, done.stdout + done.stderr


@pytest.fixture
def build_dir(build):
    return build[0]


@pytest.fixture
def state_dir(tmp_path):
    state = tmp_path / "simgpu"
    (state / "claims").mkdir(parents=True)
    lines = ["# index\tuuid\ttotal_mib\tname", ""]
    lines += [f"{index}\t{uuid}\t{TOTAL_MIB}\t{GPU_NAME}" for index, uuid in enumerate(UUIDS)]
    (state / "gpus").write_text("\n".join(lines) + "\n")
    # No driver reservation: the claim tests read used memory as claims + the 1 MiB of an idle device. The
    # reservation (default and per lab) has tests of its own, which write or remove this file.
    (state / "reserved_mib").write_text("0\n")
    return state


@pytest.fixture
def env(build_dir, state_dir):
    # Release lag 0: memory is free as soon as its holder is gone, unless a test sets a lag itself.
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(build_dir),
        "SIMGPU_STATE_DIR": str(state_dir),
        "SIMGPU_RELEASE_LAG_MS": "0",
    }


@pytest.fixture
def spawn():
    """Start `sleep` children; kill and reap whatever a test leaves running."""
    children = []

    def start(program="sleep"):
        child = subprocess.Popen([program, "300"])
        children.append(child)
        return child

    yield start
    for child in children:
        if child.returncode is None:
            child.kill()
            child.wait()


def write_claim(state_dir, gpu, pid, mib):
    (state_dir / "claims" / f"gpu{gpu}.pid{pid}").write_text(f"{mib}\n")


def process_state(pid):
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0]


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def dead_pid():
    """A PID that existed and is gone (reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


class Probe:
    """One long-lived nvidia-ml-py session against the simulated library."""

    def __init__(self, env):
        self.process = subprocess.Popen(
            [sys.executable, "-c", PYNVML_PROBE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def snapshot(self):
        self.process.stdin.write("snapshot\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the pynvml probe exited"
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


@pytest.fixture
def probe(env):
    session = Probe(env)
    yield session
    session.close()


def smi(build_dir, env, *args):
    return subprocess.run([str(build_dir / "nvidia-smi"), *args], env=env, capture_output=True, text=True, check=False)


def claim_tool(env, *args):
    return subprocess.run(
        [sys.executable, str(CLAIM_TOOL), *args], env=env, capture_output=True, text=True, check=False
    )
