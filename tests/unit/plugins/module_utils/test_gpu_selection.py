"""gpu_selection: a GPU list that cannot work on the host is refused before anything changes, naming GPU and reason."""

from __future__ import annotations

import pytest
from fake_nvml import MIG_A, MIG_B, NOT_SUPPORTED, FakeNvml, mig_host
from fake_proc import FakeClock, FakeGpus, FakeKernel, FakeProc, FakeSystemctl

from ansible_collections.llmops.inference.plugins.module_utils.gpu import GpuQueryError
from ansible_collections.llmops.inference.plugins.module_utils.gpu_query import query_gpus
from ansible_collections.llmops.inference.plugins.module_utils.gpu_selection import (
    Layout,
    check_gpu_list,
    inspect_gpu_list,
    parse_layout,
)
from ansible_collections.llmops.inference.plugins.module_utils.pid_namespace import detect_container

UNIT = "sglang-qwen.service"
LABEL = "sglang_service_gpus"
UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-00000000-0000-4000-8000-000000000001"
KNOWN = f"this host has 0 ({UUID0}), 1 ({UUID1})"


@pytest.fixture
def host(tmp_path):
    """Two idle GPUs; PID 1 is init, and the units t-foreign.service and session-1.scope run."""
    proc = FakeProc(tmp_path / "proc")
    gpus = FakeGpus(proc, FakeKernel(proc, FakeClock()), count=2)
    proc.add(1, ppid=0, argv=["/sbin/init"], cgroup="0::/init.scope")
    running = {"t-foreign.service": "active", "session-1.scope": "active"}
    return proc, gpus, running


def check(host, devices, tp_size=1, extra_args=(), unit=UNIT):
    proc, gpus, running = host
    return check_gpu_list(
        devices,
        gpus()[1],
        parse_layout(tp_size, extra_args),
        unit=unit,
        running_units=running,
        label=LABEL,
        proc_root=str(proc.root),
    )


@pytest.mark.parametrize(
    ("tp_size", "extra_args", "needed"),
    [
        (1, [], 1),
        (2, [], 2),
        (2, ["--dp-size", "2"], 4),
        (2, ["--data-parallel-size=3"], 6),
        (2, ["--pp-size=2"], 4),
        (2, ["--pipeline-parallel-size", "2", "--dp-size", "2"], 8),
        # The deprecated spelling of attention DP: groups inside the TP group, no GPUs of their own.
        (4, ["--dp-size", "4", "--enable-dp-attention"], 4),
        (4, ["--attn-dp-size", "4"], 4),
        (2, ["--base-gpu-id", "1"], 3),
        (2, ["--gpu-id-step", "2"], 3),
        (2, ["--dp-size", "2", "--gpu-id-step", "2"], 7),
        # Two nodes share a TP group of 4: two ranks per node.
        (4, ["--nnodes", "2", "--node-rank", "1"], 2),
        (2, ["--tp-size", "4"], 4),
        (2, ["--tensor-parallel-size", "1", "--tp-size", "3"], 3),
        (2, ["--dp-size", "many", "--served-model-name", "--dp-size"], 2),
    ],
)
def test_the_layout_sglang_places_ranks_by(tp_size, extra_args, needed):
    assert parse_layout(tp_size, extra_args).devices_needed() == needed


def test_a_layout_names_what_it_was_given():
    assert Layout().describe() == "--tp-size 1"
    layout = parse_layout(2, ["--dp-size", "2", "--base-gpu-id", "1"])
    assert layout.describe() == "--tp-size 2, --dp-size 2, --base-gpu-id 1"


@pytest.mark.parametrize("devices", [["0"], ["1"], ["0", "1"], ["1", "0"], [UUID1, UUID0], [UUID0.lower()]])
def test_gpus_the_host_has_pass(host, devices):
    verdict = check(host, devices)
    assert verdict.problems == [] and verdict.warnings == []
    assert verdict.cuda_devices == len(devices)


def test_the_devices_come_in_the_lists_order(host):
    assert [gpu.index for gpu in check(host, ["1", "0"], tp_size=2).devices] == [1, 0]
    assert [gpu.index for gpu in check(host, [UUID1, "0"], tp_size=2).devices] == [1, 0]


def test_a_gpu_the_host_does_not_have_is_refused_naming_it_and_the_host_gpus(host):
    verdict = check(host, ["7"])
    assert verdict.problems == [f"{LABEL} must name GPUs this host has: 7 is not one of them ({KNOWN}); got [7]"]


