"""RestartChain: every step and failure of the restart chain, driven through fakes (no host).

The stand-ins (restart_world.py): systemd is a scripted unit that moves with a fake clock (a start loads for a
while, then turns active; faults crash it, exit it with status 0, or keep it in a restart loop); the reaper, the
probe, the snapshot store and the lock are recording stand-ins.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from fake_sglang_server import FakeSglang
from restart_world import (
    KEY,
    PARAMS,
    SERVER_ARGS,
    UNIT,
    Start,
    World,
    failed_probe,
    healthy_probe,
    holder,
    step_names,
    validated,
)

from ansible_collections.llmops.inference.plugins.module_utils.gpu import Gpu, GpuProcess
from ansible_collections.llmops.inference.plugins.module_utils.known_good import SnapshotError
from ansible_collections.llmops.inference.plugins.module_utils.probe import SglangProbe
from ansible_collections.llmops.inference.plugins.module_utils.probe_base import ProbeHost
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import ProbeSettings
from ansible_collections.llmops.inference.plugins.module_utils.reaper import ReapError, ReapInputError
from ansible_collections.llmops.inference.plugins.module_utils.redact import MASK
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    POLL_S,
    ChainInputError,
    parse_chain_options,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.result import FLAT_ALIASES, flat_view
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangClient, SglangError
from ansible_collections.llmops.inference.plugins.module_utils.systemd import UnitState

# -- the passing chain -------------------------------------------------------------------------------------


def test_active_unit_is_drained_reaped_started_gated_and_snapshotted():
    world = World()
    result = world.run()

    assert result["healthy"] is True, result["msg"]
    assert result["changed"] is True
    assert result["gate"]["failed_step"] is None and result["gate"]["failed_tier"] is None
    assert step_names(result) == [
        "lock",
        "unit",
        "gateway_drain",
        "stop",
        "reset_failed",
        "reap",
        "start",
        "gate",
        "snapshot",
        "unlock",
    ]
    assert all(step["status"] in ("ok", "skipped") for step in result["steps"])
    assert world.unit.verbs() == ["stop", "reset-failed", "start"]
    assert ["systemctl", "start", "--no-block", UNIT] in world.unit.calls
    assert result["service"]["stop_mode"] == "drain"
    assert "stopped through its ExecStop drain" in result["steps"][3]["detail"]
    assert world.locks.kinds() == ["acquire", "release"]
    assert (
        result["service"]["main_pid"] == 4000
        and result["service"]["active_state"] == "active"
        and result["service"]["n_restarts"] == 0
    )
    assert result["service"]["snapshot"] == "snapshot saved"
    save = world.store.saves[0]
    assert save["sources"] == {"python": "/opt/sglang/venv/bin/python"}
    assert save["meta"]["patch_state_id"] == "pristine" and save["meta"]["main_pid"] == 4000
    assert save["files"]["unit"] == "/etc/systemd/system/sglang-t.service"
    assert result["msg"].startswith(f"{UNIT} passed its gate after ")
    assert result["diff"]["before"] == "ActiveState=active\nSubState=running\nMainPID=3999\n"
    assert result["diff"]["after"] == "ActiveState=active\nSubState=running\nMainPID=4000\n"


def test_reaper_gets_the_unit_leftovers_then_the_orphans_on_the_units_gpus_with_the_release_wait():
    world = World()
    world.run()
    (scope1, unit_params, check1), (scope2, orphan_params, check2) = world.reaper.calls
    assert (scope1, scope2, check1, check2) == ("unit", "orphans", False, False)
    assert unit_params == {"gpus": ["0", "1"], "grace": 10, "timeout": 60, "unit": UNIT, "wait_released": False}
    assert orphan_params == {
        "gpus": ["0", "1"],
        "grace": 10,
        "timeout": 60,
        "match": "^sglang::",
        "orphans_only": True,
        "released_below_mib": 1024,
    }


def test_probe_runs_on_the_units_gpus_without_a_window_of_its_own_and_within_the_chains_window():
    world = World()
    world.run()
    settings = world.probe.calls[0]
    assert settings["unit"] == UNIT and settings["expected_gpus"] == ["0", "1"]
    assert settings["expected_model"] == "Qwen/Qwen3-8B"
    assert settings["stability_window"] == 0.0
    assert 0 < settings["wait_timeout"] <= 5
    assert "soak_requests" not in settings


def test_the_window_starts_at_the_first_200_and_overlaps_the_probe():
    world = World(starts=[Start(load=2.0)])
    result = world.run()
    assert result["healthy"] is True
    # ready at 2.0 s after the start, the window ends 5 s later; the probe's 1.5 s lie inside it.
    gate = next(step for step in result["steps"] if step["name"] == "gate")
    assert gate["elapsed_s"] == pytest.approx(7.0, abs=0.15)
    assert gate["detail"] == "passed, holding a stability window of 5 s"
    assert max(world.clock.sleeps) <= POLL_S + 1e-9


def test_zero_window_still_reads_the_unit_once_after_the_probe():
    world = World()
    result = world.run(stability_window=0)
    assert result["healthy"] is True
    gate = next(step for step in result["steps"] if step["name"] == "gate")
    assert gate["elapsed_s"] == pytest.approx(2.0 + 1.5, abs=0.15)
    assert gate["detail"] == "passed, holding a stability window of 0 s"


def test_inactive_unit_is_not_stopped_and_a_failed_one_is_reset():
    for state in ("inactive", "failed"):
        world = World(state)
        result = world.run()
        assert result["healthy"] is True
        assert world.unit.verbs() == ["reset-failed", "start"]
        assert result["service"]["stop_mode"] == "none"


def test_unit_in_a_restart_loop_is_killed_instead_of_drained():
    world = World("loop")
    result = world.run()
    assert result["healthy"] is True
    assert world.unit.verbs() == ["kill", "stop", "reset-failed", "start"]
    assert ["systemctl", "kill", "--signal=SIGKILL", UNIT] in world.unit.calls
    assert result["service"]["stop_mode"] == "kill"
    loop = "in a restart loop (ActiveState=activating, SubState=auto-restart, NRestarts=4)"
    assert loop in result["steps"][3]["detail"]


def test_a_restarted_unit_caught_active_while_its_engine_is_not_ready_is_killed():
    refused = SglangError("cannot reach http://127.0.0.1:30000/ready: refused")
    for answer, why in ((refused, "refused"), (503, "HTTP 503")):
        world = World("restarted")
        world.ready_answers = [answer]
        result = world.run()
        assert result["healthy"] is True
        assert world.unit.verbs() == ["kill", "stop", "reset-failed", "start"]
        assert result["service"]["stop_mode"] == "kill"
        detail = result["steps"][3]["detail"]
        assert "in a restart loop (ActiveState=active, SubState=running, NRestarts=2; the engine is not ready" in detail
        assert why in detail


def test_a_restarted_unit_whose_engine_is_ready_is_drained():
    world = World("restarted")
    result = world.run()
    assert world.unit.verbs() == ["stop", "reset-failed", "start"]
    assert result["service"]["stop_mode"] == "drain"


def test_holders_found_by_the_reap_make_the_probe_soak():
    world = World("loop", orphan_reaps=[{"reaped": [holder(7001), holder(7002, "sglang::scheduler_TP1")]}])
    result = world.run()
    assert result["healthy"] is True
    assert world.probe.calls[0]["soak_requests"] == 3
    assert result["gate"]["soak"] == 3
    assert [entry["pid"] for entry in result["gpu"]["reaped"]] == [7001, 7002]
    reap = next(step for step in result["steps"] if step["name"] == "reap")
    assert "reaped 2 holder(s): 7001 'sglang::scheduler_TP0'" in reap["detail"]


def test_after_an_unclean_stop_the_probe_the_host_runs_soaks_on_the_engine():
    """The gate's settings go through ProbeSettings and SglangProbe as on a host (the unit, GPUs and processes read
    from stand-ins): the soak's generations reach the engine."""
    server = FakeSglang().start()
    schedulers = [4001, 4002]
    running = UnitState(UNIT, "loaded", "active", "running", "success", 4000, 0, {"ExecMainPID": "4000"})
    gpus = [
        Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, 69001, [GpuProcess(pid, 69000)])
        for i, pid in enumerate(schedulers)
    ]

    def host_probe(settings):
        checked = ProbeSettings(**settings).validate()
        return SglangProbe(
            checked,
            SglangClient(checked.url, timeout=checked.timeout),
            ProbeHost(
                unit_reader=lambda unit: running,
                unit_pids=lambda unit: [4000, *schedulers],
                gpu_reader=lambda: gpus,
                process_reader=lambda pid: SimpleNamespace(
                    pid=pid, state="S", ppid=4000, title="sglang::scheduler", is_alive=True
                ),
            ),
        ).run()

    try:
        world = World("loop", orphan_reaps=[{"reaped": [holder(7001)]}])
        world.probe = host_probe
        result = world.run(url=server.url)
    finally:
        server.stop()
    assert result["healthy"] is True, result
    assert result["gate"]["soak"] == PARAMS["soak"] == 3
    soak = next(tier for tier in result["gate"]["tiers"] if tier["name"] == "soak")
    assert soak["status"] == "ok" and soak["reason"].startswith("3 requests"), soak
    generations = [request for request in server.requests if request["path"] == "/generate"]
    assert len(generations) == 1 + 3  # the gate's generation, then the soak's


