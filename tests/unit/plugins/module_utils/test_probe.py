"""SglangProbe: every tier's pass and failure, and wait mode.

HTTP goes to a scripted local server; systemd and GPU readings come from fakes.
"""

from __future__ import annotations

import re
import time

import pytest
from fake_sglang_server import (
    FakeSglang,
    ReadyAt,
    callable_route,
    generation_chunks,
    hang_route,
    healthy_routes,
    json_route,
    stream_route,
)

from ansible_collections.llmops.inference.plugins.module_utils.gpu import Gpu, GpuProcess, GpuQueryError
from ansible_collections.llmops.inference.plugins.module_utils.probe import SglangProbe
from ansible_collections.llmops.inference.plugins.module_utils.probe_report import EARLIER_FAILED
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import ProbeSettings
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangClient
from ansible_collections.llmops.inference.plugins.module_utils.systemd import UnitState

UNIT = "t-probe.service"
SCHEDULERS = (2001, 2002)


def unit_state(*, pid=1234, restarts=0, active="active", sub="running", load="loaded", result="success", last_pid=0):
    return UnitState(
        name=UNIT,
        load_state=load,
        active_state=active,
        sub_state=sub,
        result=result,
        main_pid=pid,
        n_restarts=restarts,
        properties={"ExecMainPID": str(last_pid or pid)},
    )


class UnitScript:
    """A unit reader answering the given states in turn, then the last one for ever."""

    def __init__(self, *states):
        self.states = list(states) or [unit_state()]
        self.calls = 0

    def __call__(self, unit):
        assert unit == UNIT
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return state


def loaded_gpus(held=(69000, 69000), holders=SCHEDULERS, other=0):
    """GPUs where ``holders[i]`` holds ``held[i]`` MiB (none when 0) and another process ``other`` MiB."""
    gpus = []
    for index, mib in enumerate(held):
        processes = [GpuProcess(holders[index], mib)] if mib else []
        if other:
            processes.append(GpuProcess(9999, other))
        gpus.append(Gpu(index, f"GPU-{index}", "NVIDIA H100 80GB HBM3", 81559, mib + other + 1, processes))
    return gpus


@pytest.fixture
def server():
    fake = FakeSglang().start()
    yield fake
    fake.stop()


def make_probe(server, unit=UNIT, unit_reader=None, gpus=None, gpu_reader=None, **options):
    settings = ProbeSettings(url=server.url, unit=unit, **options).validate()
    return SglangProbe(
        settings,
        SglangClient(settings.url, timeout=settings.timeout),
        unit_reader=unit_reader or UnitScript(),
        unit_pids=lambda name: [1234, *SCHEDULERS],
        gpu_reader=gpu_reader or (lambda: loaded_gpus() if gpus is None else gpus),
    )


def tiers(result) -> dict:
    return {tier["name"]: (tier["status"], tier["reason"]) for tier in result["tiers"]}


def assert_failed(result, tier: str, reason: str | None = None, pattern: str | None = None, rest_skipped=True) -> None:
    assert result["healthy"] is False
    assert result["failed_tier"] == tier, result
    if reason is not None:
        assert result["reason"] == reason
    if pattern is not None:
        assert re.search(pattern, result["reason"]), result["reason"]
    names = [entry["name"] for entry in result["tiers"]]
    later_tiers = names[names.index(tier) + 1 :] if rest_skipped else []
    for later in later_tiers:
        assert tiers(result)[later] == ("skipped", EARLIER_FAILED)


# all tiers ------------------------------------------------------------------------------------------