def test_an_unknown_uuid_is_refused_alone(host):
    verdict = check(host, ["0", "GPU-nope"], tp_size=1)
    assert verdict.problems[0].startswith(f"{LABEL} must name GPUs this host has: GPU-nope is not one of them")
    assert all("GPU-nope" in problem for problem in verdict.problems)


def test_a_gpu_named_twice_is_refused_not_counted(host):
    verdict = check(host, ["0", "0"], tp_size=2)
    assert verdict.problems == [
        f"{LABEL} must name each GPU once: 0 is named 2 times (GPU 0, {UUID0}); CUDA reads a list that repeats a GPU "
        "as no GPU at all; got [0, 0]"
    ]


def test_one_gpu_by_index_and_by_uuid_is_named_twice(host):
    verdict = check(host, [UUID1, "1"], tp_size=2)
    assert f"must name each GPU once: {UUID1} and 1 (GPU 1, {UUID1})" in verdict.problems[0]


def test_indexes_and_gpu_uuids_mix(host):
    assert check(host, ["0", UUID1], tp_size=2).problems == []


def test_whole_gpus_and_mig_devices_mixed_are_refused(tmp_path):
    inventory = query_gpus("nvml", nvml=FakeNvml(mig_host()))[1]
    verdict = check_gpu_list(["1", MIG_B], inventory, parse_layout(1), unit=UNIT, proc_root=str(tmp_path))
    assert verdict.problems == [
        "gpus must name either whole GPUs (by index or GPU- UUID) or MIG devices (by MIG- UUID), not both: the list "
        f"starts with whole GPUs and CUDA stops reading it at {MIG_B}; got [1, {MIG_B}]"
    ]


def test_fewer_gpus_than_tp_are_refused(host):
    verdict = check(host, ["1"], tp_size=2)
    assert verdict.problems == [
        f"{LABEL} must give the engine at least 2 GPU(s): its layout (--tp-size 2) uses CUDA devices up to 1, and the "
        "list gives it 1 (1); got [1]"
    ]


def test_data_parallel_replicas_need_gpus_of_their_own(host):
    verdict = check(host, ["0", "1"], tp_size=1, extra_args=["--dp-size", "2"])
    assert verdict.problems == []
    verdict = check(host, ["0", "1"], tp_size=2, extra_args=["--sim-load-time", "1", "--dp-size", "2"])
    assert verdict.needed == 4
    assert "at least 4 GPU(s): its layout (--tp-size 2, --dp-size 2) uses CUDA devices up to 3" in verdict.problems[0]


def test_the_engines_own_processes_and_leftovers_hold_memory_in_reach(host):
    proc, gpus, running = host
    running[UNIT] = "active"
    proc.add(101, ppid=100, argv=["sglang::scheduler_TP0"], cgroup=f"0::/system.slice/{UNIT}")
    gpus.claim(101, 0, 40000)
    # A leftover of an earlier stop: reparented, still in the unit's cgroup.
    proc.add(102, ppid=1, argv=["sglang::scheduler_TP1"], cgroup=f"0::/system.slice/{UNIT}")
    gpus.claim(102, 1, 40000)
    verdict = check(host, ["0", "1"], tp_size=2)
    assert verdict.problems == []
    assert [(holder["pid"], holder["in_reach"]) for holder in verdict.holders] == [(101, True), (102, True)]


def test_leftovers_of_the_stopped_unit_are_in_reach(host):
    proc, gpus, _running = host
    proc.add(102, ppid=1, argv=["sglang::scheduler_TP1"], cgroup=f"0::/system.slice/{UNIT}")
    gpus.claim(102, 1, 40000)
    assert check(host, ["1"]).problems == []


def test_an_orphaned_sglang_process_outside_running_units_is_in_reach(host):
    proc, gpus, _running = host
    proc.add(300, ppid=1, argv=["sglang::scheduler_TP1"], cgroup="0::/")
    proc.add(301, ppid=1, argv=["sglang::scheduler"], cgroup="0::/system.slice/sglang-old.service")
    gpus.claim(300, 1, 512)
    gpus.claim(301, 0, 512)
    assert check(host, ["0", "1"], tp_size=2).problems == []


