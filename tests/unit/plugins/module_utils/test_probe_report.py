"""What one pass over the probe's tiers found: the failed tier, the host's state, the module's result."""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.probe_report import (
    FAILED,
    HUNG,
    NEEDS_GPU_RESET,
    NOT_SERVING,
    OK,
    SERVING,
    SKIPPED,
    TEXT_SAMPLE_CHARS,
    Attempt,
    TierResult,
    generation_facts,
    probe_result,
    probe_state,
)
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import TIER_NAMES
from ansible_collections.llmops.inference.plugins.module_utils.sglang import GenerationResult
from ansible_collections.llmops.inference.plugins.module_utils.systemd import UnitState

UNREAPABLE = [
    {"gpu": 1, "evidence": "pid 7001 (state D) holds 44000 MiB after SIGKILL"},
    {"gpu": None, "evidence": "a process outside /proc"},
]


def attempt_with(**statuses) -> Attempt:
    attempt = Attempt()
    for name in TIER_NAMES:
        status = statuses.get(name, SKIPPED)
        attempt.tiers[name] = TierResult(name, status, f"{name} {status}", elapsed_s=0.12345)
    return attempt


def test_the_failed_tier_is_the_first_failed_one_in_tier_order():
    assert attempt_with(unit=OK, health=OK).failed_tier is None
    attempt = attempt_with(unit=OK, generate=FAILED, gpu=FAILED)
    assert attempt.failed_tier == "gpu" and not attempt.healthy
    assert Attempt().healthy  # no tier run yet: nothing failed


def test_the_state_says_the_most_urgent_thing_first():
    serving = attempt_with(unit=OK)
    assert probe_state(serving, UNREAPABLE) == SERVING
    failed = attempt_with(unit=OK, progress=FAILED)
    assert probe_state(failed, []) == NOT_SERVING
    failed.hung = True
    assert probe_state(failed, []) == HUNG
    assert probe_state(failed, UNREAPABLE) == NEEDS_GPU_RESET


def test_the_result_of_a_failed_attempt_names_the_tier_the_unit_and_the_gpus_to_reset():
    attempt = attempt_with(unit=OK, gpu=FAILED)
    attempt.unit_state = UnitState(name="sglang.service", active_state="active", main_pid=4121, n_restarts=2)
    result = probe_result(attempt, attempts=3, waited_s=1.23456, elapsed_s=2.5, unreapable=iter(UNREAPABLE))
    assert (result["healthy"], result["state"], result["failed_tier"]) == (False, NEEDS_GPU_RESET, "gpu")
    assert result["reason"] == "gpu failed"
    assert [tier["name"] for tier in result["tiers"]] == list(TIER_NAMES)
    assert result["tiers"][0] == {"name": "unit", "status": OK, "reason": "unit ok", "elapsed_s": 0.123}
    assert (result["main_pid"], result["n_restarts"], result["active_state"]) == (4121, 2, "active")
    assert result["unreapable"] == UNREAPABLE and result["reset_gpus"] == [1]
    assert result["reset_message"] == (
        "GPU 1 needs a reset or a reboot: pid 7001 (state D) holds 44000 MiB after SIGKILL; "
        "the host needs a reset or a reboot: a process outside /proc"
    )
    assert (result["waited_s"], result["elapsed_s"], result["attempts"]) == (1.235, 2.5, 3)


def test_the_result_of_a_healthy_probe_without_a_unit():
    result = probe_result(attempt_with(health=OK), attempts=1, waited_s=0.0, elapsed_s=0.1)
    assert (result["healthy"], result["state"], result["failed_tier"], result["reason"]) == (True, SERVING, None, None)
    assert (result["main_pid"], result["n_restarts"], result["active_state"]) == (None, None, None)
    assert (result["reset_gpus"], result["reset_message"], result["generation"]) == ([], None, {})


def test_generation_facts_keep_a_sample_of_the_text_and_rounded_timings():
    answer = GenerationResult(
        "x" * (TEXT_SAMPLE_CHARS + 50), {"completion_tokens": 11, "spec_accept_length": 2.71828}, 1.1234567, 0.1
    )
    facts = generation_facts(answer)
    assert facts == {
        "text": "x" * TEXT_SAMPLE_CHARS,
        "completion_tokens": 11,
        "latency_s": 1.123,
        "ttft_s": 0.1,
        "tokens_per_s": 9.8,
        "accept_length": 2.718,
    }
    assert generation_facts(GenerationResult("", {}, 0.5))["tokens_per_s"] is None