def test_healthy_server_passes_every_tier(server):
    server.routes = healthy_routes(meta_info={"spec_accept_length": 2.4})
    result = make_probe(server, min_tokens_per_s=1, min_accept_length=1.5, expected_model="Qwen/Qwen3-8B").run()
    assert result["healthy"] is True, result
    assert [tier["status"] for tier in result["tiers"]] == ["ok"] * 6
    assert (result["failed_tier"], result["reason"]) == (None, None)
    assert (result["main_pid"], result["n_restarts"], result["active_state"]) == (1234, 0, "active")
    assert result["gpu_memory_mib"] == {"0": 69000, "1": 69000}
    assert result["speculative"] == {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    generation = result["generation"]
    assert generation["text"].startswith("2, 3, 5, 7")
    assert generation["completion_tokens"] == 16
    assert generation["accept_length"] == 2.4
    assert generation["ttft_s"] <= generation["latency_s"]
    assert result["attempts"] == 1
    assert result["waited_s"] == 0.0


def test_tiers_not_requested_are_skipped_and_floors_without_floors_too(server):
    result = make_probe(server, unit=None, tiers=["health", "generate"]).run()
    assert result["healthy"] is True
    assert tiers(result) == {
        "unit": ("skipped", "not requested"),
        "gpu": ("skipped", "not requested"),
        "health": ("ok", "HTTP 200"),
        "model": ("skipped", "not requested"),
        "generate": tiers(result)["generate"],
        "floors": ("skipped", "not requested"),
    }
    assert make_probe(server, unit=None, tiers=["health", "floors"], min_tokens_per_s=1).run()["tiers"][5] == {
        "name": "floors",
        "status": "skipped",
        "reason": "floors need the generate tier",
        "elapsed_s": 0.0,
    }


def test_unit_tier_is_skipped_without_a_unit(server):
    result = make_probe(server, unit=None).run()
    assert tiers(result)["unit"] == ("skipped", "no unit given")
    assert tiers(result)["floors"] == ("skipped", "no floors set")
    assert result["main_pid"] is None


# unit -----------------------------------------------------------------------------------------------


def test_unit_not_found(server):
    result = make_probe(server, unit_reader=UnitScript(unit_state(pid=0, active="inactive", load="not-found"))).run()
    assert_failed(result, "unit", f"unit {UNIT} not found (LoadState=not-found)")


def test_failed_unit(server):
    state = unit_state(pid=0, restarts=5, active="failed", sub="failed", result="exit-code")
    result = make_probe(server, unit_reader=UnitScript(state)).run()
    assert_failed(
        result, "unit", f"unit {UNIT} not active: ActiveState=failed, SubState=failed, Result=exit-code, NRestarts 5"
    )


def test_restart_during_the_probe_fails_the_unit_tier_with_both_numbers(server):
    reader = UnitScript(unit_state(pid=1234, restarts=3), unit_state(pid=1301, restarts=5))
    result = make_probe(server, unit_reader=reader).run()
    assert result["failed_tier"] == "unit"
    assert re.fullmatch(r"unit restarting: MainPID 1234 -> 1301, NRestarts 3 -> 5 within \d+\.\d s", result["reason"])
    assert (result["main_pid"], result["n_restarts"]) == (1301, 5)


def test_stability_window_holds_the_probe_and_catches_a_late_restart(server):
    stable = make_probe(server, stability_window=0.6, poll_interval=0.1)
    started = time.monotonic()
    result = stable.run()
    assert result["healthy"] is True
    assert time.monotonic() - started >= 0.6
    assert re.search(r"stable for 0\.[6-9] s", tiers(result)["unit"][1])

    late = UnitScript(*[unit_state()] * 4, unit_state(pid=1301, restarts=1))
    result = make_probe(server, unit_reader=late, stability_window=5, poll_interval=0.05).run()
    assert result["failed_tier"] == "unit"
    assert result["reason"].startswith("unit restarting: MainPID 1234 -> 1301, NRestarts 0 -> 1 within ")
    assert result["elapsed_s"] < 2


def test_window_catches_a_restart_after_a_start_between_restarts(server):
    between = unit_state(pid=0, restarts=3, active="activating", sub="auto-restart", result="exit-code", last_pid=1234)
    reader = UnitScript(between, between, unit_state(pid=1301, restarts=4))
    result = make_probe(server, unit_reader=reader, stability_window=5, poll_interval=0.05).run()
    assert_failed(result, "unit", pattern=r"^unit restarting: MainPID 1234 -> 1301, NRestarts 3 -> 4 within 0\.\d s$")
    assert result["elapsed_s"] < 1


def test_without_a_window_a_unit_between_restarts_fails_at_once(server):
    between = unit_state(pid=0, restarts=3, active="activating", sub="auto-restart", result="exit-code", last_pid=1234)
    result = make_probe(server, unit_reader=UnitScript(between)).run()
    assert_failed(
        result,
        "unit",
        f"unit {UNIT} not active: ActiveState=activating, SubState=auto-restart, Result=exit-code, NRestarts 3",
    )


# gpu ------------------------------------------------------------------------------------------------


def test_gpu_tier_catches_an_active_unit_without_a_loaded_model(server):
    result = make_probe(server, gpus=loaded_gpus(held=(0, 0))).run()
    assert_failed(
        result,
        "gpu",
        "unit active but its processes hold 0 MiB on GPU 0 (1 MiB used on the GPU in all): model not loaded",
    )
    assert result["gpu_memory_mib"] == {"0": 0, "1": 0}


def test_gpu_tier_counts_only_the_units_processes(server):
    result = make_probe(server, gpus=loaded_gpus(held=(69000, 0), other=40000)).run()
    assert_failed(
        result,
        "gpu",
        "unit active but its processes hold 0 MiB on GPU 1 (40001 MiB used on the GPU in all): model not loaded",
    )


def test_gpu_tier_with_a_count_accepts_any_gpus_of_the_host(server):
    gpus = loaded_gpus(held=(0, 0, 69000, 69000), holders=(1, 2, 2001, 2002))
    assert make_probe(server, gpus=gpus, tp_size=2).run()["healthy"] is True
    result = make_probe(server, gpus=gpus, expected_gpus=3).run()
    assert_failed(result, "gpu", pattern=r"hold 0 MiB on GPU 0 .*: model not loaded$")


def test_gpu_tier_with_a_list_checks_exactly_those_gpus(server):
    gpus = loaded_gpus(held=(69000, 0))
    assert make_probe(server, gpus=gpus, expected_gpus=["0"]).run()["healthy"] is True
    assert_failed(make_probe(server, gpus=gpus, expected_gpus=["GPU-1"]).run(), "gpu", pattern="on GPU 1")
    assert_failed(
        make_probe(server, gpus=gpus, expected_gpus=["7"]).run(), "gpu", pattern=r"^expected_gpus: unknown GPU '7'"
    )


def test_gpu_tier_with_more_expected_gpus_than_present(server):
    result = make_probe(server, tp_size=4).run()
    assert_failed(result, "gpu", "expected 4 GPUs but the host has 2")


def test_gpu_tier_without_a_unit_checks_used_memory(server):
    result = make_probe(server, unit=None, gpus=loaded_gpus(held=(0, 0))).run()
    assert_failed(result, "gpu", "GPU 0 has 1 MiB used: model not loaded")


def test_gpu_query_failure(server):
    def broken():
        raise GpuQueryError("no GPU backend worked: NVML: not found; nvidia-smi: not found")

    result = make_probe(server, gpu_reader=broken).run()
    assert_failed(result, "gpu", pattern=r"^cannot list GPUs: no GPU backend worked")


# health, model --------------------------------------------------------------------------------------


def test_health_503(server):
    server.routes["/health"] = json_route({}, status=503)
    assert_failed(make_probe(server).run(), "health", "/health returned HTTP 503 (starting, draining or unhealthy)")


def test_health_unreachable(server):
    server.stop()
    assert_failed(make_probe(server).run(), "health", pattern=r"^cannot reach http://127\.0\.0\.1:\d+/health: ")


def test_model_tier_falls_back_to_get_model_info(server):
    server.routes["/get_model_info"] = server.routes.pop("/model_info")
    result = make_probe(server, expected_model="Qwen/Qwen3-8B").run()
    assert result["healthy"] is True
    assert result["model"]["model_path"] == "/models/Qwen/Qwen3-8B"
    assert "/get_model_info" in server.paths()


def test_model_tier_matches_expected_model_by_path_tail(server):
    assert make_probe(server, expected_model="Qwen3-8B").run()["healthy"] is True


def test_wrong_model(server):
    result = make_probe(server, expected_model="meta-llama/Llama-3.1-8B").run()
    assert_failed(
        result,
        "model",
        "server serves 'Qwen/Qwen3-8B' (model_path '/models/Qwen/Qwen3-8B', /v1/models ids ['Qwen/Qwen3-8B']), "
        "expected 'meta-llama/Llama-3.1-8B'",
    )


def test_model_info_error(server):
    server.routes["/model_info"] = json_route({"detail": "internal"}, status=500)
    assert_failed(make_probe(server).run(), "model", '/model_info returned HTTP 500: {"detail": "internal"}')


def test_missing_server_info_leaves_speculative_empty(server):
    del server.routes["/server_info"]
    result = make_probe(server).run()
    assert result["healthy"] is True
    assert result["speculative"] == {}


# generate -------------------------------------------------------------------------------------------


def test_generation_that_hangs_times_out(server):
    server.routes["/generate"] = hang_route()
    started = time.monotonic()
    result = make_probe(server, generate_timeout=0.5).run()
    assert_failed(result, "generate", "generation timed out: no response from /generate within 0.5 s")
    assert time.monotonic() - started < 1.5


def test_degenerate_generation(server):
    chunks = [{"text": "!", "meta_info": {"completion_tokens": n}} for n in range(1, 9)]
    server.routes["/generate"] = stream_route(chunks)
    result = make_probe(server).run()
    assert_failed(result, "generate", "degenerate output: '!!!!!!!!' (one character repeated 8 times)")
    assert result["generation"]["text"] == "!!!!!!!!"


def test_empty_generation(server):
    server.routes["/generate"] = stream_route([{"text": "", "meta_info": {"completion_tokens": 0}}])
    assert_failed(make_probe(server).run(), "generate", "empty output (0 completion tokens)")


def test_generation_error(server):
    server.routes["/generate"] = json_route({"error": {"message": "CUDA error: out of memory"}}, status=500)
    assert_failed(make_probe(server).run(), "generate", pattern=r"^generation failed: /generate returned HTTP 500")


def test_expect_regex(server):
    assert make_probe(server, expect_regex=r"\b11\b").run()["healthy"] is True
    result = make_probe(server, expect_regex=r"^Paris").run()
    assert_failed(result, "generate", "output '2, 3, 5, 7 and 11 ar'... does not match expect_regex '^Paris'")


# floors ---------------------------------------------------------------------------------------------


def test_tokens_per_s_floor(server):
    result = make_probe(server, min_tokens_per_s=1e9).run()
    assert_failed(result, "floors", pattern=r"^\d+\.\d tok/s below min_tokens_per_s 1000000000\.0$")


def test_accept_length_floor(server):
    server.routes = healthy_routes(meta_info={"spec_accept_length": 1.8})
    assert_failed(
        make_probe(server, min_accept_length=2.5).run(), "floors", "accept length 1.80 below min_accept_length 2.5"
    )
    assert make_probe(server, min_accept_length=1.5).run()["generation"]["accept_length"] == 1.8


def test_accept_length_floor_without_speculative_decoding(server):
    server.routes["/generate"] = stream_route(generation_chunks("The answer is 2, 3, 5, 7, 11."))
    assert_failed(make_probe(server, min_accept_length=2).run(), "floors", pattern=r"^no spec_accept_length")


# wait mode ------------------------------------------------------------------------------------------


def test_wait_returns_soon_after_the_server_becomes_ready(server):
    ready_at = time.monotonic() + 1.5
    server.routes["/health"] = callable_route(ReadyAt(ready_at, json_route({}, status=503), json_route({})))
    result = make_probe(server, wait_timeout=30).run()
    returned = time.monotonic()
    assert result["healthy"] is True
    assert returned - ready_at < 0.8
    assert 1.0 <= result["waited_s"] <= 2.1
    assert result["attempts"] >= 3


def test_wait_polls_at_most_every_poll_interval(server):
    server.routes["/health"] = json_route({}, status=503)
    result = make_probe(server, wait_timeout=1.0, poll_interval=0.2).run()
    assert_failed(result, "health")
    assert 4 <= result["attempts"] <= 6
    assert server.paths().count("/health") == result["attempts"]


def test_wait_gives_up_at_once_on_a_failed_unit(server):
    reader = UnitScript(unit_state(), unit_state(pid=0, active="failed", sub="failed", result="exit-code"))
    server.routes["/health"] = json_route({}, status=503)
    started = time.monotonic()
    result = make_probe(server, unit_reader=reader, wait_timeout=60).run()
    assert time.monotonic() - started < 1
    # The unit died while the later tiers ran: they keep their own outcome, the unit tier is the verdict.
    assert_failed(result, "unit", pattern="not active: ActiveState=failed", rest_skipped=False)
    assert tiers(result)["health"][0] == "failed"


def test_wait_gives_up_when_the_unit_restarts(server):
    states = [unit_state(pid=1234, restarts=3)] * 4 + [
        unit_state(pid=0, restarts=3, active="activating", sub="auto-restart", result="exit-code"),
        unit_state(pid=1301, restarts=4),
    ]
    server.routes["/health"] = json_route({}, status=503)
    result = make_probe(server, unit_reader=UnitScript(*states), wait_timeout=60, poll_interval=0.05).run()
    assert result["elapsed_s"] < 2
    assert_failed(result, "unit", pattern=r"^unit restarting: MainPID 1234 -> 1301, NRestarts 3 -> 4 within \d")


def test_wait_keeps_going_while_the_unit_is_in_auto_restart(server):
    states = [unit_state(pid=0, restarts=3, active="activating", sub="auto-restart")] * 3 + [
        unit_state(pid=0, restarts=3, active="failed", sub="failed", result="start-limit-hit")
    ]
    result = make_probe(server, unit_reader=UnitScript(*states), wait_timeout=60, poll_interval=0.05).run()
    assert result["attempts"] == 4
    assert_failed(result, "unit", pattern="ActiveState=failed, SubState=failed, Result=start-limit-hit, NRestarts 3$")


def test_generation_hang_in_wait_mode_ends_with_the_wait(server):
    server.routes["/generate"] = hang_route()
    started = time.monotonic()
    result = make_probe(server, wait_timeout=0.8, generate_timeout=0.3).run()
    assert_failed(result, "generate", pattern="timed out")
    assert time.monotonic() - started < 1.8