def test_another_units_process_is_refused_naming_gpu_pid_and_unit(host):
    proc, gpus, _running = host
    proc.add(201, ppid=1, argv=["simgpu-claim", "--hold"], cgroup="0::/system.slice/t-foreign.service")
    gpus.claim(201, 1, 4001)
    verdict = check(host, ["1"])
    assert verdict.problems == [
        f"{LABEL} must name GPUs that no process outside {UNIT} holds: GPU 1 ({UUID1}) holds 4001 MiB of pid 201 "
        f"'simgpu-claim' of the active unit t-foreign.service; a restart of {UNIT} leaves it alone: stop that "
        "process or name other GPUs; got [1]"
    ]
    assert verdict.holders == [
        {
            "gpu": 1,
            "uuid": UUID1,
            "pid": 201,
            "mib": 4001,
            "title": "simgpu-claim",
            "unit": "t-foreign.service",
            "in_reach": False,
        }
    ]
    assert check(host, ["0"]).problems == []


def test_an_orphaned_sglang_process_of_another_running_unit_is_refused(host):
    proc, gpus, _running = host
    proc.add(203, ppid=1, argv=["sglang::scheduler"], cgroup="0::/system.slice/t-foreign.service")
    gpus.claim(203, 0, 1000)
    verdict = check(host, ["0"])
    (problem,) = verdict.problems
    assert (
        f"GPU 0 ({UUID0}) holds 1000 MiB of pid 203 'sglang::scheduler' of the active unit t-foreign.service" in problem
    )


@pytest.mark.parametrize(
    ("cgroup", "ppid", "owner"),
    [
        ("0::/user.slice/user-0.slice/session-1.scope", 500, "of the active unit session-1.scope"),
        ("0::/system.slice/batch.service", 1, "of the unit batch.service"),
        ("0::/", 500, "outside every unit"),
    ],
)
def test_any_other_process_is_refused(host, cgroup, ppid, owner):
    proc, gpus, _running = host
    proc.add(400, ppid=ppid, argv=["python3", "train.py"], cgroup=cgroup)
    gpus.claim(400, 0, 2000)
    (problem,) = check(host, ["0"]).problems
    assert f"GPU 0 ({UUID0}) holds 2000 MiB of pid 400 'python3' {owner};" in problem


def test_memory_of_a_pid_this_host_cannot_see_refuses_the_host_as_one_in_another_pid_namespace(host):
    """A container host: the driver names the engine's processes by PIDs of the host's namespace. Stopping "that
    process" is no advice there: the message says why the host cannot be managed and what to do."""
    _proc, gpus, _running = host
    gpus.stuck.add(999)
    gpus.claim(999, 1, 3000)
    (problem,) = check(host, ["1"]).problems
    assert problem.startswith(
        f"{LABEL} cannot be managed from this host: the NVIDIA driver lists pid 999 on GPU 1 ({UUID1}) (3000 MiB), "
        "which this host's /proc does not show: this host runs in a PID namespace other than the driver's."
    )
    assert "NVIDIA/nvidia-docker#1483" in problem and "a healthy engine fails its gate" in problem
    assert "--pid=host" in problem and "sglang_service_gpu_pids_visible: true" in problem


def test_a_pid_this_host_cannot_see_that_stays_listed_is_refused_after_listing_again(host):
    proc, gpus, running = host
    gpus.stuck.add(999)
    gpus.claim(999, 1, 3000)
    options = {"unit": UNIT, "running_units": running, "label": LABEL, "proc_root": str(proc.root)}
    verdict = check_gpu_list(["1"], gpus()[1], parse_layout(1), relist=gpus, relist_timeout=0.3, **options)
    assert gpus.queries > 2
    assert [holder["pid"] for holder in verdict.holders] == [999]
    (problem,) = verdict.problems
    assert "the NVIDIA driver lists pid 999 on GPU 1" in problem and "does not show" in problem


def test_a_holder_that_exits_between_the_listing_and_the_look_at_proc_is_not_refused(host):
    """A restarting unit's schedulers: listed on the GPU, then gone from /proc by the time their cgroup is read."""
    proc, gpus, _running = host
    for pid in (214, 215):
        gpus.stuck.add(pid)
        gpus.claim(pid, 0, 10949)
    proc.add(301, ppid=1, argv=["sglang::scheduler_TP0"], cgroup=f"0::/system.slice/{UNIT}")
    gpus.claim(301, 1, 10949)

    def listing_then_exit(backend, run_command):
        listed = gpus(backend, run_command)
        gpus.stuck.clear()
        return listed

    systemctl = FakeSystemctl({UNIT: "activating"})
    facts, problems, _warnings = inspect_gpu_list(
        params(), systemctl, query=listing_then_exit, booted=lambda: True, proc_root=str(proc.root)
    )
    assert problems == []
    assert [holder["pid"] for holder in facts["holders"]] == [301]
    assert gpus.queries == 2


