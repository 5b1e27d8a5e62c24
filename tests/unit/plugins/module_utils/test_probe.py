"""SglangProbe: every tier's pass and failure, and wait mode.

HTTP goes to a scripted local server; systemd and GPU readings come from fakes.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest
from fake_nvml import MIG_A, MIG_B, NO_PERMISSION, Device, FakeNvml, mig_host
from fake_proc import FakeClock
from fake_sglang_server import (
    SLOW_DAY_S,
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
from ansible_collections.llmops.inference.plugins.module_utils.gpu_query import query_gpus
from ansible_collections.llmops.inference.plugins.module_utils.probe import SglangProbe
from ansible_collections.llmops.inference.plugins.module_utils.probe_base import ProbeHost
from ansible_collections.llmops.inference.plugins.module_utils.probe_progress import request_count
from ansible_collections.llmops.inference.plugins.module_utils.probe_report import EARLIER_FAILED
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import MAX_POLL_INTERVAL, ProbeSettings
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


class Processes:
    """A process reader: every PID is a live process, unless listed as a zombie or gone."""

    def __init__(self, zombies=(), gone=()):
        self.zombies, self.gone = set(zombies), set(gone)

    def __call__(self, pid):
        if pid in self.gone:
            return None
        state = "Z" if pid in self.zombies else "S"
        return SimpleNamespace(pid=pid, state=state, ppid=1234, title="sglang::scheduler", is_alive=state != "Z")


def make_probe(
    server, unit=UNIT, unit_reader=None, gpus=None, gpu_reader=None, processes=None, clock=None, pids=None, **options
):
    settings = ProbeSettings(url=server.url, unit=unit, **options).validate()
    timing = {"clock": clock, "sleep": clock.sleep} if clock is not None else {}
    host = ProbeHost(
        unit_reader=unit_reader or UnitScript(),
        unit_pids=lambda name: pids or [1234, *SCHEDULERS],
        gpu_reader=gpu_reader or (lambda: loaded_gpus() if gpus is None else gpus),
        process_reader=processes or Processes(),
        **timing,
    )
    return SglangProbe(settings, SglangClient(settings.url, timeout=settings.timeout), host)


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
    assert [(tier["name"], tier["status"]) for tier in result["tiers"]] == [
        ("unit", "ok"),
        ("gpu", "ok"),
        ("progress", "skipped"),
        ("health", "ok"),
        ("model", "ok"),
        ("generate", "ok"),
        ("floors", "ok"),
        ("soak", "skipped"),
    ]
    assert tiers(result)["progress"] == ("skipped", "no progress_window set")
    assert tiers(result)["soak"] == ("skipped", "no soak_requests set")
    assert result["state"] == "serving"
    assert (result["progress"], result["soak"], result["unreapable"], result["reset_gpus"]) == ({}, {}, [], [])
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
        "progress": ("skipped", "not requested"),
        "health": ("ok", "HTTP 200 on /ready"),
        "model": ("skipped", "not requested"),
        "generate": tiers(result)["generate"],
        "floors": ("skipped", "not requested"),
        "soak": ("skipped", "not requested"),
    }
    floors = make_probe(server, unit=None, tiers=["health", "floors"], min_tokens_per_s=1).run()["tiers"]
    assert next(tier for tier in floors if tier["name"] == "floors") == {
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
    assert result["elapsed_s"] < 5, "caught inside the window, not at its end"


def test_window_catches_a_restart_after_a_start_between_restarts(server):
    between = unit_state(pid=0, restarts=3, active="activating", sub="auto-restart", result="exit-code", last_pid=1234)
    reader = UnitScript(between, between, unit_state(pid=1301, restarts=4))
    result = make_probe(server, unit_reader=reader, stability_window=5, poll_interval=0.05).run()
    assert_failed(result, "unit", pattern=r"^unit restarting: MainPID 1234 -> 1301, NRestarts 3 -> 4 within \d\.\d s$")
    assert result["elapsed_s"] < 5, "caught inside the window, not at its end"


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


def test_health_tier_reads_readiness_from_ready_and_never_asks_the_generating_health(server):
    result = make_probe(server).run()
    assert tiers(result)["health"] == ("ok", "HTTP 200 on /ready")
    assert "/ready" in server.paths() and "/health" not in server.paths()


def test_health_tier_fails_while_ready_says_503(server):
    server.routes["/ready"] = json_route({}, status=503)
    assert_failed(
        make_probe(server).run(), "health", "/ready returned HTTP 503 (starting, paused, draining or unhealthy)"
    )
    assert "/health" not in server.paths(), "only a 404 means the server has no /ready"


def test_health_tier_falls_back_to_health_on_a_server_without_ready(server):
    del server.routes["/ready"]
    result = make_probe(server).run()
    assert tiers(result)["health"] == ("ok", "HTTP 200 on /health")
    assert server.paths()[:2] == ["/ready", "/health"]
    server.routes["/health"] = json_route({}, status=503)
    assert_failed(make_probe(server).run(), "health", "/health returned HTTP 503 (starting, draining or unhealthy)")


def test_the_fallback_to_health_is_remembered_for_the_rest_of_a_wait(server):
    del server.routes["/ready"]
    ready_at = time.monotonic() + 1.0
    server.routes["/health"] = callable_route(ReadyAt(ready_at, json_route({}, status=503), json_route({})))
    result = make_probe(server, wait_timeout=30).run()
    assert result["healthy"] is True and result["attempts"] >= 2
    assert server.paths().count("/ready") == 1
    assert server.paths().count("/health") == result["attempts"]


def test_health_unreachable(server):
    server.stop()
    assert_failed(make_probe(server).run(), "health", pattern=r"^cannot reach http://127\.0\.0\.1:\d+/ready: ")


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
    assert time.monotonic() - started < 0.5 + SLOW_DAY_S


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
    server.routes["/ready"] = callable_route(ReadyAt(ready_at, json_route({}, status=503), json_route({})))
    result = make_probe(server, wait_timeout=30).run()
    returned = time.monotonic()
    assert result["healthy"] is True
    assert returned - ready_at < MAX_POLL_INTERVAL + SLOW_DAY_S  # the next poll, not the wait's end (30 s)
    assert 1.0 <= result["waited_s"] < 1.5 + MAX_POLL_INTERVAL + SLOW_DAY_S
    assert result["attempts"] >= 3


def test_wait_polls_at_most_every_poll_interval(server):
    # On a clock that moves only when the probe sleeps: a loaded machine cannot slow the attempts down.
    server.routes["/ready"] = json_route({}, status=503)
    clock = FakeClock()
    result = make_probe(server, clock=clock, wait_timeout=1.0, poll_interval=0.2).run()
    assert_failed(result, "health")
    assert result["attempts"] == 6  # at 0, 0.2, ..., 1.0 s
    assert clock.sleeps == pytest.approx([0.2] * 5)
    assert server.paths().count("/ready") == result["attempts"]


def test_wait_gives_up_at_once_on_a_failed_unit(server):
    reader = UnitScript(unit_state(), unit_state(pid=0, active="failed", sub="failed", result="exit-code"))
    server.routes["/ready"] = json_route({}, status=503)
    started = time.monotonic()
    result = make_probe(server, unit_reader=reader, wait_timeout=60).run()
    assert time.monotonic() - started < SLOW_DAY_S
    # The unit died while the later tiers ran: they keep their own outcome, the unit tier is the verdict.
    assert_failed(result, "unit", pattern="not active: ActiveState=failed", rest_skipped=False)
    assert tiers(result)["health"][0] == "failed"


def test_wait_gives_up_when_the_unit_restarts(server):
    states = [unit_state(pid=1234, restarts=3)] * 4 + [
        unit_state(pid=0, restarts=3, active="activating", sub="auto-restart", result="exit-code"),
        unit_state(pid=1301, restarts=4),
    ]
    server.routes["/ready"] = json_route({}, status=503)
    result = make_probe(server, unit_reader=UnitScript(*states), wait_timeout=60, poll_interval=0.05).run()
    assert result["elapsed_s"] < SLOW_DAY_S
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
    assert time.monotonic() - started < 0.8 + 0.3 + SLOW_DAY_S


# progress -------------------------------------------------------------------------------------------

LABELS = 'model_name="Qwen/Qwen3-8B",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'


def metrics_text(running=0, queued=0, generated=None, processed=None) -> str:
    """/metrics as SGLang 0.5.23 writes it (prometheus_client, the scheduler's labels)."""
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{LABELS}}} {float(running)}",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{LABELS}}} {float(queued)}",
        f"sglang:gen_throughput{{{LABELS}}} 0.0",
    ]
    if generated is not None:
        lines += [
            "# TYPE sglang:generation_tokens_total counter",
            f'sglang:generation_tokens_total{{is_streaming="true",{LABELS}}} {float(generated)}',
            f'sglang:generation_tokens_created{{is_streaming="true",{LABELS}}} 1.7e9',
        ]
    if processed is not None:
        lines.append(f'sglang:realtime_tokens_total{{mode="decode",{LABELS}}} {float(processed)}')
    return "\n".join(lines) + "\n"


