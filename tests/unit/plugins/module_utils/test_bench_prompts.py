"""sglang_bench's prompts: the shipped set and seeded random prompts, the same on every host and run."""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.bench_prompts import (
    BUILTIN_PROMPTS,
    RANDOM_WORDS,
    builtin_prompts,
    random_prompts,
)


def test_the_shipped_set_is_taken_in_order_and_cycles():
    assert builtin_prompts(3) == list(BUILTIN_PROMPTS[:3])
    assert builtin_prompts(len(BUILTIN_PROMPTS) + 2)[-2:] == list(BUILTIN_PROMPTS[:2])
    assert builtin_prompts(0) == []


def test_random_prompts_are_deterministic_per_seed():
    first = random_prompts(4, input_len=20, seed=3)
    assert first == random_prompts(4, input_len=20, seed=3)
    assert first != random_prompts(4, input_len=20, seed=4)


def test_random_prompts_have_the_length_and_a_distinct_request_number_each():
    prompts = random_prompts(4, input_len=20, seed=3)
    assert all(len(prompt.split()) == 20 for prompt in prompts)
    assert [prompt.split()[0] for prompt in prompts] == ["0:", "1:", "2:", "3:"]
    assert all(word in RANDOM_WORDS for prompt in prompts for word in prompt.split()[1:])
    assert random_prompts(2, input_len=1, seed=0) == ["0:", "1:"]
