from __future__ import annotations

import types

import pytest
from fake_nvml import MIG_A, MIG_B, NO_PERMISSION, NOT_SUPPORTED, Device, FakeNvml, mig_host
from fake_proc import FakeProc

from ansible_collections.llmops.inference.plugins.module_utils import (
    device_holders,
    gpu,
    gpu_memory,
    gpu_query,
    gpu_smi,
)
from ansible_collections.llmops.inference.plugins.module_utils.procs import read_process

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


def fake_pynvml(devices, init_error=None):
    """A stand-in for the pynvml module: ``devices`` is a list of (name, uuid, total, used, processes)."""
    calls = []

    def init():
        calls.append("init")
        if init_error:
            raise NVMLError(init_error)

    return types.SimpleNamespace(
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: devices[i],
        nvmlDeviceGetName=lambda h: h[0],
        nvmlDeviceGetUUID=lambda h: h[1],
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=h[2], used=h[3], free=h[2] - h[3]),
        nvmlDeviceGetComputeRunningProcesses=lambda h: h[4],
    )


def nvml_proc(pid, used):
    return types.SimpleNamespace(pid=pid, usedGpuMemory=used)


def test_nvml_reads_gpus_and_processes_with_unknown_memory():
    nvml = fake_pynvml(
        [
            (b"NVIDIA H100 80GB HBM3", b"GPU-aaaa", 81559 * MIB, 45001 * MIB, [nvml_proc(10, 45000 * MIB)]),
            (
                "NVIDIA H100 80GB HBM3",
                "GPU-bbbb",
                81559 * MIB,
                2 * MIB,
                [nvml_proc(11, None), nvml_proc(12, 2**64 - 1)],
            ),
        ]
    )
    backend, gpus = gpu_query.query_gpus("nvml", nvml=nvml)
    assert backend == "nvml"
    assert [(g.index, g.uuid, g.name, g.total_mib, g.used_mib) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559, 45001),
        (1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559, 2),
    ]
    assert [p.as_dict() for p in gpus[0].processes] == [{"pid": 10, "used_mib": 45000}]
    assert [(p.pid, p.used_mib) for p in gpus[1].processes] == [(11, None), (12, None)]
    assert nvml.calls == ["init", "shutdown"]
    assert gpus[0].free_mib == 81559 - 45001


def test_nvml_merges_a_pid_listed_twice():
    nvml = fake_pynvml(
        [("G", "GPU-a", 10 * MIB, 9 * MIB, [nvml_proc(5, 3 * MIB), nvml_proc(5, 4 * MIB), nvml_proc(6, None)])]
    )
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=nvml)
    assert [(p.pid, p.used_mib) for p in gpus[0].processes] == [(5, 7), (6, None)]


def test_auto_falls_back_to_nvidia_smi_when_nvml_fails():
    nvml = fake_pynvml([], init_error="NVML Shared Library Not Found")
    answers = {
        gpu_smi.SMI_GPU_QUERY[0]: "0, GPU-aaaa, NVIDIA H100 80GB HBM3, 44901, 81559\n",
        gpu_smi.SMI_APPS_QUERY[0]: "321, GPU-aaaa, 44900\n",
        gpu_smi.SMI_RESERVED_QUERY[0]: "GPU-aaaa, 454\n",
        "-L": "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n",
    }
    backend, gpus = gpu_query.query_gpus("auto", run_command=lambda args: (0, answers[args[1]], ""), nvml=nvml)
    assert backend == "nvidia-smi"
    assert gpus[0].processes[0].as_dict() == {"pid": 321, "used_mib": 44900}
    # R510+ nvidia-smi leaves the reservation out of memory.used; used_mib holds it, as NVML's v1 used does.
    assert (gpus[0].used_mib, gpus[0].reserved_mib, gpus[0].in_use_mib) == (44901 + 454, 454, 44901)


