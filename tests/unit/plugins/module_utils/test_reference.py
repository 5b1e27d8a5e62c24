"""The reference: options, scoring (outputs and speed), and measuring a fake SGLang server over HTTP."""

from __future__ import annotations

import hashlib
import math

import pytest
from fake_sglang_server import FakeSglang, callable_route, json_route, stream_route

from ansible_collections.llmops.inference.plugins.module_utils.reference_record import ReferenceEngine
from ansible_collections.llmops.inference.plugins.module_utils.reference_score import (
    output_checks,
    speed_checks,
    verdict,
)
from ansible_collections.llmops.inference.plugins.module_utils.reference_settings import (
    ReferenceInputError,
    parse_reference_options,
)


def test_options_have_documented_defaults_and_name_a_wrong_one():
    options = parse_reference_options({})
    assert options["mode"] == "changed" and options["logprob_tolerance"] == 0.1 and options["concurrency"] == [1, 4]
    with pytest.raises(ReferenceInputError, match=r"reference.repeats must be a number >= 2, got 1") as caught:
        parse_reference_options({"repeats": 1})
    assert caught.value.option == "reference.repeats"
    with pytest.raises(ReferenceInputError, match=r"reference\.concurrency must list whole numbers"):
        parse_reference_options({"concurrency": [0]})
    with pytest.raises(ReferenceInputError, match=r"reference\.prompts"):
        parse_reference_options({"prompts": []})


GOLDEN = [{"prompt": "p", "prompt_ids": [5, 6], "output_ids": [10, 11, 12, 13], "logprobs": [-0.1, -0.9, -0.2, -0.3]}]


def test_identical_outputs_pass_and_a_logprob_gap_names_the_token_and_its_size():
    same = [{"teacher_forced": [-0.1, -0.9, -0.2, -0.3], "output_ids": [10, 11, 12, 13]}]
    assert all(check["passed"] for check in output_checks(GOLDEN, same, 0.1))
    drifted = [{"teacher_forced": [-0.1, -0.9, -4.2, -5.0], "output_ids": [10, 11, 77, 78]}]
    checks = output_checks(GOLDEN, drifted, 0.1)
    logprob, greedy = checks
    assert not logprob["passed"] and logprob["token"] == 2 and math.isclose(logprob["gap"], 4.0)
    assert "golden token 2 (id 12) of prompt 0: logprob -4.2 now, -0.2 recorded, a gap of 4" in logprob["detail"]
    assert not greedy["passed"] and greedy["first_difference"] == 2
    passed, reason = verdict(checks, "recorded X")
    assert not passed and reason.startswith("against the reference recorded X: logprobs failed: golden token 2")


def test_a_greedy_flip_at_a_near_tie_with_unchanged_logprobs_is_noise():
    flipped = [{"teacher_forced": [-0.1, -0.88, -0.2, -0.3], "output_ids": [10, 99, 98, 97]}]
    logprob, greedy = output_checks(GOLDEN, flipped, 0.1)
    assert logprob["passed"] and greedy["passed"] and greedy["first_difference"] == 1
    confident = [{"teacher_forced": [-0.1, -0.9, -0.2, -0.3], "output_ids": [99, 11, 12, 13]}]
    assert not output_checks(GOLDEN, confident, 0.1)[1]["passed"]