def test_a_holder_out_of_every_unit_as_it_exits_is_not_refused_once_the_gpus_no_longer_list_it(host):
    """A restarting unit's scheduler read from /proc as it exits: its cgroup is gone, so it shows outside every unit
    (or its cgroup removed before it was reaped); a moment later the GPU listing no longer shows it."""
    proc, gpus, running = host
    proc.add(213, ppid=1, argv=["python3", "-m", "sglang.launch_server"], cgroup="0::/")
    proc.add(214, ppid=213, argv=["sglang::scheduler_TP0"], cgroup="0::/")
    gpus.claim(214, 0, 10949)

    def relist():
        proc.remove(214)
        return gpus()

    options = {"unit": UNIT, "running_units": running, "label": LABEL, "proc_root": str(proc.root)}
    verdict = check_gpu_list(["0"], gpus()[1], parse_layout(1), relist=relist, **options)
    assert verdict.problems == [] and verdict.holders == []


def test_a_holder_out_of_reach_that_stays_listed_is_refused_as_proc_shows_it_after_listing_again(host):
    proc, gpus, running = host
    proc.add(400, ppid=1, argv=["python3", "train.py"], cgroup="0::/")
    gpus.claim(400, 0, 2000)

    def relist():
        proc.add(400, ppid=1, argv=["python3", "train.py"], cgroup="0::/system.slice/batch.service")
        return gpus()

    options = {"unit": UNIT, "running_units": running, "label": LABEL, "proc_root": str(proc.root)}
    verdict = check_gpu_list(["0"], gpus()[1], parse_layout(1), relist=relist, relist_timeout=0.3, **options)
    (problem,) = verdict.problems
    assert f"GPU 0 ({UUID0}) holds 2000 MiB of pid 400 'python3' of the unit batch.service;" in problem
    assert [holder["unit"] for holder in verdict.holders] == ["batch.service"]


def test_without_a_unit_every_holder_is_refused(host):
    proc, gpus, _running = host
    proc.add(101, ppid=1, argv=["sglang::scheduler"], cgroup=f"0::/system.slice/{UNIT}")
    gpus.claim(101, 0, 100)
    (problem,) = check(host, ["0"], unit=None).problems
    assert problem.startswith(f"{LABEL} must name free GPUs: GPU 0 ({UUID0}) holds 100 MiB of pid 101")


def test_every_reason_is_reported_at_once(host):
    proc, gpus, _running = host
    proc.add(201, ppid=1, argv=["simgpu-claim"], cgroup="0::/system.slice/t-foreign.service")
    gpus.claim(201, 1, 4001)
    problems = check(host, ["1", "1", "9"], tp_size=2).problems
    assert [problem.split(":")[0] for problem in problems] == [
        f"{LABEL} must name GPUs this host has",
        f"{LABEL} must name each GPU once",
        f"{LABEL} must name GPUs that no process outside {UNIT} holds",
    ]


def test_mig_devices_give_one_cuda_device(tmp_path):
    inventory = query_gpus("nvml", nvml=FakeNvml(mig_host()))[1]
    layout = parse_layout(1)
    assert check_gpu_list([MIG_B], inventory, layout, unit=UNIT, proc_root=str(tmp_path)).problems == []
    verdict = check_gpu_list([MIG_A, MIG_B], inventory, parse_layout(2), unit=UNIT, proc_root=str(tmp_path))
    assert verdict.cuda_devices == 1
    assert verdict.problems[0].endswith(
        f"and the list gives it 1 ({MIG_A}, {MIG_B}): a CUDA process enumerates a single MIG device; "
        f"got [{MIG_A}, {MIG_B}]"
    )
    # The MIG device's own holder (pid 4242 in no /proc here) is named with the device.
    assert f"lists pid 4242 on GPU 0 MIG device 0 ({MIG_A}) (30000 MiB)" in verdict.problems[1]


def test_gpus_whose_processes_cannot_be_listed_are_warned_about(tmp_path):
    devices = mig_host()
    devices[1].fail["processes"] = NOT_SUPPORTED
    inventory = query_gpus("nvml", nvml=FakeNvml(devices))[1]
    verdict = check_gpu_list(["1"], inventory, parse_layout(1), unit=UNIT, proc_root=str(tmp_path))
    assert verdict.problems == []
    assert verdict.warnings == [
        "gpus: the processes on GPU 1 (GPU-bbbb) cannot be listed (Not Supported); whether another process holds "
        "its memory is not checked"
    ]