class MetricsScript:
    """A /metrics route answering the given texts in turn, then the last one for ever."""

    def __init__(self, *texts):
        self.texts = texts
        self.calls = 0

    def __call__(self, request):
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        return json_route(text) if isinstance(text, str) else text


def progress_probe(server, *texts, clock=None, **options):
    script = MetricsScript(*texts)
    server.routes["/metrics"] = callable_route(script)
    return make_probe(server, clock=clock or FakeClock(), progress_window=10, **options), script


def test_progress_tier_fails_a_hung_engine_with_the_counts_and_the_window(server):
    probe, script = progress_probe(server, metrics_text(running=3, queued=5, generated=480, processed=9000))
    result = probe.run()
    assert_failed(result, "progress", "hung: 3 running, 5 queued, no token generated in 10 s")
    assert result["state"] == "hung"
    assert result["progress"] == {
        "window_s": 10,
        "metrics": True,
        "verdict": "hung",
        "running": 3,
        "queued": 5,
        "generated_tokens": 0.0,
        "processed_tokens": 0.0,
        "observed_s": 10.0,
    }
    assert "/ready" not in server.paths() and "/generate" not in server.paths(), "a hung engine is not asked more"
    assert script.calls == 1 + 20, "one scrape, then one every 0.5 s of the window"


