from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from fake_proc import PF_KTHREAD, FakeClock, FakeGpus, FakeKernel, FakeProc, FakeSystemctl
from fake_sglang_server import SLOW_DAY_S

from ansible_collections.llmops.inference.plugins.module_utils.device_holders import device_holders
from ansible_collections.llmops.inference.plugins.module_utils.gpu import Gpu, GpuProcess, GpuQueryError
from ansible_collections.llmops.inference.plugins.module_utils.procs import is_alive
from ansible_collections.llmops.inference.plugins.module_utils.reaper import (
    GpuReaper,
    ReapError,
    ReapHost,
    ReapInputError,
    parse_options,
)

OWN_PID = 700
SESSION = "0::/user.slice/user-0.slice/session-1.scope"
REAP_UNIT = "0::/system.slice/t-reap.service"
FOREIGN_UNIT = "0::/system.slice/t-foreign.service"
OTHER_SGLANG_UNIT = "0::/system.slice/sglang-other.service"
IGNORE_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
)


@pytest.fixture
def world(tmp_path):
    """Failure 1 after `systemctl stop` with KillMode=process, plus bystanders that must survive.

    t-reap.service (inactive) left schedulers 101 (GPU 0) and 102 (GPU 1) and a detokenizer 103;
    201 holds GPU 0 in the active t-foreign.service; 202 is a plain orphan holding GPU 1 outside any
    unit; 203 is an orphaned `sglang::scheduler` of the active sglang-other.service.
    """
    clock = FakeClock()
    proc = FakeProc(tmp_path / "proc")
    kernel = FakeKernel(proc, clock)
    gpus = FakeGpus(proc, kernel)
    systemctl = FakeSystemctl(
        {
            "t-reap.service": "inactive",
            "t-foreign.service": "active",
            "sglang-other.service": "active",
            "ssh.service": "active",
            "session-1.scope": "active",
        }
    )
    proc.add(1, ppid=0, argv=["/sbin/init"], cgroup="0::/init.scope")
    proc.add(2, ppid=0, argv=[], comm="kthreadd", flags=PF_KTHREAD)
    proc.add(500, ppid=1, argv=["sshd: root@notty"], cgroup="0::/system.slice/ssh.service")
    proc.add(600, ppid=500, argv=["/bin/sh", "-c", "python3 AnsiballZ_nvidia_reap.py"], cgroup=SESSION)
    proc.add(OWN_PID, ppid=600, argv=["/usr/bin/python3", "AnsiballZ_nvidia_reap.py"], cgroup=SESSION)
    proc.add(101, argv=["sglang::scheduler_TP0"], cgroup=REAP_UNIT, start_time=2000)
    proc.add(102, argv=["sglang::scheduler_TP1"], cgroup=REAP_UNIT, start_time=2001)
    proc.add(103, argv=["sglang::detokenizer"], cgroup=REAP_UNIT)
    proc.add(201, argv=["simgpu-claim", "--hold"], cgroup=FOREIGN_UNIT)
    proc.add(202, argv=["simgpu-claim", "--hold"], cgroup="0::/")
    proc.add(203, argv=["sglang::scheduler"], cgroup=OTHER_SGLANG_UNIT)
    gpus.claim(101, 0, 40000)
    gpus.claim(102, 1, 40000)
    gpus.claim(201, 0, 1000)
    gpus.claim(202, 1, 500)
    gpus.claim(203, 0, 300)
    kernel.ignore(101, signal.SIGTERM)
    kernel.ignore(102, signal.SIGTERM)

    def reaper(booted=True, **params):
        return GpuReaper(
            parse_options(params),
            systemctl,
            ReapHost(
                proc_root=str(proc.root),
                own_pid=OWN_PID,
                kill=kernel.kill,
                clock=clock,
                sleep=clock.sleep,
                query=gpus,
                holders=device_holders,
                booted=lambda: booted,
            ),
        )

    return SimpleNamespace(clock=clock, proc=proc, kernel=kernel, gpus=gpus, systemctl=systemctl, reaper=reaper)


def signalled(world) -> set:
    return {pid for pid, _signal, _at in world.kernel.sent}


def by_pid(entries) -> dict:
    return {entry["pid"]: entry for entry in entries}


