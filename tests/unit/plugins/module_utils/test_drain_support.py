"""drain_support: engine settings SGLang's graceful drain does not serve are refused unless accepted."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.drain_support import refusals, undrained_settings


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--pp-size", "2"], {}, ["--pp-size 2: pipeline-parallel"]),
        (["--pipeline-parallel-size=4"], {}, ["--pipeline-parallel-size 4: pipeline-parallel"]),
        (["--tokenizer-worker-num", "3"], {}, ["--tokenizer-worker-num 3: with several tokenizer workers"]),
        ([], {"SGLANG_RUST_SERVER": "True"}, ["SGLANG_RUST_SERVER=True: SGLang's Rust API server"]),
        (["--pp-size", "1", "--tokenizer-worker-num=1"], {"SGLANG_RUST_SERVER": "0"}, []),
        (["--dp-size", "2", "--tp-size", "4"], {"OTHER": "1"}, []),
    ],
)
def test_undrained_settings(args, env, expected):
    found = undrained_settings(args, env)
    assert len(found) == len(expected)
    for line, fragment in zip(found, expected):
        assert fragment in line


def test_a_refusal_names_the_setting_the_consequence_and_the_acceptance_option():
    (message,) = refusals(["--pp-size", "2"], {}, accepted=False)
    assert message.startswith("sglang_service_extra_args sets --pp-size 2:")
    assert "set sglang_service_accept_undrained: true" in message
    assert "kills the schedulers before they release" in message and "reaper" in message
    assert refusals(["--pp-size", "2"], {"SGLANG_RUST_SERVER": "1"}, accepted=True) == []