def test_daemon_reload_runs_before_the_start_only_when_systemd_asks():
    world = World(need_reload=True)
    result = world.run()
    assert world.unit.verbs() == ["stop", "reset-failed", "daemon-reload", "start"]
    assert "daemon_reload" in step_names(result)
    assert "daemon_reload" not in step_names(World().run())


def test_without_a_readiness_gate_the_chain_asks_health_until_it_answers_200():
    world = World(starts=[Start(load=1.0)])
    world.health_answers = [503, 503, 200]
    result = world.run(ready_when_active=False)
    assert result["healthy"] is True
    assert world.health_answers == [200]


def test_a_start_job_that_begins_late_is_waited_for():
    world = World()
    original = world.unit.__call__
    late = {"until": None}

    def delayed(args):
        if args[:2] == ["systemctl", "start"]:
            late["until"] = world.clock() + 1.0
            late["args"] = args
            return 0, "", ""
        if late["until"] is not None and world.clock() >= late["until"]:
            late["until"] = None
            original(late["args"])
        return original(args)

    world.runner = delayed
    result = world.run()
    assert result["healthy"] is True, result["msg"]


# -- failures before the start -----------------------------------------------------------------------------


def test_busy_lock_fails_before_anything_is_stopped():
    world = World()
    world.locks.busy = True
    result = world.run()
    assert result["healthy"] is False and result["changed"] is False
    assert result["gate"]["failed_step"] == "lock"
    assert "is held by controller=other, play=deploy; gave up after waiting 2.0 s" in result["msg"]
    assert world.unit.verbs() == []
    assert result["service"]["journal"] == []