def test_unit_and_match_reap_only_the_units_leftovers(world):
    result = world.reaper(unit="t-reap.service", match="^sglang::", grace=2, timeout=10).run()
    reaped = by_pid(result["reaped"])
    assert set(reaped) == {101, 102}
    assert reaped[101]["signals"] == ["SIGTERM", "SIGKILL"]
    assert reaped[101]["exited"] is True
    assert reaped[101]["gpus"] == [0]
    assert reaped[101]["used_mib"] == 40000
    assert reaped[101]["unit"] == "t-reap.service"
    assert reaped[101]["title"] == "sglang::scheduler_TP0"
    assert signalled(world) == {101, 102}
    assert result["changed"] is True
    assert result["unkillable"] == []
    assert result["released_mib"] == 80000
    assert [g["used_mib"] for g in result["gpus_after"]] == [1 + 1000 + 300, 1 + 500]
    assert result["unit_state"]["active_state"] == "inactive"
    assert "skipped" not in result, "a truthy `skipped` would make Ansible report the task as skipped"


def test_sigterm_ignoring_holder_is_killed_within_grace_plus_half_a_second(world):
    result = world.reaper(unit="t-reap.service", grace=2, timeout=10).run()
    kills = [(pid, name, at) for pid, name, at in world.kernel.sent if name == "SIGKILL"]
    assert {pid for pid, _signal, _at in kills} == {101, 102}
    assert all(at == pytest.approx(2.0, abs=0.11) for _pid, _signal, at in kills)
    assert result["elapsed_s"] <= 2.5
    assert max(world.clock.sleeps) <= 0.2


def test_sigterm_obeying_holder_gets_no_sigkill(world):
    world.kernel.ignore(101)
    result = world.reaper(pids=[101], grace=5).run()
    assert result["reaped"][0]["signals"] == ["SIGTERM"]
    assert world.clock.now < 0.5


def test_sigkill_first_skips_the_grace_period(world):
    result = world.reaper(unit="t-reap", signal="KILL", grace=30).run()
    assert {e["pid"]: e["signals"] for e in result["reaped"]} == {101: ["SIGKILL"], 102: ["SIGKILL"]}
    assert world.clock.now < 0.5


def test_unit_alone_takes_every_holder_in_its_cgroup(world):
    result = world.reaper(unit="t-reap.service", grace=1).run()
    assert set(by_pid(result["reaped"])) == {101, 102}
    assert 103 not in signalled(world), "a process without GPU memory is no candidate"


def test_match_with_orphans_only_protects_another_active_units_process(world):
    result = world.reaper(match="^sglang::", orphans_only=True, grace=1).run()
    assert set(by_pid(result["reaped"])) == {101, 102}
    excluded = by_pid(result["excluded"])
    assert "belongs to active unit sglang-other.service" in excluded[203]["reason"]
    assert 202 not in excluded, "processes outside the scope are not listed"
    assert signalled(world) == {101, 102}


def test_selectors_narrow_each_other(world):
    world.proc.add(104, ppid=OWN_PID, argv=["sglang::scheduler_TP2"], cgroup=REAP_UNIT)
    world.gpus.claim(104, 0, 10)
    result = world.reaper(unit="t-reap.service", match="TP1$", grace=1).run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [102]
    result = world.reaper(unit="t-reap.service", orphans_only=True, grace=1).run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [101, 102], "104's parent is alive: not an orphan"


def test_orphans_only_alone_reaps_every_unprotected_orphan(world):
    result = world.reaper(orphans_only=True, grace=1).run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [101, 102, 202]
    assert {e["pid"] for e in result["excluded"]} == {201, 203}


def test_match_searches_the_command_line_too(world):
    result = world.reaper(match="--hold", grace=1).run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [202]


def test_explicit_pids_override_only_the_other_unit_rule(world):
    result = world.reaper(pids=[201, 103, 999, OWN_PID], grace=1).run()
    assert [e["pid"] for e in result["reaped"]] == [201]
    excluded = by_pid(result["excluded"])
    assert excluded[103]["reason"] == "holds no memory on the selected GPUs"
    assert excluded[999]["reason"] == "no such process"
    assert excluded[OWN_PID]["reason"] == "the module's own process"
    assert signalled(world) == {201}


