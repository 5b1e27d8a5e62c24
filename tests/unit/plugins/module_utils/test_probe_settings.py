"""ProbeSettings: a wrong option is refused naming it; defaults are filled in."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import ProbeInputError, ProbeSettings


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        ({"url": "localhost:30000"}, "url", "url must be an absolute http:// or https:// URL"),
        ({"timeout": 0}, "timeout", "timeout must be greater than 0 seconds, got 0"),
        ({"generate_timeout": -1}, "generate_timeout", "generate_timeout must be greater than 0 seconds, got -1"),
        ({"wait_timeout": -5}, "wait_timeout", "wait_timeout must not be negative, got -5"),
        ({"stability_window": -1}, "stability_window", "stability_window must not be negative"),
        ({"max_new_tokens": 0}, "max_new_tokens", "max_new_tokens must be at least 1, got 0"),
        ({"expect_regex": "(unclosed"}, "expect_regex", "expect_regex does not compile: missing ), unterminated"),
        ({"poll_interval": 2}, "poll_interval", "poll_interval must be greater than 0 and at most 0.5 s, got 2"),
        ({"min_distinct_ratio": 1.5}, "min_distinct_ratio", "min_distinct_ratio must be between 0 and 1"),
        ({"tiers": ["health", "vibes"]}, "tiers", "tiers must be a subset of unit, gpu, progress, health"),
        ({"tiers": []}, "tiers", "tiers must name at least one of unit, gpu, progress, health"),
        (
            {"progress_window": 0},
            "progress_window",
            "progress_window must be a number of seconds greater than 0 (leave it unset to turn the progress tier off)"
            ", got 0",
        ),
        ({"progress_window": -10}, "progress_window", "progress_window must be a number of seconds greater than 0"),
        ({"progress_window": "10s"}, "progress_window", "progress_window must be a number of seconds greater than 0"),
        ({"progress_window": True}, "progress_window", "progress_window must be a number of seconds greater than 0"),
        (
            {"soak_requests": -1},
            "soak_requests",
            "soak_requests must be a whole number of requests, 0 (no soak) or more",
        ),
        ({"soak_requests": 2.5}, "soak_requests", "soak_requests must be a whole number of requests"),
        ({"soak_max_new_tokens": 0}, "soak_max_new_tokens", "soak_max_new_tokens must be a whole number of at least 1"),
        ({"unaccounted_threshold_mib": -1}, "unaccounted_threshold_mib", "unaccounted_threshold_mib must be a whole"),
        ({"expected_gpus": 0}, "expected_gpus", "expected_gpus as a count must be at least 1, got 0"),
        ({"expected_gpus": {"a": 1}}, "expected_gpus", "expected_gpus must be a GPU count or a list"),
        ({"tp_size": 0}, "tp_size", "tp_size must be at least 1, got 0"),
        ({"prompt": "  "}, "prompt", "prompt must not be empty"),
        ({"min_tokens_per_s": -1.0}, "min_tokens_per_s", "min_tokens_per_s must not be negative"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, option, message):
    with pytest.raises(ProbeInputError) as raised:
        ProbeSettings(**options).validate()
    assert raised.value.option == option
    assert str(raised.value).startswith(message)


def test_settings_normalize_the_unit_and_default_the_gpu_count_from_tp():
    settings = ProbeSettings(unit="sglang-qwen", tp_size=2).validate()
    assert (settings.unit, settings.gpu_count, settings.gpu_selectors) == ("sglang-qwen.service", 2, None)
    settings = ProbeSettings(expected_gpus=["0", 1], tp_size=2).validate()
    assert (settings.gpu_count, settings.gpu_selectors) == (None, ["0", "1"])
    assert ProbeSettings(expected_gpus="3").validate().gpu_count == 3


def test_progress_and_soak_default_to_off():
    settings = ProbeSettings().validate()
    assert (settings.progress_window, settings.progress_require_metrics) == (None, False)
    assert (settings.soak_requests, settings.soak_max_new_tokens, settings.unaccounted_threshold_mib) == (0, 8, 1024)
    settings = ProbeSettings(progress_window=10, soak_requests=None, soak_max_new_tokens=None).validate()
    assert (settings.progress_window, settings.soak_requests, settings.soak_max_new_tokens) == (10, 0, 8)


def test_every_option_has_its_default_and_an_unknown_one_is_refused():
    settings = ProbeSettings()
    assert (settings.url, settings.timeout, settings.tiers[0], settings.unit) == (
        "http://127.0.0.1:30000",
        10.0,
        "unit",
        None,
    )
    with pytest.raises(TypeError, match="unknown options: promt"):
        ProbeSettings(promt="typo")
