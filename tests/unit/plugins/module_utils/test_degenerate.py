"""The degenerate-output detector: broken engines' loops are flagged, ordinary answers pass."""

from __future__ import annotations

import random

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.degenerate import degenerate_reason


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("!!!!!!!!", "'!!!!!!!!' (one character repeated 8 times)"),
        ("Hello!!!!!!!!", "'Hello!!!!!!!!' (one character repeated 8 times)"),
        ("!" * 64, "'!!!!!!!!!!!!!!!!!!!!'... (one character repeated 64 times)"),
        ("the the the the the", "'the the the the the' (' the' repeated 4 times)"),
        ("HelloHelloHelloHello", "'HelloHelloHelloHello' ('Hello' repeated 4 times)"),
        ("Paris. Paris, Paris! Paris", "'Paris. Paris, Paris!'... (one word repeated 4 times)"),
        (
            "The capital of France is Paris. Paris. Paris. Paris. Paris. Paris. Paris.",
            "'The capital of Franc'... (' Paris.' repeated 7 times)",
        ),
        (
            "I am a model and I am a model and I am a model and I am a model and I am a model, yes",
            "'I am a model and I a'... (6 distinct of 25 words, ratio 0.24 < 0.25)",
        ),
    ],
)
def test_degenerate_text_is_flagged(text, why):
    assert degenerate_reason(text) == f"degenerate output: {why}"


@pytest.mark.parametrize(
    "text",
    [
        "1. apple\n2. banana\n3. cherry\n4. date\n5. elderberry\n6. fig\n7. grape",
        "1. Add the salt.\n2. Add the pepper.\n3. Add the oil.\n4. Add the water.\n5. Stir.",
        "- yes\n- no\n- yes\n- no",
        "2, 3, 5, 7, 11",
        "4",
        "Yes.",
        "Paris",
        "Wow!!",
        "...",
        "1000",
        "Title\n=====\nSome text below the heading explains it.",
        "北京是中国的首都。",
        "def f(x):\n    return x * x\n\nprint(f(2), f(3), f(4))",
        "The quick brown fox jumps over the lazy dog. The dog does not react, and the fox runs into the woods.",
        "",
    ],
)
def test_ordinary_text_is_not_flagged(text):
    assert degenerate_reason(text) is None


def test_long_ordinary_text_is_not_flagged_but_a_loop_at_its_end_is():
    rng = random.Random(7)
    vocabulary = [f"word{number}" for number in range(150)]
    long_text = " ".join(rng.choices(vocabulary, k=2000))
    assert degenerate_reason(long_text) is None
    looping = long_text + " and then it goes on and on" * 20
    assert degenerate_reason(looping).endswith("(5 distinct of the last 100 words, ratio 0.05 < 0.25)")


def test_distinct_ratio_threshold_is_configurable():
    text = "one two three one two three one two three one two three"
    assert degenerate_reason(text, min_distinct_ratio=0.2) is None
    assert degenerate_reason(text, min_distinct_ratio=0.3).endswith("(3 distinct of 12 words, ratio 0.25 < 0.3)")