def test_safety_rules_always_apply(world):
    for pid in (1, 2, 600, OWN_PID):
        world.gpus.claim(pid, 0, 5)
    world.proc.add(40, ppid=2, argv=[], comm="kworker/0:1")
    world.proc.add(41, ppid=0, argv=[], comm="irq/9-acpi", flags=PF_KTHREAD)
    world.gpus.claim(40, 0, 5)
    world.gpus.claim(41, 0, 5)
    result = world.reaper(match=".", pids=[2, 600, 40, 41], grace=1).run()
    excluded = by_pid(result["excluded"])
    assert excluded[1]["reason"] == "PID 1 (the init system) is never signalled"
    assert excluded[600]["reason"] == "an ancestor of the module's process"
    assert excluded[2]["reason"] == excluded[40]["reason"] == excluded[41]["reason"] == "kernel thread"
    assert not signalled(world) & {1, 2, 40, 41, 500, 600, OWN_PID}


def test_ancestor_and_own_process_are_skipped_when_matched(world):
    world.gpus.claim(OWN_PID, 0, 5)
    world.gpus.claim(500, 0, 5)
    result = world.reaper(match="python3|sshd", grace=1).run(check_mode=True)
    excluded = by_pid(result["excluded"])
    assert excluded[OWN_PID]["reason"] == "the module's own process"
    assert excluded[500]["reason"] == "an ancestor of the module's process"
    assert result["reaped"] == []


@pytest.mark.parametrize("state", ["active", "activating", "deactivating", "reloading"])
def test_running_unit_is_refused_without_allow_active(world, state):
    world.systemctl.units["t-reap.service"] = state
    with pytest.raises(ReapInputError, match=f"^unit: t-reap.service is {state}.*allow_active") as err:
        world.reaper(unit="t-reap.service").run()
    assert err.value.option == "unit"
    assert world.kernel.sent == []


def test_allow_active_reaps_a_running_units_processes(world):
    world.systemctl.units["t-reap.service"] = "active"
    result = world.reaper(unit="t-reap.service", allow_active=True, grace=1).run()
    assert set(by_pid(result["reaped"])) == {101, 102}


def test_unit_needs_systemd(world):
    with pytest.raises(ReapInputError, match=r"^unit: systemd is not the init system"):
        world.reaper(unit="t-reap.service", booted=False).run()
    result = world.reaper(pids=[201], booted=False, grace=1).run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [201]


def test_unloaded_unit_warns(world):
    result = world.reaper(unit="t-typo.service").run(check_mode=True)
    assert result["reaped"] == []
    assert result["warnings"] == ["unit t-typo.service is not loaded (LoadState=not-found)"]


def test_check_mode_lists_candidates_and_signals_nothing(world):
    result = world.reaper(unit="t-reap.service", match="^sglang::", grace=2).run(check_mode=True)
    assert result["changed"] is True
    assert [(e["pid"], e["signals"], e["exited"]) for e in result["reaped"]] == [(101, [], False), (102, [], False)]
    assert world.kernel.sent == []
    assert result["gpus_after"] == result["gpus_before"]
    assert "pid 101: 40000 MiB" in result["diff"]["before"]
    assert "pid 101" not in result["diff"]["after"]
    assert "GPU 0 GPU-00000000-0000-4000-8000-000000000000: 1301 / 81559 MiB used" in result["diff"]["after"]


def test_second_run_is_not_changed(world):
    assert world.reaper(unit="t-reap.service", match="^sglang::", grace=1).run()["changed"] is True
    world.kernel.sent.clear()
    again = world.reaper(unit="t-reap.service", match="^sglang::", grace=1).run()
    assert again["changed"] is False
    assert again["reaped"] == []
    assert world.kernel.sent == []


def test_waits_for_the_memory_release_that_lags_the_exit(world):
    world.gpus.release_lag = 1.5
    result = world.reaper(pids=[101, 102], grace=1, timeout=10).run()
    assert result["released_mib"] == 80000
    assert world.clock.now == pytest.approx(1.0 + 1.5, abs=0.25)


def test_memory_not_released_in_time_fails_naming_the_holders(world):
    world.gpus.release_lag = 100
    with pytest.raises(ReapError) as err:
        world.reaper(pids=[101], grace=1, timeout=3).run()
    assert str(err.value) == (
        "GPU memory not released within timeout 3s: GPU 0 still uses 40000 MiB more than its listed processes hold: "
        "memory of reaped pid 101 (40000 MiB) the driver has not released yet"
    )
    assert err.value.result["reaped"][0]["exited"] is True
    assert err.value.result["changed"] is True
    assert err.value.result["unreapable"] == [], "memory still being released is not judged before kill_timeout"
    assert world.clock.now == pytest.approx(1.0 + 3.0, abs=0.25)