def test_a_lock_token_from_the_caller_is_checked_and_not_released():
    world = World()
    result = world.run(lock={**PARAMS["lock"], "token": "tok-1"})
    assert result["healthy"] is True
    assert world.locks.kinds() == []
    assert {call[0] for call in world.locks.calls} == {"held_with"}
    assert result["service"]["lock"] == {"path": PARAMS["lock"]["path"], "taken": False}

    stale = World().run(lock={**PARAMS["lock"], "token": "stale"})
    assert stale["gate"]["failed_step"] == "lock"
    assert "is not held with the given lock.token" in stale["gate"]["reason"]


# Checks that answer "held" before the lock is lost: the caller's token is checked at the lock step too; then the
# checks before the stop and reset-failed pass, and the one before the reap finds the lock gone.
@pytest.mark.parametrize(("token", "checks"), [(None, 2), ("tok-1", 3)])
def test_a_lock_lost_mid_chain_stops_it_before_the_next_step_and_says_where_the_unit_was_left(token, checks):
    world = World()
    world.locks.lost_after = checks
    lock = {**PARAMS["lock"], "token": token} if token else PARAMS["lock"]
    result = world.run(lock=lock)
    assert result["healthy"] is False
    assert result["gate"]["failed_step"] == "lock_lost"
    assert f"lost the host lock {PARAMS['lock']['path']}" in result["gate"]["reason"]
    assert "stopped before the reap step and changed nothing after it" in result["gate"]["reason"]
    assert "start" not in world.unit.verbs() and "stop" in world.unit.verbs()
    assert result["service"]["active_state"] == "inactive"
    assert "reap" not in [step["name"] for step in result["steps"]]