def params(**overrides) -> dict:
    return {"devices": ["0", "1"], "tp_size": 2, "extra_args": [], "unit": "sglang-qwen", "label": LABEL, **overrides}


def test_the_module_entry_reads_the_host(host):
    proc, gpus, _running = host
    proc.add(201, ppid=1, argv=["simgpu-claim"], cgroup="0::/system.slice/t-foreign.service")
    gpus.claim(201, 1, 4001)
    systemctl = FakeSystemctl({"t-foreign.service": "active", UNIT: "active"})
    facts, problems, warnings = inspect_gpu_list(
        params(), systemctl, query=gpus, booted=lambda: True, proc_root=str(proc.root)
    )
    assert facts["backend"] == "nvml" and facts["needed"] == 2 and facts["cuda_devices"] == 2
    assert [device["index"] for device in facts["devices"]] == [0, 1]
    assert len(problems) == 1 and "of the active unit t-foreign.service" in problems[0]
    assert facts["problems"] == problems and warnings == []
    assert ["systemctl", "list-units"] == systemctl.calls[0][:2]


def test_the_module_entry_refuses_when_the_gpus_cannot_be_listed(host):
    def broken(backend, run_command):
        raise GpuQueryError("no GPU backend worked: NVML: missing; nvidia-smi: missing")

    facts, problems, _warnings = inspect_gpu_list(params(), FakeSystemctl(), query=broken, booted=lambda: True)
    assert facts == {}
    assert problems == [
        f"{LABEL} cannot be checked against this host's GPUs: no GPU backend worked: NVML: missing; nvidia-smi: missing"
    ]


# -- a host that cannot see the driver's PIDs (a container with a PID namespace of its own) --------------------------


def test_a_container_host_is_refused_unless_its_gpu_pids_are_said_to_be_visible(host):
    proc, gpus, running = host
    options = {"unit": UNIT, "running_units": running, "label": LABEL, "proc_root": str(proc.root)}
    verdict = check_gpu_list(["0"], gpus()[1], parse_layout(1), container="lxc", **options)
    (problem,) = verdict.problems
    assert problem.startswith(
        f"{LABEL} cannot be managed from this host: it runs in a container (lxc, systemd-detect-virt --container)"
    )
    assert "sglang_service_gpu_pids_visible: true" in problem
    visible = check_gpu_list(["0"], gpus()[1], parse_layout(1), container="lxc", pids_visible=True, **options)
    assert visible.problems == []


def test_evidence_of_unseen_pids_refuses_even_where_they_are_said_to_be_visible(host):
    proc, gpus, running = host
    gpus.stuck.add(1000123)
    gpus.claim(1000123, 0, 44000)
    options = {"unit": UNIT, "running_units": running, "label": LABEL, "proc_root": str(proc.root)}
    verdict = check_gpu_list(
        ["0"], gpus()[1], parse_layout(1), container="systemd-nspawn", pids_visible=True, **options
    )
    (problem,) = verdict.problems
    assert "lists pid 1000123 on GPU 0" in problem
    assert "this host runs in a systemd-nspawn container (sglang_service_gpu_pids_visible is true, but this shows" in (
        problem
    )


@pytest.mark.parametrize(
    ("answer", "expected"),
    [((0, "lxc\n", ""), "lxc"), ((1, "none\n", ""), None), ((0, "none\n", ""), None), (OSError(2, "no such"), None)],
)
def test_detect_container_reads_systemd_detect_virt(answer, expected):
    calls = []

    def run(args):
        calls.append(args)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert detect_container(run) == expected
    assert calls == [["systemd-detect-virt", "--container"]]


def test_inspect_gpu_list_asks_systemd_detect_virt_and_takes_pids_visible(host):
    proc, gpus, _running = host

    class Runner(FakeSystemctl):
        def __call__(self, args):
            if args[0] == "systemd-detect-virt":
                self.calls.append(list(args))
                return 0, "docker\n", ""
            return super().__call__(args)

    refused = inspect_gpu_list(params(), Runner({}), query=gpus, booted=lambda: True, proc_root=str(proc.root))[1]
    assert len(refused) == 1 and "it runs in a container (docker" in refused[0]
    accepted = inspect_gpu_list(
        {**params(), "pids_visible": True}, Runner({}), query=gpus, booted=lambda: True, proc_root=str(proc.root)
    )[1]
    assert accepted == []