def test_a_reaped_pid_still_listed_is_named(world):
    world.gpus.stuck.add(101)  # the driver keeps listing it after it is gone
    with pytest.raises(ReapError, match=r"not released within timeout 3s: pid 101 still holds 40000 MiB on GPU 0"):
        world.reaper(pids=[101], grace=1, timeout=3).run()


def test_waits_for_a_small_holders_memory_the_driver_still_releases(world):
    world.gpus.release_lag = 1.5
    result = world.reaper(pids=[202], grace=5, timeout=10).run()
    assert result["reaped"][0]["signals"] == ["SIGTERM"]
    assert [gpu["used_mib"] for gpu in result["gpus_after"]] == [1 + 40000 + 1000 + 300, 1 + 40000]
    assert world.clock.now == pytest.approx(1.5, abs=0.25), "500 MiB is below unaccounted_threshold_mib"
    assert result["unreapable"] == [] and result["warnings"] == []


def test_memory_of_a_reaped_process_that_is_never_released_is_unreapable_after_kill_timeout(world):
    world.gpus.release_lag = 1000
    with pytest.raises(ReapError) as err:
        world.reaper(pids=[102], gpus=["1"], grace=1, timeout=30, kill_timeout=2).run()
    assert str(err.value) == (
        "GPU 1 needs a reset or a reboot: 40001 MiB used that no listed process holds (more than 1024 MiB)"
    )
    assert world.clock.now == pytest.approx(1 + 2, abs=0.3), "judged after kill_timeout, not the 30 s timeout"


def test_a_small_remainder_that_stays_is_a_warning_after_kill_timeout(world):
    world.gpus.release_lag = 1000
    result = world.reaper(pids=[202], gpus=["1"], grace=1, timeout=30, kill_timeout=2).run()
    assert result["unreapable"] == []
    assert result["warnings"] == [
        "GPU 1 still uses 500 MiB more than its listed processes hold: memory of reaped pid 202 (500 MiB) the driver "
        "has not released yet, 2 s on (below unaccounted_threshold_mib, so not judged unreapable)"
    ]
    assert world.clock.now == pytest.approx(2, abs=0.3)


def test_check_mode_does_not_judge_memory_the_driver_is_still_releasing(world):
    world.gpus.release_lag = 1.5
    world.kernel.kill(101, signal.SIGKILL)
    result = world.reaper(unit="t-reap.service", grace=1).run(check_mode=True)
    assert result["unreapable"] == [] and result["reset_gpus"] == []
    assert not any("needs a reset" in warning for warning in result["warnings"])
    assert world.clock.now == pytest.approx(1.5, abs=0.25)


def test_d_state_process_is_reported_unkillable_and_unreapable(world):
    world.proc.set_state(101, "D")
    with pytest.raises(ReapError) as err:
        world.reaper(pids=[101], grace=1, timeout=2).run()
    assert str(err.value) == (
        "GPU 0 needs a reset or a reboot: pid 101 'sglang::scheduler_TP0' (state D, parent 1) "
        "still alive 2.0 s after SIGKILL, holding 40000 MiB"
    )
    result = err.value.result
    assert result["unkillable"] == [{"pid": 101, "title": "sglang::scheduler_TP0", "state": "D"}]
    assert result["unreapable"] == [
        {
            "gpu": 0,
            "uuid": "GPU-00000000-0000-4000-8000-000000000000",
            "pid": 101,
            "state": "D",
            "ppid": 1,
            "title": "sglang::scheduler_TP0",
            "mib": 40000,
            "evidence": "pid 101 'sglang::scheduler_TP0' (state D, parent 1) still alive 2.0 s after SIGKILL, "
            "holding 40000 MiB",
        }
    ]
    assert result["reset_gpus"] == [0]
    assert [name for _pid, name, _at in world.kernel.sent] == ["SIGTERM", "SIGKILL"]
    assert "still alive after SIGKILL: 101 (state D)" in result["warnings"]