def test_the_tiers_before_progress_count_towards_its_window(server):
    clock = FakeClock()

    listings = []

    def slow_gpu_listing():
        listings.append(clock.now)
        if len(listings) == 1:
            clock.now += 3.0  # the gpu tier's listing takes 3 s (later ones look for unreapable memory)
        return loaded_gpus()

    hung = metrics_text(running=3, queued=5, generated=480, processed=9000)
    probe, script = progress_probe(server, hung, clock=clock, gpu_reader=slow_gpu_listing)
    result = probe.run()
    assert_failed(result, "progress", "hung: 3 running, 5 queued, no token generated in 10 s")
    assert result["progress"]["observed_s"] == 10.0
    assert listings[:2] == [0.0, 10.0], "the window opened before the GPU listing, not after it"
    assert script.calls == 1 + 14, "the opening scrape, then one every 0.5 s of the 7 s left"


def test_progress_tier_names_a_hang_when_its_window_ends_not_at_a_request_timeout(server):
    server.routes["/metrics"] = json_route(metrics_text(running=2, queued=1, generated=10))
    probe = make_probe(server, tiers=["progress"], progress_window=0.6)
    started = time.monotonic()
    result = probe.run()
    took = time.monotonic() - started
    assert result["failed_tier"] == "progress"
    assert 0.6 <= took <= 0.6 + SLOW_DAY_S, f"the progress tier took {took:.3f} s for a 0.6 s window"