def test_a_lock_lost_while_the_gate_waits_for_the_load_stops_the_chain_there():
    world = World(starts=[Start(load=30.0)])
    checks = []
    original = world.locks.held_with

    def held_with(path, token):
        checks.append(world.clock())
        return original(path, token) and world.clock() < 10.0  # lost 10 s into the run, while the engine loads

    world.locks.held_with = held_with
    result = world.run()
    assert result["gate"]["failed_step"] == "lock_lost"
    assert "stopped during the gate step" in result["gate"]["reason"]
    names = [step["name"] for step in result["steps"]]
    assert names.index("gate") < names.index("lock_lost") < names.index("unlock")
    assert len(checks) > 6  # the gate checked at each of its polls
    assert world.locks.kinds() == ["acquire", "status", "release"]


def test_a_retake_replaces_a_lost_token_with_a_lock_taken_at_once():
    world = World()
    result = world.run(lock={**PARAMS["lock"], "token": "stale", "retake": True})
    assert result["healthy"] is True, result["msg"]
    assert ("acquire", PARAMS["lock"]["path"], {"play": "test"}, 0) in world.locks.calls
    assert world.locks.kinds() == ["status", "acquire", "release"]
    assert result["service"]["lock"]["retaken"] is True


def test_a_retake_that_finds_another_holder_changes_nothing():
    world = World()
    world.locks.busy = True
    result = world.run(lock={**PARAMS["lock"], "token": "stale", "retake": True})
    assert result["gate"]["failed_step"] == "lock"
    assert "no longer holds" in result["gate"]["reason"] and "cannot be taken anew" in result["gate"]["reason"]
    assert world.unit.verbs() == []


def test_unreapable_gpu_memory_fails_the_chain_and_leaves_the_unit_stopped():
    evidence = {"gpu": 1, "uuid": "GPU-1", "pid": 7001, "state": "D", "mib": 44000, "evidence": "pid 7001 in state D"}
    error = ReapError(
        "GPU 1 needs a reset or a reboot: pid 7001 (state D) holds 44000 MiB after SIGKILL",
        {"reaped": [holder()], "unreapable": [evidence]},
    )
    world = World(orphan_reaps=[error])
    result = world.run()
    assert result["healthy"] is False
    assert result["gate"]["failed_step"] == "reap"
    assert result["gate"]["reason"].startswith("GPU 1 needs a reset or a reboot: pid 7001 (state D) holds 44000 MiB")
    assert "Evidence: GPU 1 (GPU-1): pid 7001 state D holds 44000 MiB" in result["gate"]["reason"]
    assert result["gpu"]["unreapable"] == [evidence]
    assert "start" not in world.unit.verbs()
    assert result["service"]["active_state"] == "inactive"
    assert result["msg"].startswith(f"{UNIT} restart chain failed at reap: GPU 1 needs a reset or a reboot")
    assert ("release", PARAMS["lock"]["path"], "tok-1") in world.locks.calls