def test_a_holder_surviving_sigkill_is_judged_after_kill_timeout_not_timeout(world):
    world.proc.set_state(101, "D")
    with pytest.raises(
        ReapError, match=r"^GPU 0 needs a reset or a reboot: pid 101 .* still alive 3\.0 s after SIGKILL"
    ):
        world.reaper(pids=[101], grace=1, timeout=60, kill_timeout=3).run()
    assert world.clock.now == pytest.approx(1 + 3, abs=0.25), "fails fast, not after the 60 s timeout"


def test_unkillable_is_only_reported_with_fail_on_unreapable_false(world):
    world.proc.set_state(101, "D")
    result = world.reaper(pids=[101], grace=1, timeout=1, wait_released=False, fail_on_unreapable=False).run()
    assert result["unkillable"][0]["pid"] == 101
    assert result["reaped"][0]["exited"] is False
    assert [entry["pid"] for entry in result["unreapable"]] == [101]
    assert result["warnings"][-1].startswith("GPU 0 needs a reset or a reboot: pid 101 ")


def test_zombie_holding_memory_is_unreapable_and_never_signalled(world):
    world.proc.add(104, argv=["python", "-m", "sglang.launch_server"], cgroup=REAP_UNIT)
    world.proc.add(105, ppid=104, argv=["sglang::scheduler_TP2"], cgroup=REAP_UNIT, state="Z")
    world.gpus.claim(105, 0, 20000)
    world.gpus.stuck.add(105)
    with pytest.raises(ReapError) as err:
        world.reaper(unit="t-reap.service", match="^sglang::", grace=1, timeout=30, kill_timeout=2).run()
    assert str(err.value) == (
        "GPU 0 needs a reset or a reboot: pid 105 'sglang::scheduler_TP2' is a zombie (state Z, parent 104) "
        "holding 20000 MiB"
    )
    result = err.value.result
    assert [(e["pid"], e["state"], e["ppid"], e["mib"]) for e in result["unreapable"]] == [(105, "Z", 104, 20000)]
    assert by_pid(result["excluded"])[105]["reason"] == "already exited (state Z)"
    assert set(by_pid(result["reaped"])) == {101, 102}
    assert signalled(world) == {101, 102}, "the zombie and its parent are left alone"
    assert world.clock.now == pytest.approx(1 + 2, abs=0.3), "judged after kill_timeout, not the 30 s timeout"


def test_memory_held_with_no_process_left_is_unreapable(world):
    world.gpus.claim(999, 1, 30000)
    world.gpus.stuck.add(999)
    world.gpus.unlisted[1] = 8000
    with pytest.raises(ReapError) as err:
        world.reaper(pids=[102], gpus=["1"], grace=1, timeout=30, kill_timeout=2).run()
    assert str(err.value) == (
        "GPU 1 needs a reset or a reboot: pid 999 no longer exists, yet the driver lists it holding 30000 MiB, "
        "8001 MiB used that no listed process holds (more than 1024 MiB)"
    )
    assert [(e["gpu"], e["pid"], e["state"], e["mib"]) for e in err.value.result["unreapable"]] == [
        (1, 999, None, 30000),
        (1, None, None, 8001),
    ]
    assert err.value.result["reset_gpus"] == [1]
    assert signalled(world) == {102}


def test_memory_released_within_kill_timeout_is_not_unreapable(world):
    world.gpus.release_lag = 1.5
    world.gpus.unlisted[0] = 500
    result = world.reaper(pids=[101], grace=1, timeout=10, kill_timeout=5).run()
    assert result["unreapable"] == [] and result["reset_gpus"] == []
    assert world.clock.now == pytest.approx(1 + 1.5, abs=0.25)


def test_unaccounted_threshold_decides_what_counts_as_held(world):
    world.gpus.unlisted[1] = 3000
    result = world.reaper(pids=[102], gpus=["1"], grace=1, unaccounted_threshold_mib=4096).run()
    assert result["unreapable"] == []
    with pytest.raises(ReapError, match="3001 MiB used that no listed process holds"):
        world.reaper(pids=[102], gpus=["1"], grace=1, kill_timeout=1).run()


