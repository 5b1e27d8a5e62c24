# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Does a generation read like a broken engine's output? A pure text check, no I/O.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

import re

DEFAULT_MIN_DISTINCT_RATIO = 0.25

# A run of one character needs MIN_CHAR_REPEATS, a longer unit (up to MAX_PERIOD chars) MIN_UNIT_REPEATS, and the
# run must cover MIN_TAIL_SHARE of the text ("Hello!!!!!!!!" counts, "Wow!!" does not). A loop of words (up to
# MAX_WORD_PERIOD of them, at least one not a number: rows of digits repeat in tables and matrices) needs
# MIN_WORD_UNIT_REPEATS (a single word MIN_WORDS_FOR_SAME_WORD) and must cover MIN_TAIL_SHARE of the words or
# RATIO_WINDOW words; up to MAX_TAIL_SLACK words after it are ignored (a loop cut off by a stray word).
# The distinct-word ratio is only taken over prose: tables, truth tables, code, JSON and CSV repeat their keys,
# digits and keywords by nature, which is told by their share of symbol characters (STRUCTURED_SYMBOL_SHARE) or by
# rows (table rows, or rows of numbers) making up half of their lines; numbers are left out of it. Below
# MIN_WORDS_FOR_RATIO words a ratio says nothing; it is taken over the last RATIO_WINDOW words because the ratio
# of any long text falls with its length.
QUOTE_CHARS = 20
MAX_PERIOD = 16
MIN_CHAR_REPEATS = 5
MIN_UNIT_REPEATS = 4
MIN_TAIL_SHARE = 0.5
MIN_WORDS_FOR_SAME_WORD = 4
MAX_WORD_PERIOD = 24
MIN_WORD_UNIT_REPEATS = 3
MAX_TAIL_SLACK = 2
MIN_WORDS_FOR_RATIO = 12
RATIO_WINDOW = 100
STRUCTURED_SYMBOL_SHARE = 0.15
MIN_TABLE_ROWS = 2
WORD = re.compile(r"\w+", re.UNICODE)


def quote_sample(text: str, limit: int = QUOTE_CHARS) -> str:
    """``'the first 20 chars'`` with escapes, followed by ``...`` when cut."""
    text = text.strip()
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _tail_length(items, period: int) -> int:
    """How many of the last items of ``items`` repeat with ``period`` (each equal to the one ``period`` later), the
    last ``period`` included."""
    size = len(items)
    start = size - period - 1
    while start >= 0 and items[start] == items[start + period]:
        start -= 1
    return size - start - 1


def _repeated_tail(text: str) -> tuple:
    """Longest tail of ``text`` repeating one unit of at most MAX_PERIOD chars: ``(unit, repeats, length)``."""
    best = ("", 0, 0)
    size = len(text)
    for period in range(1, min(MAX_PERIOD, size // 2) + 1):
        length = _tail_length(text, period)
        repeats = length // period
        needed = MIN_CHAR_REPEATS if period == 1 else MIN_UNIT_REPEATS
        if repeats >= needed and length > best[2] and text[-period:].strip():
            best = (text[-period:], repeats, length)
    return best


def _repeated_word_tail(words: list) -> tuple:
    """Longest loop of words at the end of ``words`` (up to MAX_TAIL_SLACK words after it): ``(unit, repeats,
    length)`` for a unit of at most MAX_WORD_PERIOD words with a word that is not a number."""
    best = ((), 0, 0)
    for slack in range(min(MAX_TAIL_SLACK, len(words)) + 1):
        body = words[: len(words) - slack]
        size = len(body)
        for period in range(1, min(MAX_WORD_PERIOD, size // 2) + 1):
            length = _tail_length(body, period)
            repeats = length // period
            unit = tuple(body[size - length : size - length + period])
            needed = MIN_WORDS_FOR_SAME_WORD if period == 1 else MIN_WORD_UNIT_REPEATS
            if repeats >= needed and length > best[2] and not all(word.isdigit() for word in unit):
                best = (unit, repeats, length)
    return best


def _is_row(line: str) -> bool:
    """A table row (two or more ``|``) or a row of data (no word of two letters or more, only numbers and signs)."""
    if line.count("|") >= 2:
        return True
    words = WORD.findall(line)
    return bool(words) and not any(sum(char.isalpha() for char in word) >= 2 for word in words)


def is_structured(text: str) -> bool:
    """Tables, truth tables, code, JSON, CSV: many symbol characters, or rows making up half of the lines."""
    visible = [char for char in text if not char.isspace()]
    symbols = sum(1 for char in visible if not char.isalnum())
    if visible and symbols / len(visible) >= STRUCTURED_SYMBOL_SHARE:
        return True
    lines = [line for line in text.splitlines() if line.strip()]
    rows = sum(1 for line in lines if _is_row(line))
    return rows >= MIN_TABLE_ROWS and rows * 2 >= len(lines)


def degenerate_reason(text: str, min_distinct_ratio: float = DEFAULT_MIN_DISTINCT_RATIO) -> str | None:
    """Why ``text`` looks like a broken engine's output, or None when it reads like an answer.

    Flags one character or one short unit repeated over most of the text, one word repeated, a loop of words
    over most of the text (or its last RATIO_WINDOW words), and prose whose distinct-word ratio is below
    ``min_distinct_ratio``. Short answers, lists, tables, code and JSON pass.
    """
    stripped = text.strip()
    if not stripped:
        return None
    words = [word.lower() for word in WORD.findall(stripped)]
    why = _repetition(stripped, words)
    if why is None and not is_structured(stripped):
        why = _low_variety(words, min_distinct_ratio)
    return None if why is None else f"degenerate output: {quote_sample(stripped)} ({why})"


def _repetition(stripped: str, words: list) -> str | None:
    """One character or short unit repeated over most of the text, one word repeated, or a loop of words."""
    unit, repeats, length = _repeated_tail(stripped)
    if repeats and length >= MIN_TAIL_SHARE * len(stripped):
        what = "one character" if len(unit) == 1 else repr(unit)
        return f"{what} repeated {repeats} times"
    if len(words) >= MIN_WORDS_FOR_SAME_WORD and len(set(words)) == 1:
        return f"one word repeated {len(words)} times"
    loop, repeats, length = _repeated_word_tail(words)
    if repeats and (length >= MIN_TAIL_SHARE * len(words) or length >= RATIO_WINDOW):
        return f"{' '.join(loop)!r} repeated {repeats} times"
    return None


def _low_variety(words: list, min_distinct_ratio: float) -> str | None:
    """Prose whose distinct-word ratio (over its last RATIO_WINDOW words) is below ``min_distinct_ratio``."""
    prose = [word for word in words if not word.isdigit()]
    window = prose[-RATIO_WINDOW:]
    if len(window) < MIN_WORDS_FOR_RATIO:
        return None
    distinct = len(set(window))
    ratio = distinct / len(window)
    if ratio >= min_distinct_ratio:
        return None
    where = f"of the last {len(window)} words" if len(prose) > len(window) else f"of {len(window)} words"
    return f"{distinct} distinct {where}, ratio {ratio:.2f} < {min_distinct_ratio}"