def test_unreapable_entries_in_a_returned_result_also_stop_the_chain():
    entry = {"gpu": 0, "uuid": "GPU-0", "pid": None, "state": None, "mib": 30000, "evidence": "no process holds it"}
    world = World(orphan_reaps=[{"reaped": [], "unreapable": [entry]}])
    result = world.run()
    assert result["gate"]["failed_step"] == "reap"
    assert result["gate"]["reason"].startswith("GPU 0 needs a reset or a reboot: no process holds it")
    assert "start" not in world.unit.verbs()


def test_memory_not_released_fails_at_reap_without_a_start():
    world = World(orphan_reaps=[ReapError("GPU memory not released within timeout 60s: GPU 0 uses 44001 MiB", {})])
    result = world.run()
    assert result["gate"]["failed_step"] == "reap"
    assert "GPU memory not released" in result["msg"]
    assert "start" not in world.unit.verbs()


def test_a_unit_still_running_after_the_stop_is_refused_by_the_reaper():
    world = World(unit_reaps=[ReapInputError("unit", "sglang-t.service is active (running); stop it first")])
    result = world.run()
    assert result["gate"]["failed_step"] == "reap" and "stop it first" in result["gate"]["reason"]
    assert "start" not in world.unit.verbs()


def test_failed_stop_and_failed_start_are_named():
    world = World()
    original = world.unit.__call__
    world.runner = lambda args: (
        (1, "", "Job for sglang-t.service canceled.") if args[1:2] == ["stop"] else original(args)
    )
    result = world.run()
    assert result["gate"]["failed_step"] == "stop"
    assert "systemctl stop sglang-t.service failed (rc=1): Job for sglang-t.service canceled." in result["msg"]

    world = World()
    original = world.unit.__call__
    world.runner = lambda args: (
        (5, "", "Unit sglang-t.service is masked.") if args[1:2] == ["start"] else original(args)
    )
    result = world.run()
    assert result["gate"]["failed_step"] == "start" and "is masked" in result["gate"]["reason"]


def test_unit_not_found_fails_before_the_stop():
    world = World(loaded=False)
    result = world.run()
    assert result["gate"]["failed_step"] == "unit"
    assert "not found (LoadState=not-found)" in result["gate"]["reason"]
    assert world.unit.verbs() == []
    assert result["changed"] is False


# -- failed gates ------------------------------------------------------------------------------------------


def test_crash_during_the_load_fails_the_unit_tier_at_the_first_restart_with_the_start_limit():
    world = World(starts=[Start(load=30.0, crash_at=1.0)])
    result = world.run()
    assert result["healthy"] is False
    assert result["gate"]["failed_step"] is None and result["gate"]["failed_tier"] == "unit"
    assert result["gate"]["reason"].startswith("unit restarting: MainPID 4000 -> 0, NRestarts 0 -> 1")
    assert world.clock.now < 3.0
    assert result["msg"].startswith(f"{UNIT} failed its gate: unit tier: unit restarting")
    assert (
        "unit: ActiveState=activating SubState=auto-restart Result=success NRestarts=1; Restart=on-failure retries at "
        "most StartLimitBurst=3 starts within StartLimitIntervalSec=3660 s, then leaves it failed" in result["msg"]
    )
    assert "last 30 journal lines:" in result["msg"]
    assert world.store.saves == []
    assert world.probe.calls == []


def test_engine_that_exits_0_three_seconds_after_its_first_200_fails_the_default_window():
    world = World(starts=[Start(load=2.0, exit0_after_ready=3.0)])
    result = world.run()
    assert result["healthy"] is False
    assert result["gate"]["failed_tier"] == "unit"
    assert re.fullmatch(
        rf"unit {UNIT} is inactive \(exited 0\): its main process exited with status 0 3\.[01] s after the server "
        r"first answered /health, and Restart=on-failure does not restart a clean exit \(within the stability window "
        r"of 5 s after the first /health 200\)",
        result["gate"]["reason"],
    ), result["gate"]["reason"]
    tiers = {tier["name"]: tier["status"] for tier in result["gate"]["tiers"]}
    assert tiers["unit"] == "failed" and tiers["generate"] == "ok"
    assert world.store.saves == []
    # Caught one poll after the exit, not at the end of the window.
    gate = next(step for step in result["steps"] if step["name"] == "gate")
    assert gate["elapsed_s"] == pytest.approx(2.0 + 3.0, abs=0.15)