def test_progress_tier_passes_as_soon_as_tokens_are_generated(server):
    probe, script = progress_probe(
        server,
        metrics_text(running=3, queued=5, generated=480),
        metrics_text(running=3, queued=5, generated=480),
        metrics_text(running=3, queued=4, generated=530),
    )
    result = probe.run()
    assert result["healthy"] is True, result
    assert tiers(result)["progress"] == (
        "ok",
        "progressing: 50 tokens of finished requests in 1.0 s (3 running, 4 queued)",
    )
    assert (result["progress"]["verdict"], result["progress"]["generated_tokens"]) == ("progressing", 50.0)
    assert script.calls == 3


def test_tokens_of_unfinished_requests_count_as_progress(server):
    probe, _script = progress_probe(
        server,
        metrics_text(running=1, generated=0, processed=1000),
        metrics_text(running=1, generated=0, processed=1040),
    )
    result = probe.run()
    assert tiers(result)["progress"] == ("ok", "progressing: 40 tokens processed in 0.5 s (1 running, 0 queued)")


def test_an_idle_engine_passes_at_once(server):
    clock = FakeClock()
    probe, script = progress_probe(server, metrics_text(), clock=clock)
    result = probe.run()
    assert tiers(result)["progress"] == ("ok", "idle: 0 running, 0 queued")
    assert (script.calls, clock.now) == (1, 0.0)


def test_requests_that_drain_in_the_window_pass(server):
    probe, _script = progress_probe(server, metrics_text(running=2, generated=5), metrics_text(generated=5))
    assert tiers(probe.run())["progress"] == ("ok", "drained: no request running or queued after 0.5 s")


def test_counters_that_go_backwards_fail(server):
    probe, _script = progress_probe(
        server, metrics_text(running=2, generated=500), metrics_text(running=2, generated=3)
    )
    assert_failed(probe.run(), "progress", "token counters went backwards within 10 s (the server restarted?)")


def test_counters_absent_until_the_first_request_finishes_count_as_zero(server):
    probe, _script = progress_probe(server, metrics_text(running=1, queued=2))
    assert_failed(probe.run(), "progress", "hung: 1 running, 2 queued, no token generated in 10 s")


def test_metrics_off_skips_the_progress_tier_unless_required(server):
    del server.routes["/metrics"]
    result = make_probe(server, progress_window=10).run()
    assert result["healthy"] is True
    reason = "/metrics answered HTTP 404 (the server runs without --enable-metrics): progress not judged"
    assert tiers(result)["progress"] == ("skipped", reason)
    assert result["progress"] == {"window_s": 10, "metrics": False}
    required = make_probe(server, progress_window=10, progress_require_metrics=True).run()
    assert_failed(required, "progress", reason)
    assert required["state"] == "not_serving"


def test_metrics_unreachable_fails_the_progress_tier(server):
    server.stop()
    result = make_probe(server, progress_window=10).run()
    assert_failed(result, "progress", pattern=r"^cannot read /metrics: cannot reach http://127\.0\.0\.1:\d+/metrics")


def test_request_counts_add_dp_ranks_and_skip_the_priority_breakdown():
    samples = [
        ({"dp_rank": "0", "tp_rank": "0", "priority": ""}, 3.0),
        ({"dp_rank": "0", "tp_rank": "1", "priority": ""}, 3.0),
        ({"dp_rank": "0", "tp_rank": "0", "priority": "1"}, 2.0),
        ({"dp_rank": "1", "tp_rank": "0", "priority": ""}, 4.0),
    ]
    assert request_count(samples) == 7
    assert request_count([({}, 5.0)]) == 5
    assert request_count([]) == 0


# soak -----------------------------------------------------------------------------------------------