def test_check_mode_lists_what_already_looks_unreapable_without_failing(world):
    world.proc.add(105, ppid=104, argv=["sglang::scheduler_TP2"], cgroup=REAP_UNIT, state="Z")
    world.gpus.claim(105, 0, 20000)
    world.gpus.stuck.add(105)
    world.proc.set_state(102, "D")
    result = world.reaper(unit="t-reap.service", grace=1).run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [101, 102]
    assert [(e["pid"], e["state"]) for e in result["unreapable"]] == [(105, "Z")]
    assert result["reset_gpus"] == [0]
    assert (
        "pid 102 (sglang::scheduler_TP1) is in uninterruptible sleep (state D) and may survive SIGKILL"
        in (result["warnings"])
    )
    assert result["warnings"][-1].startswith("GPU 0 needs a reset or a reboot: pid 105 ")
    assert world.kernel.sent == []


def test_unknown_process_list_is_warned_about(world):
    gpus = world.gpus

    def query(backend, run_command):
        backend, found = gpus(backend, run_command)
        found[1].processes, found[1].processes_known = [], False
        found[1].add_error("processes", "Insufficient Permissions")
        return backend, found

    reaper = world.reaper(unit="t-reap.service", grace=1)
    reaper.host.query = query
    result = reaper.run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [101]
    assert (
        "GPU 1 (GPU-00000000-0000-4000-8000-000000000001): processes unavailable (Insufficient Permissions); "
        "the processes holding memory on it cannot be found"
    ) in result["warnings"]
    assert result["gpus_before"][1]["errors"] == [{"field": "processes", "error": "Insufficient Permissions"}]


def test_released_below_mib_waits_for_every_selected_gpu(world):
    with pytest.raises(ReapError, match=r"GPU 0 uses 1301 MiB > released_below_mib 1000 \(holders: 201, 203\)"):
        world.reaper(unit="t-reap.service", grace=1, timeout=1, released_below_mib=1000).run()
    world.kernel.sent.clear()
    result = world.reaper(unit="t-reap.service", released_below_mib=2000, timeout=1).run()
    assert result["changed"] is False


def test_gpus_narrow_the_holders(world):
    result = world.reaper(unit="t-reap.service", gpus=["1"], grace=1).run()
    assert [e["pid"] for e in result["reaped"]] == [102]
    assert [g["index"] for g in result["gpus_before"]] == [1]
    result = world.reaper(match="^sglang::", gpus=["GPU-00000000-0000-4000-8000-000000000000"]).run(check_mode=True)
    assert [e["pid"] for e in result["reaped"]] == [101]


def test_unknown_gpu_is_refused_before_any_signal(world):
    with pytest.raises(ReapInputError, match=r"^gpus: unknown GPU '7'") as err:
        world.reaper(unit="t-reap.service", gpus=["7"]).run()
    assert err.value.option == "gpus"
    assert world.kernel.sent == []


def test_device_holders_count_only_when_asked(world):
    world.proc.add(
        301, argv=["python", "cuda_probe.py"], cgroup=REAP_UNIT, fds={4: "/dev/nvidiactl", 5: "/dev/nvidia0"}
    )
    without = world.reaper(unit="t-reap.service").run(check_mode=True)
    assert 301 not in by_pid(without["reaped"])
    result = world.reaper(unit="t-reap.service", include_device_holders=True, grace=1).run()
    holder = by_pid(result["reaped"])[301]
    assert holder["device_files"] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert holder["gpus"] == [] and holder["signals"] == ["SIGTERM"]


def test_a_reused_pid_is_not_signalled(world):
    reaper = world.reaper(pids=[101], grace=1, timeout=1)
    plan = reaper.plan()
    world.proc.set_start_time(101, 99999)
    reaper.plan = lambda: plan
    result = reaper.run()
    assert world.kernel.sent == []
    assert result["changed"] is False
    assert result["reaped"][0]["exited"] is True


def test_gpu_query_failure_is_a_reap_error(world):
    def broken(backend, run_command):
        raise GpuQueryError("no GPU backend worked: NVML: missing; nvidia-smi: missing")

    reaper = world.reaper(pids=[101])
    reaper.host.query = broken
    with pytest.raises(ReapError, match="no GPU backend worked"):
        reaper.run()
    assert world.kernel.sent == []


