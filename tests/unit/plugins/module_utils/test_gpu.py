from __future__ import annotations

import types

import pytest
from fake_proc import FakeProc

from ansible_collections.llmops.inference.plugins.module_utils import gpu

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
    backend, gpus = gpu.query_gpus("nvml", nvml=nvml)
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
    _backend, gpus = gpu.query_gpus("nvml", nvml=nvml)
    assert [(p.pid, p.used_mib) for p in gpus[0].processes] == [(5, 7), (6, None)]


def test_auto_falls_back_to_nvidia_smi_when_nvml_fails():
    nvml = fake_pynvml([], init_error="NVML Shared Library Not Found")
    answers = {
        gpu.SMI_GPU_QUERY[0]: "0, GPU-aaaa, NVIDIA H100 80GB HBM3, 44901, 81559\n",
        gpu.SMI_APPS_QUERY[0]: "321, GPU-aaaa, 44900\n",
    }
    backend, gpus = gpu.query_gpus("auto", run_command=lambda args: (0, answers[args[1]], ""), nvml=nvml)
    assert backend == "nvidia-smi"
    assert gpus[0].processes[0].as_dict() == {"pid": 321, "used_mib": 44900}


def test_auto_names_both_failures():
    nvml = fake_pynvml([], init_error="NVML Shared Library Not Found")
    with pytest.raises(gpu.GpuQueryError) as err:
        gpu.query_gpus("auto", run_command=lambda args: (127, "", "No such file or directory: 'nvidia-smi'"), nvml=nvml)
    assert "NVML initialisation failed: NVML Shared Library Not Found" in str(err.value)
    assert "nvidia-smi --query-gpu" in str(err.value)
    assert "No such file or directory" in str(err.value)


def test_missing_pynvml_is_reported(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    with pytest.raises(gpu.GpuQueryError, match="pynvml is not importable"):
        gpu.query_gpus("nvml")


def test_unknown_backend_is_rejected():
    with pytest.raises(gpu.GpuQueryError, match="unknown GPU backend 'cuda'"):
        gpu.query_gpus("cuda")


SMI_GPUS = """0, GPU-aaaa, NVIDIA H100 80GB HBM3, 44901, 81559
1, GPU-bbbb, NVIDIA A100-SXM4-80GB, Rev B, [N/A], 81920
"""
SMI_APPS = """321, GPU-aaaa, 44900
322, GPU-bbbb, [N/A]
323, GPU-bbbb, [Not Supported]
324, GPU-gone, 100
"""


def test_nvidia_smi_parsing_with_missing_values_and_commas_in_names():
    answers = {gpu.SMI_GPU_QUERY[0]: SMI_GPUS, gpu.SMI_APPS_QUERY[0]: SMI_APPS}
    calls = []

    def run(args):
        calls.append(args)
        return 0, answers[args[1]], ""

    backend, gpus = gpu.query_gpus("nvidia-smi", run_command=run)
    assert backend == "nvidia-smi"
    assert calls[0] == ["nvidia-smi", *gpu.SMI_GPU_QUERY]
    assert calls[1] == ["nvidia-smi", *gpu.SMI_APPS_QUERY]
    assert gpus[1].name == "NVIDIA A100-SXM4-80GB, Rev B"
    assert (gpus[1].used_mib, gpus[1].total_mib) == (None, 81920)
    assert [p.as_dict() for p in gpus[1].processes] == [{"pid": 322, "used_mib": None}, {"pid": 323, "used_mib": None}]
    assert [p.pid for p in gpus[0].processes] == [321]


def test_nvidia_smi_with_no_processes():
    assert gpu.parse_smi_apps("No running processes found\n\n") == []


def test_nvidia_smi_garbage_is_an_error():
    with pytest.raises(gpu.GpuQueryError, match="unexpected nvidia-smi GPU line"):
        gpu.parse_smi_gpus("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n")


def test_nvidia_smi_failure_names_the_query():
    with pytest.raises(gpu.GpuQueryError, match=r"`nvidia-smi --query-gpu=.*` failed \(rc=9\): driver not loaded"):
        gpu.query_gpus("nvidia-smi", run_command=lambda args: (9, "driver not loaded", ""))


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
    assert gpu.device_holders(str(fake.root)) == {10: ["/dev/nvidia0", "/dev/nvidiactl"], 12: ["/dev/nvidia-uvm"]}
    assert gpu.device_holders(str(tmp_path / "absent")) == {}