def test_an_exit_after_the_window_is_not_the_gates_business():
    world = World(starts=[Start(load=2.0, exit0_after_ready=6.0)])
    assert world.run()["healthy"] is True


def test_a_restart_within_the_window_fails_early():
    world = World(starts=[Start(load=2.0, crash_at=4.0)])
    result = world.run()
    assert result["gate"]["failed_tier"] == "unit"
    assert "unit restarting: MainPID 4000 -> 0, NRestarts 0 -> 1" in result["gate"]["reason"]
    assert "within the stability window of 5 s" in result["gate"]["reason"]


def test_not_ready_within_the_ready_timeout():
    world = World(starts=[Start(load=999.0)])
    result = world.run(ready_timeout=3)
    assert result["gate"]["failed_tier"] == "unit"
    assert result["gate"]["reason"] == f"unit {UNIT} not ready within 3 s: ActiveState=activating, SubState=start-post"
    # Asked once whether the model is on the GPUs (it is: the engine is just slow), then judged on the unit.
    assert [call["tiers"] for call in world.probe.calls] == [["gpu"]]
    assert result["gate"]["attempts"] == 1


def test_a_start_that_never_gets_ready_and_holds_no_gpu_memory_is_a_model_that_did_not_load():
    """SGLang's readiness gate keeps the unit activating while the model never loads: the gpu tier says why,
    and a fresh start may load it."""
    world = World(starts=[Start(load=999.0), Start(load=2.0)], probe=[failed_probe(), healthy_probe()])
    result = world.run(ready_timeout=3)
    assert result["healthy"] is True
    assert result["gate"]["attempts"] == 2
    first = result["gate"]["per_attempt"][0]
    assert first["failed_tier"] == "gpu"
    assert first["reason"] == (
        "unit active but its processes hold 0 MiB on GPU 0: model not loaded "
        f"(unit {UNIT} not ready within 3 s: ActiveState=activating, SubState=start-post)"
    )
    assert world.probe.calls[0]["tiers"] == ["gpu"] and "tiers" not in world.probe.calls[1]


def test_health_that_never_answers_200_fails_the_health_tier():
    world = World()
    world.health_answers = [503]
    result = world.run(ready_when_active=False, ready_timeout=2)
    assert result["gate"]["failed_tier"] == "health"
    assert "/health did not answer 200 within 2 s (HTTP 503)" in result["gate"]["reason"]


def test_an_active_unit_whose_health_never_answers_and_holds_no_model_is_retried_on_the_gpu_tier():
    world = World(probe=[failed_probe(), healthy_probe()])
    world.health_answers = [503]
    result = world.run(ready_when_active=False, ready_timeout=2, max_starts=1)
    assert result["gate"]["failed_tier"] == "gpu"
    assert result["gate"]["reason"] == (
        "unit active but its processes hold 0 MiB on GPU 0: model not loaded "
        "(/health did not answer 200 within 2 s (HTTP 503))"
    )
    assert [call["tiers"] for call in world.probe.calls] == [["gpu"]]


def test_a_probe_failure_other_than_gpu_is_not_retried():
    world = World(probe=[failed_probe("generate", "generation timed out: no response from /generate within 60.0 s")])
    result = world.run()
    assert result["gate"]["attempts"] == 1
    assert world.unit.verbs().count("start") == 1
    assert result["msg"].startswith(f"{UNIT} failed its gate: generate tier: generation timed out")


def test_a_model_that_did_not_load_once_is_recovered_by_another_start():
    world = World(probe=[failed_probe(), healthy_probe()])
    result = world.run()
    assert result["healthy"] is True
    assert result["gate"]["attempts"] == 2
    assert world.unit.verbs() == ["stop", "reset-failed", "start", "stop", "reset-failed", "start"]
    assert [gate["healthy"] for gate in result["gate"]["per_attempt"]] == [False, True]
    assert len(world.store.saves) == 1


