"""sglang_sim's model: greedy tokens and logprobs as a function of the model, the ids and the numerics; /generate's
return_logprob, logprob_start_len, input_ids and max_new_tokens 0; the output-drift and slowdown faults."""

from __future__ import annotations

import json
import sys
import time

import pytest
from sim_support import API_KEY, FAST, LAB_DIR

if str(LAB_DIR) not in sys.path:
    sys.path.insert(0, str(LAB_DIR))
from sglang_sim import faults, lm

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "Explain what a scheduler does."


def varied(pieces) -> bool:
    """Plausible text: no word repeated back to back three times, most words different."""
    words = [p.strip(" .,").lower() for p in pieces]
    runs = any(words[i] == words[i + 1] == words[i + 2] for i in range(len(words) - 2))
    return not runs and len(set(words)) > len(words) // 2


def test_greedy_generation_and_teacher_forced_scoring_agree_and_repeat():
    model = lm.LanguageModel("org/sim-model")
    prompt = lm.tokenize(PROMPT)
    steps = lm.generate(model, prompt, 48)
    assert steps == lm.generate(lm.LanguageModel("org/sim-model"), prompt, 48)
    assert varied([s.piece for s in steps])
    scored = lm.score(model, prompt + [s.token for s in steps], len(prompt) - 1)
    assert scored[0] is None and scored[1:] == [s.logprob for s in steps]
    assert all(-1.0 < s.logprob < 0 for s in steps)
    other = lm.generate(lm.LanguageModel("org/other-model"), prompt, 48)
    assert [s.token for s in other] != [s.token for s in steps]


def test_drift_changes_the_greedy_token_from_k_on_and_shifts_logprobs():
    prompt = lm.tokenize(PROMPT)
    clean = lm.generate(lm.LanguageModel("m"), prompt, 40)
    drifted_model = lm.LanguageModel("m", drift_after=8)
    drifted = lm.generate(drifted_model, prompt, 40)
    assert [s.token for s in drifted[:8]] == [s.token for s in clean[:8]]
    assert drifted[8].token != clean[8].token
    assert varied([s.piece for s in drifted])
    golden = prompt + [s.token for s in clean]
    scored = lm.score(drifted_model, golden, len(prompt) - 1)[1:]
    assert scored[:8] == [s.logprob for s in clean[:8]]
    assert scored[8] < clean[8].logprob - 2.0
    assert faults.parse_faults(["output-drift"]) == {"output-drift": 8}
    assert faults.parse_faults(["output-drift=3,slowdown=1.25"]) == {"output-drift": 3, "slowdown": 1.25}
    with pytest.raises(ValueError, match="'slowdown' needs a value"):
        faults.parse_faults(["slowdown"])
    with pytest.raises(ValueError, match="'0' is not a number above 0"):
        faults.parse_faults(["slowdown=0"])


def _generate(sim, **body):
    status, raw = sim.post("/generate", body, headers=AUTH)
    return status, json.loads(raw)


def test_generate_returns_logprobs_and_scores_given_ids(start):
    sim = start("--api-key", API_KEY, "--sim-token-latency-ms", "1", *FAST)
    greedy = {"temperature": 0, "max_new_tokens": 24}
    status, out = _generate(sim, text=PROMPT, sampling_params=greedy, return_logprob=True)
    meta = out["meta_info"]
    assert status == 200 and meta["input_token_logprobs"] == [] and meta["output_token_logprobs_length"] == 24
    assert [entry[1] for entry in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(entry[2] is None and entry[0] < 0 for entry in meta["output_token_logprobs"])
    prompt = lm.tokenize(PROMPT)
    # Given ids: the same greedy tokens as the text prompt.
    status, by_ids = _generate(sim, input_ids=prompt, sampling_params=greedy, return_logprob=True)
    assert by_ids["output_ids"] == out["output_ids"]
    assert by_ids["meta_info"]["output_token_logprobs"] == meta["output_token_logprobs"]
    # Prefill only: the continuation teacher-forced, each logprob the one it had when generated.
    status, scored = _generate(
        sim,
        input_ids=prompt + out["output_ids"],
        sampling_params={"temperature": 0, "max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=len(prompt) - 1,
        return_text_in_logprobs=True,
    )
    inputs = scored["meta_info"]["input_token_logprobs"]
    assert status == 200 and scored["output_ids"] == [] and scored["meta_info"]["completion_tokens"] == 0
    assert inputs[0][0] is None and inputs[0][1] == prompt[-1]
    assert [entry[0] for entry in inputs[1:]] == [entry[0] for entry in meta["output_token_logprobs"]]
    assert inputs[1][2] == out["text"].split()[0]
    status, refused = _generate(
        sim, input_ids=prompt, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=99
    )
    assert (
        status == 400
        and "logprob_start_len=99 is higher than the number of input tokens" in refused["error"]["message"]
    )


def test_a_restart_reproduces_outputs_and_speculation_refuses_prefill_only(start):
    plain = start("--api-key", API_KEY, "--sim-token-latency-ms", "1", *FAST)
    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 16}, "return_logprob": True}
    first = _generate(plain, **body)[1]
    plain.kill()
    spec = start(
        "--api-key", API_KEY, "--sim-token-latency-ms", "1", "--speculative-algorithm", "EAGLE",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", *FAST,
    )  # fmt: skip
    again = _generate(spec, **body)[1]
    assert again["output_ids"] == first["output_ids"]
    assert again["meta_info"]["output_token_logprobs"] == first["meta_info"]["output_token_logprobs"]
    status, refused = _generate(spec, input_ids=[1001, 1002], sampling_params={"max_new_tokens": 0})
    assert status == 400 and "max_new_tokens=1" in refused["error"]["message"]
    status, one = _generate(spec, input_ids=[1001, 1002], sampling_params={"max_new_tokens": 1, "temperature": 0})
    assert status == 200 and one["meta_info"]["completion_tokens"] == 1


def test_drift_and_slowdown_faults_show_over_http(start):
    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 40}}
    clean = start("--api-key", API_KEY, "--sim-token-latency-ms", "5", *FAST)
    began = time.monotonic()
    reference = _generate(clean, **body)[1]
    clean_s = time.monotonic() - began
    clean.kill()
    slow = start("--api-key", API_KEY, "--sim-token-latency-ms", "5", "--sim-fault", "slowdown=3", *FAST)
    began = time.monotonic()
    slowed = _generate(slow, **body)[1]
    assert time.monotonic() - began > clean_s * 1.8
    assert slowed["output_ids"] == reference["output_ids"]
    slow.kill()
    drift = start("--api-key", API_KEY, "--sim-token-latency-ms", "1", "--sim-fault", "output-drift=5", *FAST)
    drifted = _generate(drift, **body)[1]
    assert drifted["output_ids"][:5] == reference["output_ids"][:5]
    assert drifted["output_ids"][5] != reference["output_ids"][5]


def test_lossy_steps_drifts_only_at_that_step_count(start):
    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 12}}
    spec = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"]
    common = ["--api-key", API_KEY, "--sim-token-latency-ms", "1", "--sim-fault", "lossy-steps=3", *FAST]
    plain = start(*common)
    reference = _generate(plain, **body)[1]["output_ids"]
    plain.kill()
    lossless = start(*common, *spec, "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3")
    assert _generate(lossless, **body)[1]["output_ids"] == reference
    lossless.kill()
    lossy = start(*common, *spec, "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4")
    drifted = _generate(lossy, **body)[1]["output_ids"]
    assert drifted[:8] == reference[:8] and drifted[8] != reference[8]
