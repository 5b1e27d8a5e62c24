"""From a sweep to SGLang's adaptive speculative decoding: the derived config, SGLang's refusals, the config checks,
and the deployable section of every report format."""

from __future__ import annotations

import csv
import io
import json

import pytest
from test_sweep_actions import plan_params, record

from ansible_collections.llmops.inference.plugins.module_utils.sweep_actions import plan_sweep, write_reports
from ansible_collections.llmops.inference.plugins.module_utils.sweep_adaptive import (
    KNOB_DEFAULTS,
    SGLANG_DEFAULT_CONFIG,
    adaptive_args,
    candidate_union,
    config_errors,
    derive_config,
    render_config,
    static_args,
    sweep_refusal,
    unsupported_reason,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import SweepInputError


def row(steps, concurrency, median, topk=1, status="measured", **extra):
    base = {
        "id": f"s{steps}-k{topk}",
        "steps": steps,
        "topk": topk,
        "draft_tokens": steps + 1,
        "concurrency": concurrency,
        "status": status,
        "output_throughput_median": median,
        "output_throughput_mad": 1.0,
        "host": "h1",
    }
    return dict(base, **extra)


# The lab's model, relative to each level's best (tests/lab/README.md): 4 best at 1, 3 at 4, 2 at 16 and 32.
LAB = {
    1: {1: 78.8, 2: 92.7, 3: 98.6, 4: 100.0, 5: 98.8, 6: 96.1},
    4: {1: 83.7, 2: 96.0, 3: 100.0, 4: 99.6, 5: 96.9, 6: 93.0},
    16: {1: 92.6, 2: 100.0, 3: 99.6, 4: 95.7, 5: 90.4, 6: 84.8},
    32: {1: 96.0, 2: 100.0, 3: 97.1, 4: 91.6, 5: 85.4, 6: 79.2},
}


def lab_rows() -> list:
    return [row(steps, level, value) for level, by_steps in LAB.items() for steps, value in by_steps.items()]


def test_keys_are_the_levels_and_candidates_the_best_and_near_best():
    derived = derive_config(lab_rows(), [1, 4, 16, 32], 0.02)
    config = derived["config"]
    assert list(config) == ["1", "4", "16", "32"]
    assert {key: entry["candidate_steps"] for key, entry in config.items()} == {
        "1": [3, 4, 5],
        "4": [3, 4],
        "16": [2, 3],
        "32": [2],
    }
    for entry in config.values():  # the other knobs at SGLang's AdaptiveStepSlot defaults
        assert {key: value for key, value in entry.items() if key != "candidate_steps"} == KNOB_DEFAULTS
    first = derived["entries"][0]
    assert first["best"]["steps"] == 4 and first["best"]["ratio_to_best"] == 1.0
    assert [(item["steps"], round(item["ratio_to_best"], 3)) for item in first["candidates"]] == [
        (3, 0.986),
        (4, 1.0),
        (5, 0.988),
    ]
    assert derive_config(lab_rows(), [1], 0.0)["config"] == {"1": dict({"candidate_steps": [4]}, **KNOB_DEFAULTS)}


def test_only_lossless_measured_top_k_one_points_count():
    rows = [
        row(4, 1, 100.0, lossless=False),
        row(3, 1, 97.0),  # no lossless field: counts as lossless
        row(2, 1, 96.5, lossless=True),
        row(5, 1, 120.0, topk=2),
        row(6, 1, None, status="failed"),
    ]
    derived = derive_config(rows, [1, 8], 0.02)
    assert derived["config"] == {"1": dict({"candidate_steps": [2, 3]}, **KNOB_DEFAULTS)}
    entry = derived["entries"][0]
    assert entry["best"]["id"] == "s3-k1"
    assert sorted(item["why"] for item in entry["excluded"]) == ["not lossless", "top-k 2"]
    assert derived["entries"][1]["reason"] == "no lossless top-k 1 point was measured at this level"
    nothing = derive_config([row(4, 1, 100.0, lossless=False)], [1], 0.02)
    assert nothing["config"] is None and "no load level" in nothing["reason"]


@pytest.mark.parametrize(
    "algorithm, topk, args, reason",
    [
        ("EAGLE", 1, [], None),
        ("nextn", None, [], None),
        ("EAGLE3", 2, [], "speculative_eagle_topk=2 (only topk=1 is supported)"),
        ("STANDALONE", 1, [], "speculative_algorithm=STANDALONE (only EAGLE/EAGLE3 are supported)"),
        ("EAGLE", 1, ["--attn-dp-size", "2"], "attention DP is not supported"),
        ("EAGLE", 1, ["--attention-data-parallel-size=4"], "attention DP is not supported"),
        ("EAGLE", 1, ["--attn-dp-size", "1"], None),
        ("EAGLE", 1, ["--enable-multi-layer-eagle"], "enable_multi_layer_eagle=True is not supported"),
        ("EAGLE", 1, ["--enable-two-batch-overlap"], "enable_two_batch_overlap=True is not supported"),
        ("EAGLE", 1, ["--enable-pdmux"], "enable_pdmux=True is not supported"),
    ],
)
def test_sglangs_refusals_in_its_words(algorithm, topk, args, reason):
    found = unsupported_reason(algorithm, topk, args)
    assert found == reason if reason is None else found.startswith(reason)


def test_a_sweep_refusal_names_the_host_whose_arguments_refuse_it():
    assert sweep_refusal("EAGLE", [1, 2], {}) is None  # its top-k 1 points give the config
    assert sweep_refusal("EAGLE", [2], {})["reason"] == "speculative_eagle_topk=2 (only topk=1 is supported)"
    refused = sweep_refusal("EAGLE", [1], {"h1": [], "h2": ["--enable-pdmux"]})
    assert refused["host"] == "h2" and refused["reason"].startswith("enable_pdmux=True")


@pytest.mark.parametrize(
    "config, named",
    [
        ({"1": {"candidate_steps": [2]}, "x4": {"candidate_steps": [2]}}, "entry 'x4': the key is not a batch size"),
        ({"1.5": {"candidate_steps": [2]}}, "entry '1.5': the key is not a batch size"),
        ({"1": {"candidate_steps": [2]}, "16": {"candidate_steps": []}}, "entry '16': candidate_steps must be"),
        ({"4": {"candidate_steps": [2, -1]}}, "entry '4': candidate_steps must be"),
        ({"4": {"candidate_steps": [2.0]}}, "entry '4': candidate_steps must be"),
        ({"4": {}}, "entry '4': candidate_steps must be"),
        ({"4": [2, 3]}, "entry '4': must be an object"),
        ({"4": {"candidate_steps": [2], "update_interval": 0}}, "entry '4': update_interval must be an integer >= 1"),
        ({"4": {"candidate_steps": [2], "ema_alpa": 0.3}}, "entry '4': unknown knob 'ema_alpa'"),
        ({"ema_alpha": 0.3}, "no batch-size entry"),
        ({"ema_alpha": 2, "1": {"candidate_steps": [1]}}, "top level: ema_alpha must be a number in (0, 1]"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_a_config_sglang_would_refuse_or_skip_is_named_by_entry(config, named):
    errors = config_errors(config)
    assert any(named in error for error in errors), errors


def test_good_configs_pass_including_sglangs_default_and_yaml_integer_keys():
    assert config_errors(SGLANG_DEFAULT_CONFIG) == []
    assert config_errors({1: {"candidate_steps": [3, 4]}, "ema_alpha": 0.3}) == []
    assert candidate_union({1: {"candidate_steps": [3, 4]}, "16": {"candidate_steps": [2]}}) == [2, 3, 4]
    assert render_config({16: {"candidate_steps": [2]}, "1": {"candidate_steps": [4]}}) == (
        '{\n  "1": {\n    "candidate_steps": [\n      4\n    ]\n  },\n  "16": {\n    "candidate_steps": [\n      2\n'
        "    ]\n  }\n}\n"
    )


def test_arguments_of_each_setting():
    assert static_args({"steps": 3, "topk": 1, "draft_tokens": 4}) == [
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    assert adaptive_args("/etc/x.json") == ["--speculative-adaptive", "--speculative-adaptive-config", "/etc/x.json"]


def lab_sweep(tmp_path, **overrides) -> dict:
    params = plan_params(tmp_path, steps=[2, 3, 4], concurrency=[1, 16], **overrides)
    plan = plan_sweep(params, {"run_id": "r1"}, now=1000.0)
    for steps in (2, 3, 4):
        record(tmp_path, plan, steps, 1, LAB[1][steps])
        record(tmp_path, plan, steps, 16, LAB[16][steps])
    return write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": False}, now=1100.0)


def test_every_report_format_carries_both_settings_and_their_sources(tmp_path):
    report = lab_sweep(tmp_path)
    deploy = report["deployable"]
    assert deploy["static"]["point"]["steps"] == 3 and deploy["static"]["args"][1] == "3"
    config = json.loads((tmp_path / "results-adaptive-config.json").read_text())
    assert {key: entry["candidate_steps"] for key, entry in config.items()} == {"1": [3, 4], "16": [2, 3]}
    assert config_errors(config) == []
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["deployable"]["adaptive"]["config"] == config
    assert document["definition"]["adaptive"] == {"margin": 0.02, "refused": None}
    markdown = (tmp_path / "results.md").read_text()
    assert "## Deployable configuration" in markdown
    assert "`--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4`" in markdown
    assert "| 16 | [2, 3] | 2: 100.0, 1.000, h1; 3: 99.6, 0.996, h1 | - |" in markdown
    rows = list(csv.DictReader(io.StringIO((tmp_path / "results-adaptive.csv").read_text())))
    assert [(r["kind"], r["key"], r["steps"], r["note"]) for r in rows] == [
        ("static", "", "3", "the robust choice of this report"),
        ("adaptive", "1", "3", "within margin"),
        ("adaptive", "1", "4", "best"),
        ("adaptive", "16", "2", "best"),
        ("adaptive", "16", "3", "within margin"),
    ]


def test_a_top_k_two_sweep_is_refused_for_adaptive_and_still_reports_the_static_choice(tmp_path):
    params = plan_params(tmp_path, steps=[2, 3], topk=2, draft_tokens=6, concurrency=[1])
    plan = plan_sweep(params, {"run_id": "r1"}, now=1000.0)
    assert plan["adaptive_refused"]["reason"] == "speculative_eagle_topk=2 (only topk=1 is supported)"
    for steps, value in ((2, 90.0), (3, 100.0)):
        record(tmp_path, plan, steps, 1, value)
    report = write_reports({"results_dir": str(tmp_path), "run_id": "r1", "plot": False}, now=1100.0)
    deploy = report["deployable"]
    assert deploy["adaptive"]["config"] is None
    assert deploy["adaptive"]["reason"].endswith("speculative_eagle_topk=2 (only topk=1 is supported)")
    assert deploy["static"]["point"]["steps"] == 3 and deploy["static"]["args"][3] == "2"
    assert "adaptive_config" not in report["files"]
    assert not (tmp_path / "results-adaptive-config.json").exists()
    assert "No adaptive config: SGLang would not run adaptive" in (tmp_path / "results.md").read_text()


def test_a_bad_margin_is_refused_naming_the_variable(tmp_path):
    with pytest.raises(SweepInputError, match=r"sweep_adaptive_margin must be a fraction"):
        plan_sweep(plan_params(tmp_path, adaptive_margin=1.5), {"run_id": "r1"}, now=1000.0)
    assert not (tmp_path / "sweep.json").exists()