def test_permission_denied_is_a_reap_error_with_partial_result(world):
    def refuse(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    reaper = world.reaper(pids=[101])
    reaper.host.kill = refuse
    with pytest.raises(ReapError, match="not permitted to signal pid 101") as err:
        reaper.run()
    assert err.value.result["reaped"][0]["pid"] == 101


@pytest.mark.parametrize(
    ("params", "option", "text"),
    [
        ({}, "unit", "no scope selector given"),
        ({"orphans_only": False, "match": ""}, "unit", "no scope selector given"),
        ({"match": "(unclosed"}, "match", "not a valid regular expression"),
        ({"pids": [1]}, "pids", "PID 1"),
        ({"pids": [0]}, "pids", "0 is not a process ID"),
        ({"pids": [-5]}, "pids", "-5 is not a process ID"),
        ({"pids": ["abc"]}, "pids", "'abc' is not a process ID"),
        ({"unit": "x", "grace": -1}, "grace", "must be >= 0"),
        ({"unit": "x", "timeout": -0.5}, "timeout", "must be >= 0"),
        ({"unit": "x", "grace": "soon"}, "grace", "must be a number"),
        ({"unit": "x", "signal": "SIGNOPE"}, "signal", "unknown signal"),
        ({"unit": "x", "backend": "cuda"}, "backend", "not one of auto, nvml, nvidia-smi"),
        ({"unit": "x", "released_below_mib": -1}, "released_below_mib", "must be >= 0"),
        ({"unit": "x", "kill_timeout": 0}, "kill_timeout", "must be > 0 seconds, got 0"),
        ({"unit": "x", "kill_timeout": -2}, "kill_timeout", "must be >= 0 seconds"),
        ({"unit": "x", "unaccounted_threshold_mib": -1}, "unaccounted_threshold_mib", "whole number of MiB >= 0"),
        ({"unit": "x", "unaccounted_threshold_mib": "lots"}, "unaccounted_threshold_mib", "whole number of MiB"),
    ],
)
def test_bad_input_names_the_option(params, option, text):
    with pytest.raises(ReapInputError) as err:
        parse_options(params)
    assert err.value.option == option
    assert str(err.value).startswith(f"{option}: ")
    assert text in str(err.value)


def test_parse_options_defaults():
    options = parse_options({"unit": "t-reap.service", "pids": ["42", 42, 43]})
    assert options.pids == (42, 43)
    assert (options.signal, options.grace, options.timeout, options.wait_released) == (signal.SIGTERM, 10.0, 60.0, True)
    assert options.backend == "auto"
    assert (options.kill_timeout, options.unaccounted_threshold_mib, options.fail_on_unreapable) == (10.0, 1024, True)


def test_real_sigterm_ignoring_process_is_reaped_after_its_grace_not_the_default():
    child = subprocess.Popen(
        [sys.executable, "-c", IGNORE_SIGTERM],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"

        def query(backend, run_command):
            held = [GpuProcess(child.pid, 50)] if is_alive(child.pid) else []
            return "nvml", [Gpu(0, "GPU-real", "test", 100, 1 + 50 * len(held), held)]

        reaper = GpuReaper(
            parse_options({"pids": [child.pid], "grace": 0.5}), None, ReapHost(query=query, booted=lambda: False)
        )
        started = time.monotonic()
        result = reaper.run()
        took = time.monotonic() - started
    finally:
        child.kill()
        child.wait()
    assert result["reaped"][0]["signals"] == ["SIGTERM", "SIGKILL"]
    assert result["released_mib"] == 50
    assert took <= 0.5 + SLOW_DAY_S, f"reaping took {took:.3f}s (grace 0.5 s; the default is 10 s)"


@pytest.mark.parametrize("reserved", [600, 1536])
def test_a_boards_reservation_never_needs_a_reset(world, reserved):
    world.gpus.reserved_mib = reserved  # in NVML v1's used; v2 reports it apart
    result = world.reaper(unit="t-reap.service", grace=1, kill_timeout=1, released_below_mib=1400).run()
    assert sorted(entry["pid"] for entry in result["reaped"]) == [101, 102]
    assert (result["unreapable"], result["reset_gpus"]) == ([], [])
    assert not any("needs a reset" in warning for warning in result["warnings"]), result["warnings"]
    assert [gpu["reserved_mib"] for gpu in result["gpus_after"]] == [reserved, reserved]
    assert [gpu["used_mib"] for gpu in result["gpus_after"]] == [reserved + 1 + 1000 + 300, reserved + 1 + 500]
    assert f"({reserved} reserved by the driver)" in result["diff"]["after"]
