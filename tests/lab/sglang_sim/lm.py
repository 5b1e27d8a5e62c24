"""The simulated model: a deterministic next-token function of the model, the context's token ids and the numerics.

Each context is a chain hash over the model's name and the token ids so far; the greedy next token and its
logprob are read off that hash, so the same model, the same ids and the same numerics give the same tokens and
logprobs in every launch (a no-op restart reproduces them exactly), greedy decoding of a prompt is the same
sequence as teacher-forced scoring of that prompt plus its continuation, and speculative decoding is lossless.

Tokens are pieces of English-ish text (textgen.WORDS, capitalised after a full stop, now and then a comma or a
full stop); a token's id is its place in that vocabulary, and any other text piece has a hashed id above it.

The `output-drift=K` fault changes the numerics from the K-th token after the prompt on (0 = the first): the
greedy token there is another word and every logprob from there is shifted down by DRIFT_SHIFT. "After the
prompt" is the request's own prompt when it generates, and the positions after `logprob_start_len` + 1 when it
scores given ids (the scorer's continuation), so a drifted engine fails both ways at the same token.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from .textgen import WORDS

DRIFT_SHIFT = 0.35
_TOKEN = re.compile(r"\w+|[^\w\s]")
_VOCAB = tuple(f"{word}{mark}" for base in WORDS for word in (base, base.capitalize()) for mark in ("", ".", ","))
_IDS = {piece: 1000 + index for index, piece in enumerate(_VOCAB)}
_HASHED_BASE = 1000 + len(_VOCAB)


def token_id(piece: str) -> int:
    """The vocabulary id of a piece (its leading space aside); other pieces hash above the vocabulary."""
    word = piece.strip()
    known = _IDS.get(word)
    if known is not None:
        return known
    return _HASHED_BASE + int(hashlib.blake2s(word.encode(), digest_size=4).hexdigest(), 16) % 30000


def piece_of(token: int) -> str | None:
    """The text of a vocabulary id, None for an id outside it."""
    index = token - 1000
    return _VOCAB[index] if 0 <= index < len(_VOCAB) else None


def tokenize(text: str) -> list[int]:
    return [token_id(piece) for piece in _TOKEN.findall(text)] or [token_id(text)]


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _fraction(state: bytes, start: int) -> float:
    return int.from_bytes(state[start : start + 3], "big") / float(1 << 24)


@dataclass(frozen=True)
class Step:
    piece: str
    token: int
    logprob: float


class LanguageModel:
    def __init__(self, model: str, drift_after: int | None = None):
        self.model = model
        self.drift_after = drift_after

    def start(self, salt: str = "") -> bytes:
        return _digest(f"{self.model}\0{salt}".encode())

    @staticmethod
    def advance(state: bytes, token: int) -> bytes:
        return _digest(state + token.to_bytes(8, "big"))

    def _drifted(self, position: int) -> bool:
        return self.drift_after is not None and position >= self.drift_after

    def greedy(self, state: bytes, previous: str | None, position: int) -> Step:
        """The greedy token after `state`; `position` counts from the first token after the prompt (0)."""
        piece, logprob = self._choose(state, previous, position == 0)
        if self._drifted(position):
            turn = 0
            while True:  # another token than the undrifted one
                drifted = self._choose(_digest(state + b"drift" + bytes([turn])), previous, position == 0)[0]
                if token_id(drifted) != token_id(piece):
                    break
                turn += 1
            piece, logprob = drifted, round(logprob - DRIFT_SHIFT, 6)
        return Step(piece, token_id(piece), logprob)

    def logprob(self, state: bytes, previous: str | None, position: int, token: int) -> float:
        """The logprob of `token` after `state` (teacher-forced): the greedy one's, or lower by 2 to 6."""
        best = self.greedy(state, previous, position)
        if token == best.token:
            return best.logprob
        spread = _fraction(_digest(state + token.to_bytes(8, "big")), 0)
        return best.logprob - 2.0 - 4.0 * spread

    @staticmethod
    def _choose(state: bytes, previous: str | None, first: bool) -> tuple[str, float]:
        word = WORDS[int.from_bytes(state[:4], "big") % len(WORDS)]
        if first or previous is None or previous.rstrip().endswith("."):
            word = word.capitalize()
        mark = _fraction(state, 4)
        if mark < 0.09:
            word += "."
        elif mark < 0.14:
            word += ","
        logprob = -(0.01 + 0.8 * _fraction(state, 8))
        return (word if first else " " + word), round(logprob, 6)


def generate(lm: LanguageModel, prompt_ids: list[int], count: int, salt: str = "") -> list[Step]:
    """`count` greedy tokens after the prompt (a salt other than "" gives a sampled-looking other sequence)."""
    state = lm.start(salt)
    previous = None
    for token in prompt_ids:
        state = lm.advance(state, token)
        previous = piece_of(token)
    steps = []
    for position in range(count):
        step = lm.greedy(state, previous, position)
        steps.append(step)
        state = lm.advance(state, step.token)
        previous = step.piece
    return steps


def score(lm: LanguageModel, ids: list[int], start: int) -> list[float | None]:
    """Teacher-forced logprobs of ids[start:], as SGLang returns them: None for the first (nothing predicts it).

    The positions after `start` count as the continuation (position 0 is ids[start + 1]).
    """
    state = lm.start()
    previous = None
    values: list[float | None] = []
    for index, token in enumerate(ids):
        if index >= start:
            values.append(None if index == start else lm.logprob(state, previous, index - start - 1, token))
        state = lm.advance(state, token)
        previous = piece_of(token)
    return values
