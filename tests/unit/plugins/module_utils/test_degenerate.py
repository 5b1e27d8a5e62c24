"""The degenerate-output detector: broken engines' loops are flagged, ordinary answers pass."""

from __future__ import annotations

import random
import re

import pytest
from degenerate_corpus import DEGENERATE, NORMAL

from ansible_collections.llmops.inference.plugins.module_utils.degenerate import degenerate_reason, is_structured
from ansible_collections.llmops.inference.plugins.modules import sglang_probe


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
            "'I am a model and I a'... ('i am a model and' repeated 4 times)",
        ),
        (
            "the of the and of the the and of and the of the and the of a the of and the",
            "'the of the and of th'... (4 distinct of 21 words, ratio 0.19 < 0.25)",
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
    assert degenerate_reason(looping).endswith("('and then it goes on and on' repeated 20 times)")


def test_distinct_ratio_threshold_is_configurable():
    text = "one two three two one three one two three three two one"
    assert degenerate_reason(text, min_distinct_ratio=0.2) is None
    assert degenerate_reason(text, min_distinct_ratio=0.3).endswith("(3 distinct of 12 words, ratio 0.25 < 0.3)")


# The labelled corpus ----------------------------------------------------------------------------------

TABLE_ROW = re.compile(r"(degenerate|normal) outputs \((\d+)\) - (\d+) flagged, (\d+) passed")


def confusion() -> dict:
    """{true class: (count, flagged, passed)} of the check over the corpus."""
    table = {}
    for name, corpus in (("degenerate", DEGENERATE), ("normal", NORMAL)):
        flagged = sum(1 for _label, text in corpus if degenerate_reason(text))
        table[name] = (len(corpus), flagged, len(corpus) - flagged)
    return table


def test_corpus_is_large_and_labelled_both_ways():
    assert len(NORMAL) >= 30 and len(DEGENERATE) >= 25
    assert len({label for label, _text in NORMAL + DEGENERATE}) == len(NORMAL) + len(DEGENERATE)


@pytest.mark.parametrize(("label", "text"), NORMAL, ids=[label for label, _text in NORMAL])
def test_normal_outputs_of_the_corpus_pass(label, text):
    assert degenerate_reason(text) is None


@pytest.mark.parametrize(("label", "text"), DEGENERATE, ids=[label for label, _text in DEGENERATE])
def test_degenerate_outputs_of_the_corpus_are_flagged(label, text):
    assert degenerate_reason(text), label


def test_structured_answers_are_not_judged_by_their_distinct_word_ratio():
    for label in ("3-input truth table", "4-input truth table, plain", "JSON records, repeated values"):
        text = dict(NORMAL)[label]
        assert is_structured(text), label
        assert degenerate_reason(text, min_distinct_ratio=0.99) is None, label


def test_the_documented_confusion_table_is_the_computed_one():
    notes = " ".join(sglang_probe.DOCUMENTATION.split())
    documented = {name: tuple(int(n) for n in numbers) for name, *numbers in TABLE_ROW.findall(notes)}
    assert documented == confusion()
    degenerate, normal = confusion()["degenerate"], confusion()["normal"]
    sentence = (
        f"flags {degenerate[1]} of its {degenerate[0]} degenerate outputs "
        f"and {normal[1]} of its {normal[0]} normal ones"
    )
    assert sentence in notes
