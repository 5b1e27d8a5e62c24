"""The adaptive_config filter: a sweep's result or a config, checked as SGLang would and against the engine."""

from __future__ import annotations

import json

from ansible_collections.llmops.inference.plugins.filter.adaptive_config import adaptive_config

VAR = "sglang_service_speculative_adaptive_config"
EAGLE = {"algorithm": "EAGLE", "topk": 1, "num_steps": None, "extra_args": []}


def test_nothing_given_is_no_config():
    for empty in (None, "", {}):
        assert adaptive_config(empty, EAGLE, VAR) == {
            "config": None, "text": "", "candidate_steps": [], "source": None, "errors": [],
        }  # fmt: skip


def test_a_config_given_as_a_yaml_mapping():
    found = adaptive_config({16: {"candidate_steps": [2, 3]}, "1": {"candidate_steps": [4]}}, EAGLE, VAR)
    assert found["errors"] == []
    assert list(found["config"]) == ["1", "16"] and found["candidate_steps"] == [2, 3, 4]
    assert json.loads(found["text"]) == {"1": {"candidate_steps": [4]}, "16": {"candidate_steps": [2, 3]}}


def test_a_sweeps_result_or_its_config_file(tmp_path):
    config = {"1": {"candidate_steps": [3, 4]}, "32": {"candidate_steps": [2]}}
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"deployable": {"adaptive": {"config": config}}}))
    found = adaptive_config(str(results), EAGLE, VAR)
    assert found["config"] == config and found["source"].startswith("the deployable adaptive config")
    plain = tmp_path / "results-adaptive-config.json"
    plain.write_text(json.dumps(config))
    assert adaptive_config(str(plain), EAGLE, VAR)["config"] == config
    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps({"deployable": {"adaptive": {"config": None, "reason": "top-k 2"}}}))
    assert "has no adaptive config: top-k 2" in adaptive_config(str(refused), EAGLE, VAR)["errors"][0]
    assert "cannot read" in adaptive_config(str(tmp_path / "missing.json"), EAGLE, VAR)["errors"][0]
    assert "must be absolute" in adaptive_config("results.json", EAGLE, VAR)["errors"][0]


def test_entries_sglang_refuses_or_skips_are_named():
    errors = adaptive_config({"1": {"candidate_steps": [3]}, "x4": {"candidate_steps": []}}, EAGLE, VAR)["errors"]
    assert errors[0].startswith(f"{VAR} (the config given): entry 'x4': the key is not a batch size")
    errors = adaptive_config({"16": {"candidate_steps": []}}, EAGLE, VAR)["errors"]
    assert "entry '16': candidate_steps must be a non-empty list" in errors[0]


def test_the_engine_must_be_able_to_run_it():
    config = {"1": {"candidate_steps": [3, 4]}}
    topk2 = adaptive_config(config, dict(EAGLE, topk=2), VAR)["errors"]
    assert topk2 == [f"{VAR}: SGLang would not run adaptive speculative decoding with this engine: "
                     "speculative_eagle_topk=2 (only topk=1 is supported)"]  # fmt: skip
    steps = adaptive_config(config, dict(EAGLE, num_steps="5"), VAR)["errors"]
    assert "--speculative-num-steps=5 is not in the adaptive config candidate_steps [3, 4]" in steps[0]
    assert adaptive_config(config, dict(EAGLE, num_steps=3), VAR)["errors"] == []
