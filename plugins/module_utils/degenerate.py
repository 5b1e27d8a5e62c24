# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Does a generation read like a broken engine's output? A pure text check, no I/O.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

import re

DEFAULT_MIN_DISTINCT_RATIO = 0.25

# A run of one character needs MIN_CHAR_REPEATS, a longer unit (up to
# MAX_PERIOD chars) MIN_UNIT_REPEATS, and the run must cover MIN_TAIL_SHARE of the text ("Hello!!!!!!!!"
# counts, "Wow!!" does not). Below MIN_WORDS_FOR_RATIO words a distinct-word ratio says nothing; it is taken
# over the last RATIO_WINDOW words because the ratio of any long text falls with its length.
QUOTE_CHARS = 20
MAX_PERIOD = 16
MIN_CHAR_REPEATS = 5
MIN_UNIT_REPEATS = 4
MIN_TAIL_SHARE = 0.5
MIN_WORDS_FOR_SAME_WORD = 4
MIN_WORDS_FOR_RATIO = 12
RATIO_WINDOW = 100
WORD = re.compile(r"\w+", re.UNICODE)


def quote_sample(text: str, limit: int = QUOTE_CHARS) -> str:
    """``'the first 20 chars'`` with escapes, followed by ``...`` when cut."""
    text = text.strip()
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _repeated_tail(text: str) -> tuple:
    """Longest tail of ``text`` repeating one unit of at most MAX_PERIOD chars: ``(unit, repeats, length)``."""
    best = ("", 0, 0)
    size = len(text)
    for period in range(1, min(MAX_PERIOD, size // 2) + 1):
        start = size - period - 1
        while start >= 0 and text[start] == text[start + period]:
            start -= 1
        length = size - start - 1
        repeats = length // period
        needed = MIN_CHAR_REPEATS if period == 1 else MIN_UNIT_REPEATS
        if repeats >= needed and length > best[2] and text[-period:].strip():
            best = (text[-period:], repeats, length)
    return best


def degenerate_reason(text: str, min_distinct_ratio: float = DEFAULT_MIN_DISTINCT_RATIO) -> str | None:
    """Why ``text`` looks like a broken engine's output, or None when it reads like an answer.

    Flags one character or one short unit repeated over most of the text, one word repeated, and text
    whose distinct-word ratio is below ``min_distinct_ratio``. Short answers and ordinary repetitive
    text (numbered lists, recipes) pass.
    """
    stripped = text.strip()
    if not stripped:
        return None
    unit, repeats, length = _repeated_tail(stripped)
    if repeats and length >= MIN_TAIL_SHARE * len(stripped):
        what = "one character" if len(unit) == 1 else repr(unit)
        return f"degenerate output: {quote_sample(stripped)} ({what} repeated {repeats} times)"
    words = [word.lower() for word in WORD.findall(stripped)]
    if len(words) >= MIN_WORDS_FOR_SAME_WORD and len(set(words)) == 1:
        return f"degenerate output: {quote_sample(stripped)} (one word repeated {len(words)} times)"
    window = words[-RATIO_WINDOW:]
    if len(window) >= MIN_WORDS_FOR_RATIO:
        distinct = len(set(window))
        ratio = distinct / len(window)
        if ratio < min_distinct_ratio:
            where = f"of the last {len(window)} words" if len(words) > len(window) else f"of {len(window)} words"
            return (
                f"degenerate output: {quote_sample(stripped)} "
                f"({distinct} distinct {where}, ratio {ratio:.2f} < {min_distinct_ratio})"
            )
    return None