class GenerateScript:
    """A /generate route: healthy answers, except the requests numbered in ``bad`` (1 = the generate tier's)."""

    def __init__(self, bad=None):
        self.bad = bad or {}
        self.calls = 0

    def __call__(self, request):
        self.calls += 1
        if self.calls in self.bad:
            return self.bad[self.calls]
        return stream_route(generation_chunks(HEALTHY_ANSWER, meta_info={"completion_tokens": 8}))


HEALTHY_ANSWER = "2, 3, 5, 7 and 11."


def test_soak_runs_sequential_short_generations_and_reports_their_latencies(server):
    script = GenerateScript()
    server.routes["/generate"] = callable_route(script)
    result = make_probe(server, soak_requests=5, soak_max_new_tokens=4).run()
    assert result["healthy"] is True, result
    assert re.fullmatch(r"5 requests, latency median \d\.\d{3} s, max \d\.\d{3} s", tiers(result)["soak"][1])
    soak = result["soak"]
    assert (soak["requests"], soak["completed"], soak["failed_request"], len(soak["latencies_s"])) == (5, 5, None, 5)
    bodies = [r["body"] for r in server.requests if r["path"] == "/generate"]
    assert [body["sampling_params"]["max_new_tokens"] for body in bodies] == [32, 4, 4, 4, 4, 4]
    assert script.calls == 6


def test_soak_fails_on_the_first_request_that_misses_the_deadline(server):
    script = GenerateScript(bad={4: hang_route()})
    server.routes["/generate"] = callable_route(script)
    result = make_probe(server, soak_requests=10, generate_timeout=0.4).run()
    assert_failed(
        result,
        "soak",
        pattern=r"^soak request 3 of 10 timed out: no response from /generate within 0\.4 s; "
        r"2 before it took latency median \d\.\d{3} s, max \d\.\d{3} s$",
    )
    assert (result["soak"]["failed_request"], result["soak"]["completed"]) == (3, 2)
    assert script.calls == 4, "no request after the one that missed"


def test_soak_fails_a_degenerate_answer(server):
    bang = stream_route([{"text": "!" * 8, "meta_info": {"completion_tokens": 8}}])
    server.routes["/generate"] = callable_route(GenerateScript(bad={2: bang}))
    result = make_probe(server, soak_requests=3).run()
    assert_failed(
        result, "soak", "soak request 1 of 3 returned degenerate output: '!!!!!!!!' (one character repeated 8 times)"
    )


# GPU memory nobody can free, MIG, NVML errors ---------------------------------------------------------


def stopped_unit():
    return UnitScript(unit_state(pid=0, active="inactive", sub="dead"))


def test_an_unhealthy_host_with_memory_held_by_a_zombie_needs_a_gpu_reset(server):
    clock = FakeClock()
    result = make_probe(
        server,
        unit_reader=stopped_unit(),
        gpus=loaded_gpus(held=(44000, 0)),
        processes=Processes(zombies={SCHEDULERS[0]}),
        expected_gpus=["0", "1"],
        clock=clock,
    ).run()
    assert_failed(result, "unit", pattern="not active: ActiveState=inactive")
    assert result["state"] == "needs_gpu_reset"
    assert [(e["gpu"], e["pid"], e["state"], e["mib"]) for e in result["unreapable"]] == [(0, 2001, "Z", 44000)]
    assert result["reset_gpus"] == [0]
    assert result["reset_message"] == (
        "GPU 0 needs a reset or a reboot: pid 2001 'sglang::scheduler' is a zombie (state Z, parent 1234) "
        "holding 44000 MiB"
    )
    assert clock.now == pytest.approx(2.0, abs=0.25), "memory must stay for UNREAPABLE_CONFIRM_S"