def test_a_model_that_never_loads_fails_on_the_gpu_tier_after_the_start_limit_and_stays_put():
    world = World(probe=[failed_probe()])
    result = world.run()
    assert result["healthy"] is False
    assert result["gate"]["attempts"] == 3
    assert world.unit.verbs().count("start") == 3
    # The last attempt is left running: no stop after the last gate.
    assert world.unit.verbs()[-1] == "start"
    assert result["gate"]["failed_tier"] == "gpu"
    assert result["gate"]["reason"].endswith("(after 3 starts, the unit's start limit; the last one is left running)")
    assert result["msg"].startswith(f"{UNIT} failed its gate: gpu tier: unit active but its processes hold 0 MiB")
    assert result["service"]["active_state"] == "active"
    assert world.store.saves == []


def test_max_starts_overrides_the_units_start_limit():
    world = World(probe=[failed_probe()])
    assert world.run(max_starts=1)["gate"]["attempts"] == 1


def test_failed_snapshot_is_a_failed_chain():
    world = World()
    world.store.error = SnapshotError("/etc/llmops/sglang-t.env does not exist; nothing known-good to record")
    result = world.run()
    assert result["healthy"] is False and result["gate"]["failed_step"] == "snapshot"
    assert "the known-good snapshot was not saved: /etc/llmops/sglang-t.env does not exist" in result["gate"]["reason"]
    assert ("release", PARAMS["lock"]["path"], "tok-1") in world.locks.calls


def test_no_snapshot_without_a_known_good_root():
    world = World()
    params = {**PARAMS, "known_good": {}}
    result = world.run(**params)
    assert result["healthy"] is True and result["service"]["snapshot"] is None
    assert world.store.saves == []


# -- secrets, check mode, options ----------------------------------------------------------------------------


def test_the_key_never_leaves_the_chain():
    world = World(
        starts=[Start(load=30.0, crash_at=1.0)],
        journal=[SERVER_ARGS, f"ExecStart=/x --api-key {KEY}", "Authorization: Bearer other-token"],
    )
    result = world.run()
    text = repr(result)
    assert KEY not in text and "other-token" not in text
    assert f"api_key='{MASK}'" in result["msg"]
    probe_world = World(probe=[failed_probe("generate", f"/generate returned HTTP 401: bad key {KEY}")])
    assert KEY not in repr(probe_world.run(max_starts=1))


def test_check_mode_reports_the_plan_and_changes_nothing():
    world = World("loop", orphan_reaps=[{"reaped": [holder()]}])
    result = world.run(check_mode=True)
    assert result["changed"] is True and result["healthy"] is None
    assert world.unit.verbs() == []
    assert world.probe.calls == [] and world.store.saves == []
    assert [call[0] for call in world.locks.calls] == ["status"]
    plan = result["plan"]
    assert plan["stop"]["mode"] == "kill"
    assert plan["reap"]["orphans"][0]["pid"] == 7001
    assert plan["start"] == f"systemctl start --no-block {UNIT}"
    assert "stability window of 5 s" in plan["gate"]
    assert all(check for _scope, _params, check in world.reaper.calls)
    assert result["diff"]["after"] == "ActiveState=active\nSubState=running\nMainPID=(new)\n"
    assert result["msg"].startswith(f"check mode: would restart {UNIT}: in a restart loop")


def test_check_mode_before_the_first_install_plans_the_first_start():
    world = World("inactive", loaded=False)
    result = world.run(check_mode=True)
    assert result["gate"].get("failed_step") is None and result["changed"] is True, result
    assert result["plan"]["stop"]["mode"] == "none"
    assert result["plan"]["start"] == f"systemctl start --no-block {UNIT}"
    assert world.unit.verbs() == [] and world.store.saves == []


