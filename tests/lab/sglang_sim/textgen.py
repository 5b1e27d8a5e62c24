"""Deterministic English-ish text: one word is one token; the same key gives the same words."""

from __future__ import annotations

import hashlib
import random
import re

WORDS = tuple(
    """
    the a model server answer question system data result value time people way day world work part
    place case point number group problem fact idea story example reason process method language memory
    network signal is was can will should might makes takes gives finds shows keeps runs reads writes
    builds moves starts holds turns brings learns helps and but or so because while when if then also
    often always still of to in on for with from by about over under between through good new small
    large simple clear early late quick careful useful open important different common real local
    steady bright quiet strong gentle this that each every some many more most other another such its
    we you they it one two three first next last here there now
    """.split()
)
DEGENERATE_TOKEN = "!"
_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    return max(1, len(_TOKEN.findall(text)))


def generation_key(prompt: str, temperature: float, seed: int, request_id: str) -> str:
    """Greedy decoding depends only on the prompt; sampling also on the seed and the request."""
    digest = hashlib.sha256(prompt.encode("utf-8", "replace")).hexdigest()
    if temperature <= 0.0:
        return digest
    return f"{digest}:{seed}:{request_id}"


def pieces(key: str, count: int) -> list[str]:
    """`count` tokens as text pieces; joining them gives the text (pieces after the first carry their space)."""
    rng = random.Random(key)
    result = []
    sentence_left = 0
    for index in range(count):
        if sentence_left == 0:
            sentence_left = rng.randint(6, 14)
            word = rng.choice(WORDS).capitalize()
        else:
            word = rng.choice(WORDS)
        sentence_left -= 1
        if sentence_left == 0:
            word += "."
        elif sentence_left > 2 and rng.random() < 0.06:
            word += ","
        result.append(word if index == 0 else " " + word)
    return result


def degenerate_pieces(count: int) -> list[str]:
    return [DEGENERATE_TOKEN] * count


def token_id(piece: str) -> int:
    """A stable vocabulary id for a piece (ids 1000..32999)."""
    return 1000 + int(hashlib.blake2s(piece.strip().encode(), digest_size=4).hexdigest(), 16) % 32000