def test_memory_the_driver_releases_shortly_is_not_reported(server):
    clock = FakeClock()

    def gpus():
        return loaded_gpus(held=(44000, 0)) if clock.now < 0.5 else loaded_gpus(held=(0, 0))

    result = make_probe(
        server, unit_reader=stopped_unit(), gpu_reader=gpus, processes=Processes(gone={2001}), clock=clock
    ).run()
    assert (result["state"], result["unreapable"]) == ("not_serving", [])
    assert clock.now < 1.0


def test_a_healthy_probe_does_not_look_for_stuck_memory(server):
    reads = []

    def gpus():
        reads.append(1)
        return loaded_gpus()

    result = make_probe(server, gpu_reader=gpus, processes=Processes(gone=set(SCHEDULERS))).run()
    assert (result["healthy"], result["state"], len(reads)) == (True, "serving", 1)


def test_without_the_gpu_tier_no_gpu_is_read_for_a_failed_probe(server):
    server.routes["/ready"] = json_route({}, status=503)
    result = make_probe(server, tiers=["health"], gpu_reader=lambda: pytest.fail("GPUs read")).run()
    assert (result["state"], result["unreapable"]) == ("not_serving", [])


def mig_gpus():
    return query_gpus("nvml", nvml=FakeNvml(mig_host()))[1]


def test_gpu_tier_checks_a_mig_device_by_its_uuid(server):
    result = make_probe(server, gpus=mig_gpus(), pids=[4242], expected_gpus=[MIG_A]).run()
    assert result["healthy"] is True, result
    assert tiers(result)["gpu"] == ("ok", "30000 MiB on GPU 0 MIG device 0")
    assert result["gpu_memory_mib"] == {"0": 30000, MIG_A: 30000, MIG_B: 0, "1": 0}
    assert_failed(
        make_probe(server, gpus=mig_gpus(), pids=[4242], expected_gpus=[MIG_B]).run(),
        "gpu",
        "unit active but its processes hold 0 MiB on GPU 0 MIG device 2 (13 MiB used on the GPU in all): "
        "model not loaded",
    )


def test_gpu_tier_counts_the_devices_an_engine_can_run_on(server):
    assert make_probe(server, gpus=mig_gpus(), pids=[4242], tp_size=1).run()["healthy"] is True
    assert_failed(
        make_probe(server, gpus=mig_gpus(), pids=[4242], tp_size=4).run(), "gpu", "expected 4 GPUs but the host has 3"
    )


def test_gpu_tier_uses_the_gpus_memory_when_its_process_list_is_unavailable(server):
    host = [Device("NVIDIA A10", "GPU-a", 23028, 20001, fail={"processes": NO_PERMISSION})]
    gpus = query_gpus("nvml", nvml=FakeNvml(host))[1]
    result = make_probe(server, gpus=gpus).run()
    assert result["healthy"] is True, result
    assert result["gpu_memory_mib"] == {"0": 20001}
    assert result["gpu_errors"] == [
        {"gpu": 0, "uuid": "GPU-a", "field": "processes", "error": "Insufficient Permissions"}
    ]


def test_gpu_tier_without_a_unit_does_not_take_the_drivers_reservation_for_a_model(server):
    # An idle board whose driver reserves 1536 MiB: NVML v1 reports 1537 MiB used, more than min_gpu_memory_mib.
    idle = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, 1537, reserved_mib=1536) for i in (0, 1)]
    result = make_probe(server, unit=None, gpus=idle).run()
    assert_failed(result, "gpu", "GPU 0 has 1 MiB used: model not loaded")


@pytest.mark.parametrize("reserved", [600, 1536])
def test_an_idle_boards_reservation_is_no_memory_needing_a_reset(server, reserved):
    clock = FakeClock()
    idle = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, reserved + 1, reserved_mib=reserved) for i in (0, 1)]
    result = make_probe(server, unit_reader=stopped_unit(), gpus=idle, expected_gpus=["0", "1"], clock=clock).run()
    assert_failed(result, "unit", pattern="not active: ActiveState=inactive")
    assert (result["state"], result["unreapable"], result["reset_gpus"]) == ("not_serving", [], [])