def test_auto_names_both_failures():
    nvml = fake_pynvml([], init_error="NVML Shared Library Not Found")
    with pytest.raises(gpu.GpuQueryError) as err:
        gpu_query.query_gpus(
            "auto", run_command=lambda args: (127, "", "No such file or directory: 'nvidia-smi'"), nvml=nvml
        )
    assert "NVML initialisation failed: NVML Shared Library Not Found" in str(err.value)
    assert "nvidia-smi --query-gpu" in str(err.value)
    assert "No such file or directory" in str(err.value)


def test_missing_pynvml_is_reported(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    with pytest.raises(gpu.GpuQueryError, match="pynvml is not importable"):
        gpu_query.query_gpus("nvml")


def test_unknown_backend_is_rejected():
    with pytest.raises(gpu.GpuQueryError, match="unknown GPU backend 'cuda'"):
        gpu_query.query_gpus("cuda")


SMI_GPUS = """0, GPU-aaaa, NVIDIA H100 80GB HBM3, 44901, 81559
1, GPU-bbbb, NVIDIA A100-SXM4-80GB, Rev B, [N/A], 81920
"""
SMI_APPS = """321, GPU-aaaa, 44900
322, GPU-bbbb, [N/A]
323, GPU-bbbb, [Not Supported]
324, GPU-gone, 100
"""


def test_nvidia_smi_parsing_with_missing_values_and_commas_in_names():
    answers = {gpu_smi.SMI_GPU_QUERY[0]: SMI_GPUS, gpu_smi.SMI_APPS_QUERY[0]: SMI_APPS, "-L": ""}
    calls = []

    def run(args):
        calls.append(args)
        if args[1] not in answers:
            return 2, 'Field "memory.reserved" is not a valid field to query.\n', ""
        return 0, answers[args[1]], ""

    backend, gpus = gpu_query.query_gpus("nvidia-smi", run_command=run)
    assert backend == "nvidia-smi"
    assert calls[0] == ["nvidia-smi", *gpu_smi.SMI_GPU_QUERY]
    assert calls[1] == ["nvidia-smi", *gpu_smi.SMI_APPS_QUERY]
    assert gpus[1].name == "NVIDIA A100-SXM4-80GB, Rev B"
    assert (gpus[1].used_mib, gpus[1].total_mib) == (None, 81920)
    assert (gpus[0].used_mib, gpus[0].reserved_mib) == (44901, None)  # an nvidia-smi before R510: no reservation apart
    assert [p.as_dict() for p in gpus[1].processes] == [{"pid": 322, "used_mib": None}, {"pid": 323, "used_mib": None}]
    assert [p.pid for p in gpus[0].processes] == [321]


def test_nvidia_smi_with_no_processes():
    assert gpu_smi.parse_smi_apps("No running processes found\n\n") == []


def test_nvidia_smi_garbage_is_an_error():
    with pytest.raises(gpu.GpuQueryError, match="unexpected nvidia-smi GPU line"):
        gpu_smi.parse_smi_gpus("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n")


def test_nvidia_smi_failure_names_the_query():
    with pytest.raises(gpu.GpuQueryError, match=r"`nvidia-smi --query-gpu=.*` failed \(rc=9\): driver not loaded"):
        gpu_query.query_gpus("nvidia-smi", run_command=lambda args: (9, "driver not loaded", ""))


GPUS = [gpu.Gpu(0, "GPU-aaaa", "H100", 81559, 1), gpu.Gpu(1, "GPU-BBBB", "H100", 81559, 1)]


@pytest.mark.parametrize(
    ("selectors", "indices"),
    [(None, [0, 1]), ([], [0, 1]), ([1], [1]), (["1", 0], [0, 1]), (["gpu-bbbb"], [1]), (["GPU-aaaa", "0"], [0])],
)
def test_select_gpus_by_index_or_uuid(selectors, indices):
    assert [g.index for g in gpu.select_gpus(GPUS, selectors)] == indices


@pytest.mark.parametrize("selector", [2, "7", "GPU-cccc", True])
def test_select_gpus_names_an_unknown_selector(selector):
    with pytest.raises(ValueError, match=f"unknown GPU {selector!r}; known GPUs: 0 \\(GPU-aaaa\\), 1 \\(GPU-BBBB\\)"):
        gpu.select_gpus(GPUS, [selector])


def test_device_holders_finds_open_nvidia_devices(tmp_path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(10, fds={0: "/dev/null", 5: "/dev/nvidiactl", 6: "/dev/nvidia0", 7: "/dev/nvidia0"})
    fake.add(11, fds={0: "/dev/null"})
    fake.add(12, fds={3: "/dev/nvidia-uvm"})
    (fake.root / "13").mkdir()  # a process whose fd table is unreadable
    assert device_holders.device_holders(str(fake.root)) == {
        10: ["/dev/nvidia0", "/dev/nvidiactl"],
        12: ["/dev/nvidia-uvm"],
    }
    assert device_holders.device_holders(str(tmp_path / "absent")) == {}


# MIG devices and per-call NVML errors ----------------------------------------------------------------


def test_nvml_lists_the_mig_devices_of_a_gpu_in_mig_mode():
    nvml = FakeNvml(mig_host())
    backend, gpus = gpu_query.query_gpus("nvml", nvml=nvml)
    assert backend == "nvml"
    assert [(g.index, g.uuid, g.mig_index, g.parent_uuid) for g in gpus] == [
        (0, "GPU-aaaa", None, None),
        (0, MIG_A, 0, "GPU-aaaa"),
        (0, MIG_B, 2, "GPU-aaaa"),
        (1, "GPU-bbbb", None, None),
    ]
    whole, mig_a, mig_b, _other = gpus
    assert whole.mig_enabled and not whole.is_mig and not whole.can_run
    assert mig_a.is_mig and mig_a.can_run
    assert (mig_a.total_mib, mig_a.used_mib, mig_a.name) == (40192, 30013, "NVIDIA H100 80GB HBM3 MIG 3g.40gb")
    assert [p.as_dict() for p in mig_a.processes] == [{"pid": 4242, "used_mib": 30000}]
    assert (mig_a.gpu_instance_id, mig_a.compute_instance_id) == (1, 0)
    assert mig_b.processes == [] and mig_b.used_mib == 13
    assert mig_a.display == "GPU 0 MIG device 0" and whole.display == "GPU 0"
    assert mig_a.as_dict()["parent_uuid"] == "GPU-aaaa"
    assert all(g.errors == [] for g in gpus)
    assert nvml.calls == ["init", "shutdown"]


def test_a_mig_uuid_selects_that_mig_device_with_its_own_memory():
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=FakeNvml(mig_host()))
    (chosen,) = gpu.select_gpus(gpus, [MIG_B.lower()])
    assert (chosen.uuid, chosen.used_mib, chosen.parent_uuid, chosen.index) == (MIG_B, 13, "GPU-aaaa", 0)
    assert [g.uuid for g in gpu.select_gpus(gpus, [MIG_A, "1"])] == [MIG_A, "GPU-bbbb"]
    assert [g.uuid for g in gpu.select_gpus(gpus, ["0"])] == ["GPU-aaaa"], "an index names the whole GPU"
    assert [g.uuid for g in gpu.select_gpus(gpus, None)] == ["GPU-aaaa", "GPU-bbbb"], "all GPUs means whole GPUs"
    assert [g.uuid for g in gpu.select_gpus(gpus, ["MIG-GPU-aaaa/9/0"])] == [MIG_B], "the pre-R470 MIG name"
    with pytest.raises(ValueError, match=r"known GPUs: 0 \(GPU-aaaa\), 0 MIG 0 \(MIG-5c4a.*\), 1 \(GPU-bbbb\)"):
        gpu.select_gpus(gpus, ["MIG-0000"])


def test_unsupported_memory_info_degrades_that_field_not_the_whole_answer():
    devices = [
        Device("NVIDIA A10", "GPU-aaaa", 23028, 500, [(10, 400)], fail={"memory": NOT_SUPPORTED}),
        Device("NVIDIA A10", "GPU-bbbb", 23028, 700, [(11, 600)], fail={"processes": NO_PERMISSION}),
        Device("NVIDIA A10", "GPU-cccc", 23028, 2, fail={"name": NOT_SUPPORTED}),
    ]

    def smi_must_not_run(args):
        raise AssertionError(f"fell back to nvidia-smi: {args}")

    backend, gpus = gpu_query.query_gpus("auto", run_command=smi_must_not_run, nvml=FakeNvml(devices))
    assert backend == "nvml"
    first, second, third = gpus
    assert (first.total_mib, first.used_mib, first.free_mib) == (None, None, None)
    assert first.errors == [{"field": "memory", "error": "Not Supported"}]
    assert [p.pid for p in first.processes] == [10] and first.processes_known
    assert (second.used_mib, second.processes, second.processes_known) == (700, [], False)
    assert second.errors == [{"field": "processes", "error": "Insufficient Permissions"}]
    assert (third.name, third.errors) == ("unknown", [{"field": "name", "error": "Not Supported"}])
    assert second.as_dict()["errors"] == [{"field": "processes", "error": "Insufficient Permissions"}]


def test_an_error_in_a_mig_query_is_kept_on_the_parent():
    host = mig_host()
    host[0].fail = {"mig_count": NO_PERMISSION}
    host[1].fail = {"mig_mode": NO_PERMISSION}
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=FakeNvml(host))
    assert [g.uuid for g in gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert gpus[0].errors == [{"field": "mig_devices", "error": "Insufficient Permissions"}]
    assert gpus[1].errors == [{"field": "mig_mode", "error": "Insufficient Permissions"}]


def test_a_failed_device_count_still_falls_back_to_nvidia_smi():
    answers = {
        gpu_smi.SMI_GPU_QUERY[0]: "0, GPU-aaaa, NVIDIA H100 80GB HBM3, 1, 81559\n",
        gpu_smi.SMI_APPS_QUERY[0]: "",
        "-L": "",
        gpu_smi.SMI_RESERVED_QUERY[0]: "",
    }
    backend, gpus = gpu_query.query_gpus(
        "auto", run_command=lambda args: (0, answers[args[1]], ""), nvml=FakeNvml([], count_error=NO_PERMISSION)
    )
    assert (backend, [g.uuid for g in gpus]) == ("nvidia-smi", ["GPU-aaaa"])


SMI_LIST_MIG = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)
  MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 1g.10gb     Device  1: (UUID: MIG-GPU-aaaa/9/0)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbb)