def figure(*samples):
    values = sorted(samples)
    return {"median": values[len(values) // 2], "low": values[0], "high": values[-1], "samples": list(samples)}


def test_speed_is_compared_against_the_reference_spread_not_one_sample():
    reference = {"tok_s_c1": figure(100, 96, 104), "itl_ms": figure(10, 9.6, 10.4)}
    noise = {"tok_s_c1": figure(95, 93, 97), "itl_ms": figure(10.5, 10.2, 10.8)}
    assert all(check["passed"] for check in speed_checks(reference, noise, 0.1, 5.0))
    slower = {"tok_s_c1": figure(80, 79, 81), "itl_ms": figure(12.5, 12.4, 12.6)}
    itl, tok = speed_checks(reference, slower, 0.1, 0.0)
    assert not tok["passed"] and tok["check"] == "tok_s_c1" and math.isclose(tok["ratio"], 0.8)
    assert tok["reference_spread"] == [96, 104] and tok["spread"] == [79, 81]
    assert "ratio 0.8; must be at least 86.4" in tok["detail"]
    assert not itl["passed"] and math.isclose(itl["ratio"], 1.25)
    # The floor absorbs a few milliseconds on a tiny latency.
    assert speed_checks({"ttft_ms": figure(2, 2, 2)}, {"ttft_ms": figure(4, 4, 4)}, 0.1, 5.0)[0]["passed"]


# -- a fake SGLang server with a tiny deterministic model ----------------------------------------------------------
def next_token(context: list, drift_at: int | None, position: int) -> tuple:
    digest = hashlib.sha256(repr(context).encode()).digest()
    token = 100 + digest[0]
    if drift_at is not None and position >= drift_at:
        token += 1
    return token, -0.05 - digest[1] / 1000


class TinyModel:
    def __init__(self, drift_at=None, gap=0.0):
        self.drift_at, self.gap = drift_at, gap

    def route(self, request) -> dict:
        body = request["body"]
        params = body.get("sampling_params") or {}
        if body.get("stream"):
            count = params["max_new_tokens"]
            chunks = [
                {"text": "w" * (n + 1), "meta_info": {"prompt_tokens": 3, "completion_tokens": n + 1}}
                for n in range(count)
            ]
            return stream_route(chunks, gap=self.gap)
        ids = list(body.get("input_ids") or [1, 2, len(body["text"])])
        start = body.get("logprob_start_len", -1)
        inputs = []
        if body.get("return_logprob") and start >= 0:
            for index in range(start, len(ids)):
                value = None if index == start else self.score(ids[:index], ids[index], index - start - 1)
                inputs.append([value, ids[index], None])
        outputs, context = [], list(ids)
        for position in range(params.get("max_new_tokens", 16)):
            token, logprob = next_token(context, self.drift_at, position)
            outputs.append([logprob, token, None])
            context.append(token)
        meta = {"input_token_logprobs": inputs, "output_token_logprobs": outputs, "completion_tokens": len(outputs)}
        return json_route({"text": "", "output_ids": [o[1] for o in outputs], "meta_info": meta})

    def score(self, context, token, position):
        expected, logprob = next_token(context, self.drift_at, position)
        return logprob if token == expected else logprob - 3.0


OPTIONS = parse_reference_options(
    {
        "prompts": ["a", "bb"],
        "max_new_tokens": 8,
        "concurrency": [1, 2],
        "requests_per_user": 1,
        "repeats": 2,
        "perf_max_new_tokens": 6,
        "timeout": 10,
    }
)


@pytest.fixture
def serve():
    servers = []

    def start(model: TinyModel) -> FakeSglang:
        server = FakeSglang({"/generate": callable_route(model.route)}).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def check(engine, reference, speculative=False, speed_tolerance=0.5):
    """Outputs at the default tolerance; speed generously (a fake server on a busy machine is noisy), which still
    fails a server three times slower."""
    observed = engine.observe(reference["golden"], speculative)
    checks = output_checks(reference["golden"], observed["scores"], 0.1)
    return checks + speed_checks(reference["fingerprint"], observed["fingerprint"], speed_tolerance, 5.0)


def test_a_recorded_reference_passes_on_the_same_server_and_fails_on_a_drifted_one(serve):
    same = serve(TinyModel(gap=0.005))
    engine = ReferenceEngine(same.url, None, True, OPTIONS)
    reference = engine.record(speculative=False)
    golden = reference["golden"][0]
    assert golden["prompt_ids"] == [1, 2, 1] and len(golden["output_ids"]) == 8 and len(golden["logprobs"]) == 8
    assert {"tok_s_c1", "tok_s_c2", "ttft_ms", "itl_ms"} == set(reference["fingerprint"])
    assert len(reference["fingerprint"]["tok_s_c1"]["samples"]) == 2
    assert [c["detail"] for c in check(engine, reference) if not c["passed"]] == []
    scoring = [r["body"] for r in same.requests if r["body"] and r["body"].get("logprob_start_len") == 2]
    assert scoring and scoring[-1]["sampling_params"]["max_new_tokens"] == 0
    assert scoring[0]["input_ids"] == golden["prompt_ids"] + golden["output_ids"]
    drifted = serve(TinyModel(drift_at=3, gap=0.005))
    failed = [c for c in check(ReferenceEngine(drifted.url, None, True, OPTIONS), reference) if not c["passed"]]
    assert {c["check"] for c in failed} == {"logprobs", "greedy_tokens"}
    assert failed[0]["token"] == 3 and failed[0]["gap"] == pytest.approx(3.0)


def test_speculation_scores_with_one_new_token_and_a_slower_server_fails_on_speed(serve):
    fast = serve(TinyModel(gap=0.01))
    reference = ReferenceEngine(fast.url, None, True, OPTIONS).record(speculative=True)
    slow = serve(TinyModel(gap=0.03))
    checks = check(ReferenceEngine(slow.url, None, True, OPTIONS), reference, speculative=True)
    scoring = [r["body"] for r in slow.requests if r["body"] and r["body"].get("logprob_start_len") is not None]
    assert scoring and all(body["sampling_params"]["max_new_tokens"] == 1 for body in scoring)
    failed = {c["check"] for c in checks if not c["passed"]}
    assert {"tok_s_c1", "itl_ms"} <= failed and "logprobs" not in failed
