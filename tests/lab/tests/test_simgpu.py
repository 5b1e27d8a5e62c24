"""The simulated GPU: real nvidia-ml-py, the nvidia-smi stand-in and simgpu-claim against a temporary state dir."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from simgpu_support import (
    CLAIM_TOOL,
    GPU_NAME,
    MIB,
    NOT_AVAILABLE,
    SIMGPU,
    TOTAL_MIB,
    UUIDS,
    claim_tool,
    dead_pid,
    process_state,
    smi,
    wait_for,
    write_claim,
)

if str(SIMGPU) not in sys.path:
    sys.path.insert(0, str(SIMGPU))
import simgpu_state

PYNVML_ERRORS = r"""
import json, sys
import pynvml as n

def error_of(call):
    try:
        call()
    except n.NVMLError as exc:
        return [type(exc).__name__, str(exc)]
    return None

result = {"before_init": error_of(n.nvmlDeviceGetCount)}
n.nvmlInit()
result["unknown_uuid"] = error_of(lambda: n.nvmlDeviceGetHandleByUUID("GPU-00000000-dead-beef-0000-000000000000"))
result["bad_index"] = error_of(lambda: n.nvmlDeviceGetHandleByIndex(2))
n.nvmlShutdown()
result["after_shutdown"] = error_of(n.nvmlDeviceGetCount)
result["second_shutdown"] = error_of(n.nvmlShutdown)
print(json.dumps(result))
"""

# Build


def test_build_is_warning_free_and_incremental(build, build_dir):
    output = build[1]
    assert "warning" not in output.lower()
    assert "-Wall -Wextra -Werror -fPIC" in output
    up_to_date = subprocess.run(["make", "-q", "-C", str(SIMGPU), f"BUILD={build_dir}"], check=False)
    assert up_to_date.returncode == 0
    # What a change to state.c would rebuild: the library and the tool linked to it, not the tool's objects.
    dry_run = subprocess.run(
        ["make", "-n", "-W", "state.c", "-C", str(SIMGPU), f"BUILD={build_dir}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "libnvidia-ml.so.1" in dry_run
    assert "state.c" in dry_run and "smi_query.c" not in dry_run and "nvidia-smi.c" not in dry_run


def test_library_soname_exports_and_smi_linkage(build_dir):
    library = subprocess.run(
        ["readelf", "-d", str(build_dir / "libnvidia-ml.so.1")], capture_output=True, text=True, check=True
    ).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in library
    smi_binary = subprocess.run(
        ["readelf", "-d", str(build_dir / "nvidia-smi")], capture_output=True, text=True, check=True
    ).stdout
    assert "Shared library: [libnvidia-ml.so.1]" in smi_binary
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", str(build_dir / "libnvidia-ml.so.1")], capture_output=True, text=True, check=True
    ).stdout.split()
    for symbol in [
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetUtilizationRates",
    ]:
        assert symbol in exported
    assert not [name for name in exported if name.startswith("sim_")], "internal helpers must stay hidden"


# Real pynvml


def test_pynvml_sees_the_gpu_list(probe):
    snapshot = probe.snapshot()
    assert snapshot["driver"] == "550.54.15"
    assert snapshot["cuda"] == 12040
    assert [(gpu["index"], gpu["name"], gpu["uuid"]) for gpu in snapshot["gpus"]] == [
        (0, GPU_NAME, UUIDS[0]),
        (1, GPU_NAME, UUIDS[1]),
    ]
    assert [gpu["index_by_uuid"] for gpu in snapshot["gpus"]] == [0, 1]


def test_pynvml_memory_counts_live_claims_plus_reservation(probe, state_dir, spawn):
    (state_dir / "reserved_mib").unlink()  # the default: an idle H100 80GB HBM3's reservation
    holder = spawn()
    write_claim(state_dir, 1, holder.pid, 1000)
    write_claim(state_dir, 0, dead_pid(), 5000)  # stale: its process is gone
    gpu0, gpu1 = probe.snapshot()["gpus"]
    total, reserved = TOTAL_MIB * MIB, simgpu_state.DEFAULT_RESERVED_MIB * MIB
    # v1's used holds the driver's reservation; v2 reports it apart (total = reserved + used + free).
    assert gpu0["memory"] == [total, total - reserved - MIB, reserved + MIB]
    assert gpu0["memory_v2"] == [0x02000028, total, reserved, total - reserved - MIB, MIB]
    used = 1001 * MIB
    assert gpu1["memory"] == [total, total - reserved - used, reserved + used]
    assert gpu1["memory_v2"] == [0x02000028, total, reserved, total - reserved - used, used]
    assert gpu0["compute"] == []


@pytest.mark.parametrize("reserved_mib", [600, 1536])
def test_the_reservation_is_set_per_lab_and_nvidia_smi_leaves_it_out(
    probe, state_dir, build_dir, env, spawn, reserved_mib
):
    (state_dir / "reserved_mib").write_text(f"{reserved_mib}\n")
    holder = spawn()
    write_claim(state_dir, 1, holder.pid, 2048)
    gpu0, gpu1 = probe.snapshot()["gpus"]
    total, reserved = TOTAL_MIB * MIB, reserved_mib * MIB
    assert gpu0["memory"] == [total, total - reserved - MIB, reserved + MIB]
    assert gpu1["memory_v2"] == [0x02000028, total, reserved, total - reserved - 2049 * MIB, 2049 * MIB]
    query = smi(build_dir, env, "--query-gpu=index,memory.used,memory.reserved,memory.free", "--format=csv,noheader")
    free = TOTAL_MIB - reserved_mib
    assert query.stdout.splitlines() == [
        f"0, 1 MiB, {reserved_mib} MiB, {free - 1} MiB",
        f"1, 2049 MiB, {reserved_mib} MiB, {free - 2049} MiB",
    ]
    assert simgpu_state.used_mib(state_dir, 0) == reserved_mib + 1


def test_pynvml_processes_follow_the_process_lifetime(probe, state_dir, spawn):
    first, second = spawn(), spawn()
    write_claim(state_dir, 0, first.pid, 1000)
    write_claim(state_dir, 0, second.pid, 250)
    gpu0, gpu1 = probe.snapshot()["gpus"]
    expected = sorted(
        [[first.pid, 1000 * MIB, NOT_AVAILABLE, NOT_AVAILABLE], [second.pid, 250 * MIB] + [NOT_AVAILABLE] * 2]
    )
    assert gpu0["compute"] == expected
    assert gpu0["compute_v2"] == expected
    assert gpu0["graphics"] == 0
    assert gpu0["utilization"] == [37, 21]
    assert gpu1["compute"] == [] and gpu1["utilization"] == [0, 0]

    # Killed but not yet waited for: a zombie no longer holds GPU memory.
    first.send_signal(signal.SIGKILL)
    assert wait_for(lambda: process_state(first.pid) == "Z")
    gpu0 = probe.snapshot()["gpus"][0]
    assert gpu0["compute"] == [[second.pid, 250 * MIB, NOT_AVAILABLE, NOT_AVAILABLE]]
    assert gpu0["memory"][2] == 251 * MIB

    first.wait()
    second.kill()
    second.wait()
    gpu0 = probe.snapshot()["gpus"][0]
    assert gpu0["compute"] == []
    assert gpu0["memory"][2] == MIB
    assert gpu0["utilization"] == [0, 0]


def test_comm_with_parentheses_and_spaces_is_parsed(probe, state_dir, spawn, tmp_path):
    tricky = tmp_path / "x) Z (y"  # a naive /proc/PID/stat parser would read state "Z"
    tricky.symlink_to(shutil.which("sleep"))
    holder = spawn(str(tricky))
    # The kernel closes the exec status pipe a moment before it renames the task.
    assert wait_for(lambda: Path(f"/proc/{holder.pid}/comm").read_text() == "x) Z (y\n")
    write_claim(state_dir, 0, holder.pid, 10)
    assert probe.snapshot()["gpus"][0]["compute"] == [[holder.pid, 10 * MIB, NOT_AVAILABLE, NOT_AVAILABLE]]


def test_pynvml_errors(env):
    done = subprocess.run([sys.executable, "-c", PYNVML_ERRORS], env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    assert result["before_init"] == ["NVMLError_Uninitialized", "Uninitialized"]
    assert result["unknown_uuid"] == ["NVMLError_NotFound", "Not Found"]
    assert result["bad_index"] == ["NVMLError_InvalidArgument", "Invalid Argument"]
    # The library itself (already loaded, refcount back to 0) answers Uninitialized.
    assert result["after_shutdown"] == ["NVMLError_Uninitialized", "Uninitialized"]
    assert result["second_shutdown"] == ["NVMLError_Uninitialized", "Uninitialized"]


def test_pynvml_without_state_reports_driver_not_loaded(env, tmp_path):
    script = "import pynvml as n\ntry:\n    n.nvmlInit()\nexcept n.NVMLError_DriverNotLoaded as e:\n    print(e)\n"
    missing = {**env, "SIMGPU_STATE_DIR": str(tmp_path / "absent")}
    done = subprocess.run([sys.executable, "-c", script], env=missing, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "Driver Not Loaded"


def test_malformed_gpu_list_is_reported(env, state_dir):
    (state_dir / "gpus").write_text(f"0\t{UUIDS[0]}\tlots\t{GPU_NAME}\n")
    script = "import pynvml as n\ntry:\n    n.nvmlInit()\nexcept n.NVMLError_Unknown as e:\n    print(e)\n"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "Unknown Error"
    assert "gpus line 1: total_mib must be a positive number of MiB" in done.stderr


# The C ABI directly: the sizing protocol, the v1 layout and argument checks


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint)] + [
        (name, ctypes.c_ulonglong) for name in ("total", "reserved", "free", "used")
    ]


def test_c_abi_protocols(build_dir, state_dir, spawn, monkeypatch):
    monkeypatch.setenv("SIMGPU_STATE_DIR", str(state_dir))
    lib = ctypes.CDLL(str(build_dir / "libnvidia-ml.so.1"))
    lib.nvmlErrorString.restype = ctypes.c_char_p
    count, device = ctypes.c_uint(0), ctypes.c_void_p()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1  # NVML_ERROR_UNINITIALIZED
    assert lib.nvmlInit_v2() == 0
    try:
        holders = [spawn(), spawn()]
        for holder in holders:
            write_claim(state_dir, 1, holder.pid, 64)
        assert lib.nvmlDeviceGetHandleByIndex(1, ctypes.byref(device)) == 0

        count.value = 0
        assert lib.nvmlDeviceGetComputeRunningProcesses(device, ctypes.byref(count), None) == 7  # INSUFFICIENT_SIZE
        assert count.value == 2
        infos = (ProcessInfoV1 * 2)()
        assert lib.nvmlDeviceGetComputeRunningProcesses(device, ctypes.byref(count), infos) == 0
        assert [(info.pid, info.usedGpuMemory) for info in infos] == sorted((h.pid, 64 * MIB) for h in holders)
        assert lib.nvmlDeviceGetComputeRunningProcesses_v3(device, None, None) == 2

        memory = MemoryV2(version=0x01000028)
        assert lib.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(memory)) == 25  # ARGUMENT_VERSION_MISMATCH
        assert lib.nvmlDeviceGetHandleByUUID(None, ctypes.byref(device)) == 2
        assert lib.nvmlDeviceGetName(device, ctypes.create_string_buffer(8), 8) == 7
        assert lib.nvmlErrorString(6) == b"Not Found"
        assert lib.nvmlErrorString(12345) == b"Unknown Error"
    finally:
        assert lib.nvmlShutdown() == 0
    assert lib.nvmlShutdown() == 1


# nvidia-smi stand-in


def test_smi_lists_gpus(build_dir, env):
    done = smi(build_dir, env, "-L")
    assert done.returncode == 0
    assert done.stdout.splitlines() == [f"GPU {i}: {GPU_NAME} (UUID: {uuid})" for i, uuid in enumerate(UUIDS)]


def test_smi_query_gpu(build_dir, env, state_dir, spawn):
    holder = spawn()
    write_claim(state_dir, 0, holder.pid, 4096)
    fields = "--query-gpu=index,uuid,name,memory.used,memory.total,memory.free,driver_version"
    bare = smi(build_dir, env, fields, "--format=csv,noheader,nounits")
    assert bare.returncode == 0
    assert bare.stdout.splitlines() == [
        f"0, {UUIDS[0]}, {GPU_NAME}, 4097, {TOTAL_MIB}, {TOTAL_MIB - 4097}, 550.54.15",
        f"1, {UUIDS[1]}, {GPU_NAME}, 1, {TOTAL_MIB}, {TOTAL_MIB - 1}, 550.54.15",
    ]
    full = smi(build_dir, env, "--query-gpu=index,memory.used,memory.total", "--format=csv")
    assert full.stdout.splitlines() == [
        "index, memory.used [MiB], memory.total [MiB]",
        f"0, 4097 MiB, {TOTAL_MIB} MiB",
        f"1, 1 MiB, {TOTAL_MIB} MiB",
    ]
    noheader = smi(build_dir, env, "--query-gpu=uuid,memory.used", "--format=csv,noheader", "-i", "1")
    assert noheader.stdout.splitlines() == [f"{UUIDS[1]}, 1 MiB"]


def test_smi_query_compute_apps(build_dir, env, state_dir, spawn):
    holder = spawn()
    write_claim(state_dir, 1, holder.pid, 2048)
    write_claim(state_dir, 0, dead_pid(), 100)
    fields = "--query-compute-apps=pid,gpu_uuid,used_memory,process_name"
    bare = smi(build_dir, env, fields, "--format=csv,noheader,nounits")
    assert bare.returncode == 0
    assert bare.stdout.splitlines() == [f"{holder.pid}, {UUIDS[1]}, 2048, sleep"]
    full = smi(build_dir, env, fields, "--format=csv")
    assert full.stdout.splitlines() == [
        "pid, gpu_uuid, used_gpu_memory [MiB], process_name",
        f"{holder.pid}, {UUIDS[1]}, 2048 MiB, sleep",
    ]
    only_gpu0 = smi(build_dir, env, fields, "--format=csv", "-i", "0")
    assert only_gpu0.stdout.splitlines() == ["pid, gpu_uuid, used_gpu_memory [MiB], process_name"]

    holder.kill()
    holder.wait()
    assert smi(build_dir, env, fields, "--format=csv,noheader,nounits").stdout == ""


def test_smi_summary_table(build_dir, env, state_dir, spawn):
    holder = spawn()
    write_claim(state_dir, 1, holder.pid, 300)
    done = smi(build_dir, env)
    assert done.returncode == 0
    assert "Driver Version: 550.54.15" in done.stdout and "CUDA Version: 12.4" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["|", "1", *GPU_NAME.split(), "301MiB", "/", f"{TOTAL_MIB}MiB", "37%", "|"] in rows
    assert ["|", "1", str(holder.pid), "C", "sleep", "300MiB", "|"] in rows


@pytest.mark.parametrize(
    ("args", "rc", "message"),
    [
        (["--bogus"], 2, "Invalid combination of input arguments"),
        (["--query-gpu=index,bogus", "--format=csv"], 2, 'Field "bogus" is not a valid field to query.'),
        (["--query-gpu=index"], 2, "Invalid combination of input arguments"),
        (["--query-gpu=index", "--format=json"], 2, "Invalid combination of input arguments"),
        (["-L", "--query-gpu=index", "--format=csv"], 2, "Invalid combination of input arguments"),
        (["-L", "-i", "7"], 6, "No devices were found"),
    ],
)
def test_smi_rejects_bad_input(build_dir, env, args, rc, message):
    done = smi(build_dir, env, *args)
    assert done.returncode == rc
    assert message in done.stdout


def test_smi_without_state_fails_like_nvidia_smi(build_dir, env, tmp_path):
    done = smi(build_dir, {**env, "SIMGPU_STATE_DIR": str(tmp_path / "absent")}, "-L")
    assert done.returncode == 9
    assert done.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


# simgpu-claim


def claim_files(state_dir):
    return sorted(path.name for path in (state_dir / "claims").iterdir())


def test_claim_defaults_to_the_caller_and_releases(env, state_dir):
    me = os.getpid()
    assert claim_tool(env, "--gpu", "0", "--mib", "1500").returncode == 0
    assert (state_dir / "claims" / f"gpu0.pid{me}").read_text() == "1500\n"
    assert claim_tool(env, "--gpu", "0", "--mib", "700").returncode == 0  # replaces, not adds
    assert (state_dir / "claims" / f"gpu0.pid{me}").read_text() == "700\n"
    assert claim_files(state_dir) == [".lock", f"gpu0.pid{me}"]  # no temp files left behind
    assert claim_tool(env, "--gpu", "0", "--release").returncode == 0
    assert claim_files(state_dir) == [".lock"]
    assert claim_tool(env, "--gpu", "0", "--release").returncode == 0  # releasing twice is fine


def test_claim_for_another_pid_is_seen_by_nvidia_smi(build_dir, env, state_dir, spawn):
    holder = spawn()
    assert claim_tool(env, "--gpu", "1", "--mib", "800", "--pid", str(holder.pid)).returncode == 0
    apps = smi(build_dir, env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert apps.stdout.splitlines() == [f"{holder.pid}, 800"]


def test_host_pid_offset_lists_holders_by_host_namespace_pid(build_dir, env, state_dir, spawn):
    """A container host: the driver names the holder by a PID of the host's namespace, absent from our /proc, while
    its memory still counts as used."""
    holder = spawn()
    assert claim_tool(env, "--gpu", "1", "--mib", "800", "--pid", str(holder.pid)).returncode == 0
    (state_dir / simgpu_state.HOST_PID_OFFSET_FILE).write_text("1000000\n")
    apps = smi(build_dir, env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    listed = int(apps.stdout.split(",")[0])
    assert listed == holder.pid + 1000000
    assert not Path(f"/proc/{listed}").exists()
    used = smi(build_dir, env, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "1")
    assert int(used.stdout.strip()) >= 800
    (state_dir / simgpu_state.HOST_PID_OFFSET_FILE).write_text("not a number\n")  # malformed: no offset
    apps = smi(build_dir, env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert apps.stdout.splitlines() == [f"{holder.pid}, 800"]


@pytest.mark.parametrize(
    ("args", "rc", "message"),
    [
        (["--gpu", "7", "--mib", "10"], 1, "--gpu 7: no such GPU"),
        (["--gpu", "0", "--mib", "-5"], 2, "argument --mib"),
        (["--gpu", "0", "--mib", "lots"], 2, "argument --mib"),
        (["--gpu", "0"], 2, "needs --mib"),
        (["--mib", "10"], 2, "needs --gpu"),
        (["--gpu", "0", "--mib", str(TOTAL_MIB)], 1, "out of memory"),
        (["--gpu", "0", "--mib", "10", "--pid", "0"], 2, "argument --pid"),
        (["--hold", "--gpu", "0", "--mib", "1", "--pid", "1"], 2, "--hold takes no --pid"),
        (["--gc", "--gpu", "0"], 2, "--gc takes no --gpu"),
        (["--gpu", "0", "--mib", "1", "--ignore-sigterm"], 2, "--ignore-sigterm only applies to --hold"),
    ],
)
def test_claim_rejects_bad_input_and_changes_nothing(env, state_dir, args, rc, message):
    done = claim_tool(env, *args)
    assert done.returncode == rc
    assert message in done.stderr
    assert not [name for name in claim_files(state_dir) if name.startswith("gpu")]


def test_claim_checks_free_memory_and_force_overrides(env, state_dir, spawn):
    holder = spawn()
    write_claim(state_dir, 0, holder.pid, TOTAL_MIB - 1001)  # 1000 MiB left
    assert claim_tool(env, "--gpu", "0", "--mib", "1000").returncode == 0
    refused = claim_tool(env, "--gpu", "0", "--mib", "1001")
    assert refused.returncode == 1
    assert "out of memory: --mib 1001 is more than the 1000 MiB free on GPU 0" in refused.stderr
    assert (state_dir / "claims" / f"gpu0.pid{os.getpid()}").read_text() == "1000\n"
    assert claim_tool(env, "--gpu", "0", "--mib", "5000", "--force").returncode == 0
    assert (state_dir / "claims" / f"gpu0.pid{os.getpid()}").read_text() == "5000\n"


def test_claim_for_a_gone_process_is_refused(env, state_dir):
    gone = dead_pid()
    done = claim_tool(env, "--gpu", "0", "--mib", "1", "--pid", str(gone))
    assert done.returncode == 1
    assert f"--pid {gone}: no such running process" in done.stderr


def start_holder(env, *extra):
    holder = subprocess.Popen(
        [sys.executable, str(CLAIM_TOOL), "--hold", "--gpu", "0", "--mib", "1000", *extra],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == f"holding 1000 MiB on GPU 0 as PID {holder.pid}\n"
    return holder


def test_hold_claims_until_sigterm(build_dir, env, state_dir):
    holder = start_holder(env)
    try:
        apps = smi(build_dir, env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        assert apps.stdout.splitlines() == [f"{holder.pid}, 1000"]
        holder.terminate()
        assert holder.wait(timeout=10) == 0
        # Exiting does not delete the claim: it records the exit, which starts the driver's release lag.
        name = f"gpu0.pid{holder.pid}"
        assert claim_files(state_dir) == [".lock", name, f"{name}.exit"]
        used = smi(build_dir, env, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0")
        assert used.stdout == "1\n"
        assert claim_tool(env, "--gc").stdout == f"removed {name}\n"
        assert claim_files(state_dir) == [".lock"]
    finally:
        holder.kill()
        holder.wait()


def test_hold_can_ignore_sigterm_and_gc_removes_its_stale_claim(build_dir, env, state_dir):
    holder = start_holder(env, "--ignore-sigterm")
    try:
        ignored = next(line for line in Path(f"/proc/{holder.pid}/status").read_text().splitlines() if "SigIgn" in line)
        assert int(ignored.split()[1], 16) & (1 << (signal.SIGTERM - 1))
        holder.terminate()  # an ignored signal is discarded when sent, so the holder is still there
        assert holder.poll() is None
        holder.kill()
        holder.wait()
        assert claim_files(state_dir) == [".lock", f"gpu0.pid{holder.pid}"]
        used = smi(build_dir, env, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0")
        assert used.stdout == "1\n"
        gc = claim_tool(env, "--gc")
        assert gc.returncode == 0
        assert gc.stdout == f"removed gpu0.pid{holder.pid}\n"
        assert claim_files(state_dir) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