"""


def test_nvidia_smi_lists_mig_devices_from_dash_l_with_unknown_memory():
    answers = {
        gpu_smi.SMI_GPU_QUERY[0]: (
            "0, GPU-aaaa, NVIDIA A100-SXM4-80GB, 30026, 81920\n1, GPU-bbbb, NVIDIA A100-SXM4-80GB, 1, 81920\n"
        ),
        gpu_smi.SMI_APPS_QUERY[0]: "4242, GPU-aaaa, [N/A]\n",
        gpu_smi.SMI_RESERVED_QUERY[0]: "GPU-aaaa, [N/A]\nGPU-bbbb, 763\n",
        "-L": SMI_LIST_MIG,
    }
    backend, gpus = gpu_query.query_gpus("nvidia-smi", run_command=lambda args: (0, answers[args[1]], ""))
    assert backend == "nvidia-smi"
    assert [(g.uuid, g.mig_index, g.parent_uuid) for g in gpus] == [
        ("GPU-aaaa", None, None),
        ("MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", 0, "GPU-aaaa"),
        ("MIG-GPU-aaaa/9/0", 1, "GPU-aaaa"),
        ("GPU-bbbb", None, None),
    ]
    whole, mig = gpus[0], gpus[1]
    assert whole.mig_enabled and [p.pid for p in whole.processes] == [4242]
    assert (mig.name, mig.used_mib, mig.processes_known) == ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", None, False)
    assert [error["field"] for error in mig.errors] == ["memory", "processes"]
    assert (gpus[2].gpu_instance_id, gpus[2].compute_instance_id) == (9, 0)
    (chosen,) = gpu.select_gpus(gpus, ["mig-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"])
    assert chosen is mig


def test_memory_without_a_live_holder_is_found_with_its_evidence(tmp_path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(10, argv=["sglang::scheduler_TP0"], ppid=7)
    fake.add(11, argv=["sglang::scheduler_TP1"], ppid=7, state="Z")
    fake.add(12, argv=["sglang::scheduler_TP2"], state="D")
    gpus = [
        gpu.Gpu(0, "GPU-a", "H100", 81559, 40001, [gpu.GpuProcess(10, 40000)]),
        gpu.Gpu(1, "GPU-b", "H100", 81559, 80001, [gpu.GpuProcess(11, 40000), gpu.GpuProcess(13, 30000)]),
        gpu.Gpu(2, "GPU-c", "H100", 81559, 50001, [gpu.GpuProcess(12, 20000)]),
        gpu.Gpu(3, "GPU-d", "H100", 81559, 9000, [], processes_known=False),
    ]
    found = gpu_memory.memory_without_live_holder(
        gpus, lambda pid: read_process(pid, str(fake.root)), threshold_mib=1024
    )
    assert [(e["gpu"], e["pid"], e["state"], e["ppid"], e["mib"]) for e in found] == [
        (1, 11, "Z", 7, 40000),
        (1, 13, None, None, 30000),
        (1, None, None, None, 10001),
        (2, None, None, None, 30001),
    ], "a D-state holder is alive (only SIGKILL shows it is stuck); an unknown process list proves nothing"
    assert found[0]["evidence"] == "pid 11 'sglang::scheduler_TP1' is a zombie (state Z, parent 7) holding 40000 MiB"
    assert found[1]["evidence"] == "pid 13 no longer exists, yet the driver lists it holding 30000 MiB"
    assert found[3]["evidence"] == "30001 MiB used that no listed process holds (more than 1024 MiB)"
    assert gpu_memory.reset_message(found) == (
        "GPU 1 needs a reset or a reboot: " + ", ".join(e["evidence"] for e in found[:3]) + "; "
        "GPU 2 needs a reset or a reboot: " + found[3]["evidence"]
    )


def test_memory_without_a_live_holder_on_mig_devices_names_the_device():
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=FakeNvml(mig_host()))
    found = gpu_memory.memory_without_live_holder(gpus, lambda pid: None, threshold_mib=1024)
    assert [(e["gpu"], e["uuid"], e["pid"]) for e in found] == [(0, "GPU-aaaa", 4242), (0, MIG_A, 4242)]
    assert found[1]["evidence"].endswith(f"holding 30000 MiB on MIG device 0 ({MIG_A})")
    assert gpu_memory.memory_without_live_holder(gpus, lambda pid: types.SimpleNamespace(is_alive=True), 1024) == []


def test_nvidia_smi_lists_mig_devices_once_per_runner():
    answers = {
        gpu_smi.SMI_GPU_QUERY[0]: "0, GPU-aaaa, NVIDIA A100-SXM4-80GB, 1, 81920\n",
        gpu_smi.SMI_APPS_QUERY[0]: "",
    }
    answers["-L"] = SMI_LIST_MIG
    answers[gpu_smi.SMI_RESERVED_QUERY[0]] = "GPU-aaaa, 763\n"
    calls = []

    def run(args):
        calls.append(args[1])
        return 0, answers[args[1]], ""

    for _attempt in range(3):
        _backend, gpus = gpu_query.query_gpus("nvidia-smi", run_command=run)
        assert [g.uuid for g in gpus][:2] == ["GPU-aaaa", "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"]
    assert calls.count("-L") == 1 and calls.count(gpu_smi.SMI_RESERVED_QUERY[0]) == 1
    assert len(calls) == 2 + 3 * 2, "memory polls cost two nvidia-smi runs each"


# -- the driver's reservation --------------------------------------------------------------------------------


def test_nvml_v2_reports_the_drivers_reservation_apart_from_what_processes_hold():
    devices = [
        Device("NVIDIA H100 80GB HBM3", "GPU-aaaa", 81559, 455, reserved_mib=454),
        Device("NVIDIA H100 80GB HBM3", "GPU-bbbb", 81559, 1536 + 2049, [(7, 2048)], reserved_mib=1536),
    ]
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=FakeNvml(devices))
    idle, held = gpus
    assert (idle.used_mib, idle.reserved_mib, idle.in_use_mib, idle.errors) == (455, 454, 1, [])
    assert (held.used_mib, held.reserved_mib, held.in_use_mib, held.listed_mib) == (3585, 1536, 2049, 2048)
    assert gpu_memory.unlisted_mib(idle) == 1 and gpu_memory.unlisted_mib(held) == 1
    assert idle.as_dict()["reserved_mib"] == 454


def test_without_nvml_v2_the_reservation_is_unknown_and_no_error():
    # A driver before R510 (no nvmlDeviceGetMemoryInfo_v2), and a pynvml that cannot pass a version.
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=FakeNvml([Device("NVIDIA A100", "GPU-a", 40960, 3)]))
    assert (gpus[0].reserved_mib, gpus[0].in_use_mib, gpus[0].errors) == (None, 3, [])
    nvml = fake_pynvml([("NVIDIA A100", "GPU-a", 40960 * MIB, 3 * MIB, [])])
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=nvml)
    assert (gpus[0].reserved_mib, gpus[0].in_use_mib, gpus[0].errors) == (None, 3, [])


def test_a_failing_reservation_query_is_recorded_and_leaves_used_as_it_is():
    device = Device("NVIDIA H100", "GPU-a", 81559, 455, reserved_mib=454, fail={"memory_v2": NO_PERMISSION})
    _backend, gpus = gpu_query.query_gpus("nvml", nvml=FakeNvml([device]))
    assert (gpus[0].used_mib, gpus[0].reserved_mib) == (455, None)
    assert gpus[0].errors == [{"field": "reserved", "error": "Insufficient Permissions"}]


@pytest.mark.parametrize("reserved", [600, 1536])
def test_a_boards_reservation_is_no_memory_without_a_holder(reserved):
    idle = gpu.Gpu(0, "GPU-a", "H100", 81559, reserved + 1, reserved_mib=reserved)
    busy = gpu.Gpu(1, "GPU-b", "H100", 81559, reserved + 1 + 2048, [gpu.GpuProcess(7, 2048)], reserved_mib=reserved)
    stuck = gpu.Gpu(2, "GPU-c", "H100", 81559, reserved + 1 + 5000, [], reserved_mib=reserved)
    found = gpu_memory.memory_without_live_holder([idle, busy, stuck], lambda pid: FakeLive(), threshold_mib=1024)
    assert [(entry["gpu"], entry["mib"]) for entry in found] == [(2, 5001)]
    assert found[0]["evidence"] == (
        f"5001 MiB used beyond the driver's {reserved} MiB reservation that no listed process holds "
        "(more than 1024 MiB)"
    )


def test_where_the_reservation_is_unknown_all_used_memory_counts():
    board = gpu.Gpu(0, "GPU-a", "H100", 81559, 1537)
    found = gpu_memory.memory_without_live_holder([board], lambda pid: None, threshold_mib=1024)
    assert [(entry["gpu"], entry["mib"]) for entry in found] == [(0, 1537)]


class FakeLive:
    state, ppid, title, is_alive = "S", 1, "holder", True


@pytest.mark.parametrize(
    ("selectors", "devices", "expected"),
    [
        (["GPU-b", "GPU-a"], [{"index": 3, "uuid": "GPU-b"}, {"index": 1, "uuid": "GPU-a"}], ["3", "1"]),
        (["0", "1"], [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}], ["0", "1"]),
        (["MIG-x"], [{"index": 0, "uuid": "MIG-x", "mig_index": 2}], ["MIG-x"]),
        (["GPU-b", "GPU-a"], [], ["GPU-b", "GPU-a"]),
        (["GPU-b", "GPU-a"], None, ["GPU-b", "GPU-a"]),
    ],
    ids=["uuids-to-indexes", "indexes", "mig-keeps-its-uuid", "not-looked-yet", "none"],
)
def test_cuda_visible_devices_names_whole_gpus_by_index(selectors, devices, expected):
    assert gpu.cuda_visible_devices(selectors, devices) == expected
