"""What the simulated driver does beyond counting live claims: release lag, memory nobody can free, GPU reset, MIG.

The Python reading of the state (simgpu_state.py), libnvidia-ml.so.1 (through real nvidia-ml-py), nvidia-smi and
simgpu-claim are checked against each other on the same state directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from simgpu_support import CLAIM_TOOL, MIB, NOT_AVAILABLE, SIMGPU, TOTAL_MIB, UUIDS, claim_tool, smi, wait_for

sys.path.insert(0, str(SIMGPU))
import simgpu_state

# One pynvml session per call: memory, processes and the MIG view of every GPU.
PYNVML_VIEW = r"""
import json
import pynvml as n

def attempt(call):
    try:
        return call()
    except n.NVMLError as exc:
        return type(exc).__name__

def procs(h):
    return [[p.pid, p.usedGpuMemory // 2**20, p.gpuInstanceId, p.computeInstanceId]
            for p in n.nvmlDeviceGetComputeRunningProcesses(h)]

def device(h):
    return {
        "name": n.nvmlDeviceGetName(h), "uuid": n.nvmlDeviceGetUUID(h), "index": n.nvmlDeviceGetIndex(h),
        "used": attempt(lambda: n.nvmlDeviceGetMemoryInfo(h).used // 2**20),
        "total": attempt(lambda: n.nvmlDeviceGetMemoryInfo(h).total // 2**20),
        "procs": attempt(lambda: procs(h)),
        "util": attempt(lambda: n.nvmlDeviceGetUtilizationRates(h).gpu),
        "is_mig": n.nvmlDeviceIsMigDeviceHandle(h).value,
    }

n.nvmlInit()
gpus = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    entry = device(h)
    entry["mig_mode"] = n.nvmlDeviceGetMigMode(h)
    entry["max_mig"] = n.nvmlDeviceGetMaxMigDeviceCount(h)
    entry["mig"] = []
    for k in range(entry["max_mig"]):
        m = attempt(lambda: n.nvmlDeviceGetMigDeviceHandleByIndex(h, k))
        if isinstance(m, str):
            entry["mig"].append(m)
            continue
        mig = device(m)
        mig["gi"], mig["ci"] = n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m)
        parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        mig["parent_uuid"] = n.nvmlDeviceGetUUID(parent)
        mig["by_uuid_is_mig"] = n.nvmlDeviceIsMigDeviceHandle(n.nvmlDeviceGetHandleByUUID(mig["uuid"])).value
        entry["mig"].append(mig)
    entry["gpu_instance_of_gpu"] = attempt(lambda: n.nvmlDeviceGetGpuInstanceId(h))
    gpus.append(entry)
n.nvmlShutdown()
print(json.dumps(gpus))
"""


def pynvml_view(env, user=None):
    preexec = (lambda: os.setuid(user)) if user is not None else None
    done = subprocess.run(
        [sys.executable, "-c", PYNVML_VIEW], env=env, capture_output=True, text=True, check=False, preexec_fn=preexec
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def used_and_listed(env, state_dir):
    """GPU 0 as pynvml, nvidia-smi and simgpu_state each see it: (used MiB, listed PIDs)."""
    build_dir = Path(env["LD_LIBRARY_PATH"])
    gpu0 = pynvml_view(env)[0]
    used = smi(build_dir, env, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0")
    apps = smi(build_dir, env, "--query-compute-apps=pid", "--format=csv,noheader", "-i", "0")
    return {
        "pynvml": (gpu0["used"], tuple(sorted(p[0] for p in gpu0["procs"]))),
        "nvidia-smi": (int(used.stdout), tuple(sorted(int(x) for x in apps.stdout.split()))),
        "simgpu_state": (simgpu_state.used_mib(state_dir, 0), tuple(sorted(simgpu_state.listed_pids(state_dir, 0)))),
    }


def agree(env, state_dir):
    views = used_and_listed(env, state_dir)
    assert len(set(views.values())) == 1, views
    used, pids = views["pynvml"]
    return used, list(pids)


@pytest.fixture(autouse=True)
def same_lag_here(env, monkeypatch):
    """This process reads the state with the same release lag as the tools it starts."""
    monkeypatch.setenv("SIMGPU_RELEASE_LAG_MS", env["SIMGPU_RELEASE_LAG_MS"])


def settles_to(env, state_dir, expected):
    """True once every reader sees `expected` (views taken one after another may straddle the end of a lag)."""
    return wait_for(lambda: set(used_and_listed(env, state_dir).values()) == {expected}, timeout=10)


@pytest.fixture
def lag_env(env, monkeypatch):
    """A release lag long enough that three readers in a row all fall inside it."""
    monkeypatch.setenv("SIMGPU_RELEASE_LAG_MS", "2500")
    return {**env, "SIMGPU_RELEASE_LAG_MS": "2500"}


def start_holder(env, *extra, gpu="0", mib="1000"):
    holder = subprocess.Popen(
        [sys.executable, str(CLAIM_TOOL), *extra, "--gpu", gpu, "--mib", mib],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = holder.stdout.readline()
    assert line, "the holder exited before claiming"
    return holder, line


# -- release lag ---------------------------------------------------------------------------------------------
def test_memory_of_a_killed_holder_stays_used_for_the_release_lag(lag_env, state_dir):
    holder, _line = start_holder(lag_env, "--hold")
    try:
        assert agree(lag_env, state_dir) == (1001, [holder.pid])
        holder.kill()
        holder.wait()
        killed_at = time.monotonic()
        # The PID is gone: it is no longer listed, but the driver has not released its memory yet.
        assert agree(lag_env, state_dir) == (1001, [])
        assert settles_to(lag_env, state_dir, (1, ()))
        assert time.monotonic() - killed_at >= 2.5
    finally:
        holder.kill()
        holder.wait()


def test_release_lag_setting_in_the_state_dir(env, state_dir, monkeypatch):
    monkeypatch.delenv("SIMGPU_RELEASE_LAG_MS")
    no_env = {k: v for k, v in env.items() if k != "SIMGPU_RELEASE_LAG_MS"}
    (state_dir / "release_lag_ms").write_text("5000\n")
    holder, _line = start_holder(no_env, "--hold")
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=10) == 0
    used = smi(Path(env["LD_LIBRARY_PATH"]), no_env, "--query-gpu=memory.used", "--format=csv,noheader,nounits")
    assert used.stdout.splitlines()[0] == "1001"
    (state_dir / "release_lag_ms").write_text("0\n")
    used = smi(Path(env["LD_LIBRARY_PATH"]), no_env, "--query-gpu=memory.used", "--format=csv,noheader,nounits")
    assert used.stdout.splitlines()[0] == "1"
    assert simgpu_state.used_mib(state_dir, 0) == 1


def test_the_default_release_lag_is_a_few_hundred_milliseconds():
    assert 300 <= simgpu_state.DEFAULT_RELEASE_LAG_MS <= 500
    assert "#define SIM_DEFAULT_RELEASE_LAG_MS 400" in (SIMGPU / "state.h").read_text()
    assert simgpu_state.DEFAULT_RELEASE_LAG_MS == 400


def test_an_exit_recorded_by_its_holder_starts_the_lag_then(lag_env, state_dir):
    holder, _line = start_holder(lag_env, "--hold")
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=10) == 0
    marker = state_dir / "claims" / f"gpu0.pid{holder.pid}.exit"
    recorded = float(marker.read_text())
    assert abs(recorded - time.time()) < 2
    # Back-date the exit: the lag is over, whoever looks now.
    marker.write_text(f"{recorded - 10:.3f}\n")
    assert agree(lag_env, state_dir) == (1, [])


# -- memory nobody can free -----------------------------------------------------------------------------------
def test_a_zombie_holds_its_memory_and_is_listed_until_its_parent_goes(lag_env, state_dir):
    parent, line = start_holder(lag_env, "--zombie", mib="3000")
    try:
        zombie = int(line.split()[2])
        assert line == f"zombie PID {zombie} holds 3000 MiB on GPU 0; its parent PID {parent.pid} never reaps it\n"
        assert simgpu_state.process_state(zombie) == "Z"
        assert agree(lag_env, state_dir) == (3001, [zombie])
        os.kill(zombie, signal.SIGKILL)  # nothing to kill: a zombie has already exited
        time.sleep(0.2)
        assert agree(lag_env, state_dir) == (3001, [zombie])
        assert claim_tool(lag_env, "--reset-gpu", "0").returncode == 1
        parent.send_signal(signal.SIGTERM)  # its parent ends; init reaps the zombie; the lag runs from then
        parent.wait(timeout=10)
        assert wait_for(lambda: simgpu_state.process_state(zombie) is None)
        assert settles_to(lag_env, state_dir, (1, ()))
    finally:
        parent.kill()
        parent.wait()


def test_a_stuck_claim_outlives_its_pid_until_a_gpu_reset(env, state_dir, spawn):
    done = claim_tool(env, "--stuck", "--gpu", "0", "--mib", "2000")
    assert done.returncode == 0, done.stderr
    gone = int(done.stdout.split("held by PID ")[1].split(",")[0])
    assert "only `simgpu-claim --reset-gpu 0` frees it" in done.stdout
    assert simgpu_state.process_state(gone) is None
    # With a release lag of 0 any other claim of a gone PID would be free by now; a stuck one stays.
    assert agree(env, state_dir) == (2001, [])
    assert claim_tool(env, "--gc").stdout == ""
    busy = spawn()
    assert claim_tool(env, "--gpu", "0", "--mib", "10", "--pid", str(busy.pid)).returncode == 0
    refused = claim_tool(env, "--reset-gpu", "0")
    assert refused.returncode == 1 and f"GPU 0 is in use by process(es) {busy.pid}" in refused.stderr
    assert agree(env, state_dir) == (2011, [busy.pid])
    busy.kill()
    busy.wait()
    reset = claim_tool(env, "--reset-gpu", "0")
    assert reset.returncode == 0 and reset.stdout == "GPU 0 reset; freed 2 claim(s)\n"
    assert agree(env, state_dir) == (1, [])


def test_a_claim_marked_stuck_for_a_live_process_stays_after_it_exits(env, state_dir, spawn):
    holder = spawn()
    assert claim_tool(env, "--gpu", "1", "--mib", "500", "--pid", str(holder.pid), "--stuck").returncode == 0
    holder.kill()
    holder.wait()
    assert simgpu_state.used_mib(state_dir, 1) == 501


# -- MIG --------------------------------------------------------------------------------------------------------
def test_mig_devices_through_pynvml(env, state_dir, spawn):
    enabled = claim_tool(env, "--mig", "0:2")
    assert enabled.returncode == 0, enabled.stderr
    assert enabled.stdout.count("3g.40gb") == 2
    devices = simgpu_state.read_gpus(state_dir)[0].mig
    holder = spawn()
    assert claim_tool(env, "--gpu", "0:1", "--mib", "5000", "--pid", str(holder.pid)).returncode == 0
    gpu0, gpu1 = pynvml_view(env)
    assert (gpu0["mig_mode"], gpu0["max_mig"], gpu1["mig_mode"], gpu1["max_mig"]) == ([1, 1], 7, [0, 0], 0)
    assert gpu0["is_mig"] == 0 and gpu0["gpu_instance_of_gpu"] == "NVMLError_InvalidArgument"
    first, second = gpu0["mig"][:2]
    assert gpu0["mig"][2:] == ["NVMLError_NotFound"] * 5
    assert first["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb" and first["uuid"] == devices[0].uuid
    assert first["uuid"].startswith("MIG-") and (first["index"], second["index"]) == (0, 1)
    assert (first["is_mig"], first["by_uuid_is_mig"], first["parent_uuid"]) == (1, 1, UUIDS[0])
    assert (first["gi"], first["ci"], second["gi"], second["ci"]) == (1, 0, 2, 0)
    assert (first["total"], first["used"], first["procs"]) == (40320, 1, [])
    assert (second["used"], second["procs"]) == (5001, [[holder.pid, 5000, 2, 0]])
    # The GPU handle aggregates its MIG devices (root may ask); utilization is not reported in MIG mode.
    assert (gpu0["total"], gpu0["used"], gpu0["procs"]) == (TOTAL_MIB, 5003, [[holder.pid, 5000, 2, 0]])
    assert gpu0["util"] == first["util"] == "NVMLError_NotSupported"
    assert gpu1["procs"] == [] and gpu1["util"] == 0


# The C ABI as an unprivileged user (the system python3: the test venv is not readable by nobody).
UNPRIVILEGED_PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
gpu, mig, memory, count = ctypes.c_void_p(), ctypes.c_void_p(), Memory(), ctypes.c_uint(0)
assert lib.nvmlInit_v2() == 0
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(gpu)) == 0
assert lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0, ctypes.byref(mig)) == 0
result = {"gpu_memory": lib.nvmlDeviceGetMemoryInfo(gpu, ctypes.byref(memory)),
          "gpu_procs": lib.nvmlDeviceGetComputeRunningProcesses_v3(gpu, ctypes.byref(count), None),
          "mig_memory": lib.nvmlDeviceGetMemoryInfo(mig, ctypes.byref(memory)), "mig_total": memory.total >> 20,
          "mig_procs": lib.nvmlDeviceGetComputeRunningProcesses_v3(mig, ctypes.byref(count), None)}
print(json.dumps(result))
"""


def test_mig_aggregate_needs_privileges(env, state_dir):
    assert claim_tool(env, "--mig", "0:3g.40gb,2g.20gb,1g.10gb").returncode == 0
    world = Path(tempfile.mkdtemp(prefix="simgpu-world-"))
    try:
        os.chmod(world, 0o755)
        for name in ("gpus", "mig"):
            (world / name).write_text((state_dir / name).read_text())
        lib = world / "libnvidia-ml.so.1"
        lib.write_bytes((Path(env["LD_LIBRARY_PATH"]) / "libnvidia-ml.so.1").read_bytes())
        done = subprocess.run(
            ["/usr/bin/python3", "-c", UNPRIVILEGED_PROBE, str(lib)],
            env={"SIMGPU_STATE_DIR": str(world), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
            preexec_fn=lambda: os.setuid(65534),
        )
        assert done.returncode == 0, done.stderr
        # NVML_ERROR_NO_PERMISSION (4) for the aggregate; a MIG device answers for itself.
        assert json.loads(done.stdout) == {
            "gpu_memory": 4,
            "gpu_procs": 4,
            "mig_memory": 0,
            "mig_total": 40320,
            "mig_procs": 0,
        }
    finally:
        subprocess.run(["rm", "-rf", str(world)], check=True)


def test_nvidia_smi_lists_mig_devices_like_the_real_one(build_dir, env, state_dir):
    assert claim_tool(env, "--mig", "1:2").returncode == 0
    devices = simgpu_state.read_gpus(state_dir)[1].mig
    listing = smi(build_dir, env, "-L").stdout.splitlines()
    assert listing[1:] == [
        f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {UUIDS[1]})",
        f"  MIG 3g.40gb     Device  0: (UUID: {devices[0].uuid})",
        f"  MIG 3g.40gb     Device  1: (UUID: {devices[1].uuid})",
    ]
    util = smi(build_dir, env, "--query-gpu=index,utilization.gpu", "--format=csv,noheader")
    assert util.stdout.splitlines() == ["0, 0 %", "1, [N/A]"]
    table = smi(build_dir, env).stdout
    assert "N/A" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mig", "0:4"], "accepted counts are 1, 2, 3 and 7"),
        (["--mig", "0:3g.40gb,3g.40gb,1g.10gb"], "need 7 compute and 9 memory slices"),
        (["--mig", "0:5g.50gb"], "unknown 5g.50gb"),
        (["--mig", "9:2"], "no GPU 9"),
    ],
)
def test_bad_mig_settings_are_refused(env, state_dir, args, message):
    done = claim_tool(env, *args)
    assert done.returncode == 1 and message in done.stderr
    assert not (state_dir / "mig").exists()