def test_check_mode_names_gpu_memory_nobody_can_free():
    entry = {"gpu": 1, "uuid": "GPU-1", "pid": 7001, "state": "D", "mib": 44000, "evidence": "pid 7001 in state D"}
    world = World("inactive", orphan_reaps=[{"reaped": [], "unreapable": [entry]}])
    result = world.run(check_mode=True)
    assert result["gpu"]["unreapable"] == [entry]
    assert "would stop before the start" in result["plan"]["reap"]["unreapable"]
    assert world.unit.verbs() == []


def test_check_mode_of_a_running_unit_does_not_ask_to_reap_its_processes():
    world = World()
    result = world.run(check_mode=True)
    assert [scope for scope, _params, _check in world.reaper.calls] == ["orphans"]
    assert "reaped after the stop" in result["plan"]["reap"]["unit"]


@pytest.mark.parametrize(
    ("overrides", "option", "message"),
    [
        ({"stability_window": -1}, "stability_window", "stability_window must be at least 0, got -1"),
        ({"soak": -2}, "soak", "soak must be at least 0, got -2"),
        ({"max_starts": 0}, "max_starts", "max_starts must be at least 1, got 0"),
        ({"reap": {"timeout": 0}}, "reap.timeout", "reap.timeout must be greater than 0, got 0"),
        ({"url": "127.0.0.1:30000"}, "url", "url must be an absolute http:// or https:// URL"),
        ({"lock": {"token": "x"}}, "lock.token", "lock.token needs lock.path"),
        ({"lock": {"path": "run/x.lock"}}, "lock.path", "lock.path must be an absolute path"),
        ({"known_good": {"root": "/var/lib/x"}}, "known_good.files", "known_good.files must name the files"),
        ({"probe": {"max_new_tokens": 0}}, "probe.max_new_tokens", "probe.max_new_tokens must be at least 1"),
        ({"unit": " "}, "unit", "unit must name the systemd unit"),
    ],
)
def test_bad_options_name_themselves(overrides, option, message):
    with pytest.raises(ChainInputError) as refused:
        parse_chain_options(validated({**PARAMS, **overrides}))
    assert refused.value.option == option
    assert message in str(refused.value)


def test_timespans_read_as_systemctl_prints_them():
    from ansible_collections.llmops.inference.plugins.module_utils.systemd import parse_timespan

    assert parse_timespan("1h 1min") == 3660
    assert parse_timespan("500ms") == 0.5
    assert parse_timespan("0") == 0
    assert parse_timespan("infinity") is None
    assert parse_timespan("soon") is None


# -- the deprecated flat keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("check_mode", [False, True])
def test_every_flat_key_of_before_the_nesting_is_still_returned_with_its_value(check_mode):
    """Until 2.0.0: the one test that reads the flat keys; the nested result is what the rest reads."""
    result = World(probe=[failed_probe()]).run(check_mode=check_mode, max_starts=2)
    for flat, nested in FLAT_ALIASES.items():
        group, key = nested.split(".")
        assert result[flat] == result[group][key], flat
    assert result["service"]["name"] == UNIT == result["unit"]
    flat_keys_before = {
        "unit", "healthy", "failed_step", "failed_tier", "reason", "tiers", "main_pid", "n_restarts", "active_state",
        "sub_state", "result", "gpu_memory_mib", "model", "speculative", "generation", "snapshot", "journal",
        "start", "start_limit", "stop_mode", "reaped", "unreapable", "soak", "attempts", "gates", "lock", "gateway",
        "changed", "steps", "elapsed_s", "diff", "warnings", "msg",
    }  # fmt: skip
    assert flat_keys_before <= set(result)
    assert result["failed_tier"] == ("gpu" if not check_mode else None)


def test_flat_view_reads_the_nested_groups_under_their_flat_names():
    nested = World(probe=[failed_probe()]).run(max_starts=2)
    only_nested = {key: value for key, value in nested.items() if key not in FLAT_ALIASES}
    view = flat_view(only_nested)
    assert {flat: view[flat] for flat in FLAT_ALIASES} == {flat: nested[flat] for flat in FLAT_ALIASES}
    assert flat_view(None) == {}