def test_mig_changes_need_an_idle_gpu_and_claims_go_to_mig_devices(env, state_dir, spawn):
    holder = spawn()
    assert claim_tool(env, "--gpu", "0", "--mib", "100", "--pid", str(holder.pid)).returncode == 0
    busy = claim_tool(env, "--mig", "0:2")
    assert busy.returncode == 1 and "needs an idle GPU" in busy.stderr
    holder.kill()
    holder.wait()
    assert claim_tool(env, "--mig", "0:7").returncode == 0
    parent = claim_tool(env, "--gpu", "0", "--mib", "1")
    assert parent.returncode == 1 and "GPU 0 is in MIG mode; claim on one of its MIG devices: 0:0" in parent.stderr
    mig_uuid = simgpu_state.read_gpus(state_dir)[0].mig[6].uuid
    assert claim_tool(env, "--gpu", mig_uuid, "--mib", "9983").returncode == 0
    full = claim_tool(env, "--gpu", "0:6", "--mib", "9984")
    assert full.returncode == 1 and "out of memory" in full.stderr
    assert claim_tool(env, "--mig-off", "0").returncode == 1  # our own claim is still on it
    assert claim_tool(env, "--gpu", "0:6", "--release").returncode == 0
    assert claim_tool(env, "--mig-off", "0").returncode == 0
    assert simgpu_state.read_gpus(state_dir)[0].mig == ()


def test_processes_outside_mig_keep_unavailable_instance_ids(env, state_dir, spawn):
    holder = spawn()
    assert claim_tool(env, "--gpu", "1", "--mib", "7", "--pid", str(holder.pid)).returncode == 0
    assert pynvml_view(env)[1]["procs"] == [[holder.pid, 7, NOT_AVAILABLE, NOT_AVAILABLE]]
    assert MIB == 2**20
