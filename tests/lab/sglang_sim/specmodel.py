"""The speculative-decoding model: accept length, step cost (growing with the batch), speed-up and draft memory.

Pure functions of (steps, top-k, draft tokens, running requests) and a few parameters; tests/lab/README.md
states the formulas, their defaults and where the defaults come from (sgl-project/sglang pull request 22246
measured Qwen3-235B-A22B + EAGLE: the best step count is 4 at batch size 1 and 2 at batch size 64). The
per-request noise is seeded, so the same seed and request id give the same numbers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmProfile:
    """How one algorithm drafts: its per-token acceptance, draft cost and whether it drafts a block at once."""

    accept_prob: float
    draft_cost_scale: float = 1.0
    block_draft: bool = False


PROFILES = {
    "EAGLE": AlgorithmProfile(0.70),
    "EAGLE3": AlgorithmProfile(0.75),
    "FROZEN_KV_MTP": AlgorithmProfile(0.70),
    "STANDALONE": AlgorithmProfile(0.60, draft_cost_scale=2.0),
    "NGRAM": AlgorithmProfile(0.45, draft_cost_scale=0.1),
    "DFLASH": AlgorithmProfile(0.72, block_draft=True),
    "DSPARK": AlgorithmProfile(0.72, block_draft=True),
}
DEFAULT_PROFILE = AlgorithmProfile(0.65)


DEFAULT_BATCH_SLOWDOWN = 0.033
DEFAULT_DRAFT_STEP_COST = 0.09
DEFAULT_TOPK_COST = 0.15
DEFAULT_VERIFY_TOKEN_COST = 0.015
DEFAULT_DRAFT_BATCH_COST = 0.02
DEFAULT_VERIFY_BATCH_COST = 1.0


@dataclass(frozen=True)
class SpecParams:
    """Model parameters; each has a --sim-spec-* flag."""

    accept_prob: float = 0.70
    draft_step_cost: float = DEFAULT_DRAFT_STEP_COST
    topk_cost: float = DEFAULT_TOPK_COST
    verify_token_cost: float = DEFAULT_VERIFY_TOKEN_COST
    draft_batch_cost: float = DEFAULT_DRAFT_BATCH_COST
    verify_batch_cost: float = DEFAULT_VERIFY_BATCH_COST
    draft_cost_scale: float = 1.0
    block_draft: bool = False


def params_for(
    algorithm: str,
    accept_prob: float | None = None,
    draft_step_cost: float = DEFAULT_DRAFT_STEP_COST,
    topk_cost: float = DEFAULT_TOPK_COST,
    verify_token_cost: float = DEFAULT_VERIFY_TOKEN_COST,
    draft_batch_cost: float = DEFAULT_DRAFT_BATCH_COST,
    verify_batch_cost: float = DEFAULT_VERIFY_BATCH_COST,
) -> SpecParams:
    profile = PROFILES.get(algorithm.upper(), DEFAULT_PROFILE)
    return SpecParams(
        accept_prob=profile.accept_prob if accept_prob is None else accept_prob,
        draft_step_cost=draft_step_cost,
        topk_cost=topk_cost,
        verify_token_cost=verify_token_cost,
        draft_batch_cost=draft_batch_cost,
        verify_batch_cost=verify_batch_cost,
        draft_cost_scale=profile.draft_cost_scale,
        block_draft=profile.block_draft,
    )


def effective_depth(steps: int, draft_tokens: int, block_draft: bool = False) -> int:
    """How many draft positions one verify step can accept: the drafted depth, capped by the verify budget."""
    if block_draft:
        return max(0, draft_tokens - 1)
    return max(0, min(steps, draft_tokens - 1))


def per_position_acceptance(
    accept_prob: float, topk: int, steps: int, draft_tokens: int, block_draft: bool = False
) -> float:
    """Chance that a drafted position is accepted, given the candidates the tree can afford there."""
    depth = effective_depth(steps, draft_tokens, block_draft)
    if depth == 0:
        return 0.0
    branches = 1.0 if block_draft else max(1.0, min(float(topk), (draft_tokens - 1) / depth))
    return 1.0 - (1.0 - accept_prob) ** branches


def accept_length(steps: int, topk: int, draft_tokens: int, params: SpecParams) -> float:
    """Mean tokens emitted per verify step: 1 (the bonus token) + sum of q**i for i in 1..depth."""
    depth = effective_depth(steps, draft_tokens, params.block_draft)
    q = per_position_acceptance(params.accept_prob, topk, steps, draft_tokens, params.block_draft)
    if depth == 0 or q <= 0.0:
        return 1.0
    if q >= 1.0:
        return 1.0 + depth
    return 1.0 + q * (1.0 - q**depth) / (1.0 - q)


def plain_step_cost(running: int = 1, batch_slowdown: float = DEFAULT_BATCH_SLOWDOWN) -> float:
    """One plain decode step with `running` requests in the batch, in units of a step with one request."""
    return 1.0 + batch_slowdown * (max(running, 1) - 1)


def step_cost(
    steps: int,
    topk: int,
    draft_tokens: int,
    params: SpecParams,
    running: int = 1,
    batch_slowdown: float = DEFAULT_BATCH_SLOWDOWN,
) -> float:
    """Time of one draft-and-verify step with `running` requests in the batch, in single-request decode steps.

    The target's forward grows like a plain step; the draft's forwards grow slowly; the extra verify tokens
    cost little alone but grow fast with the batch (they are compute, not memory reads): what moves the best
    step count down as the load rises.
    """
    others = max(running, 1) - 1
    draft_steps = 1 if params.block_draft else steps
    draft = params.draft_step_cost * params.draft_cost_scale * draft_steps * (1.0 + params.topk_cost * (topk - 1))
    verify = params.verify_token_cost * max(0, draft_tokens - 1)
    return (
        plain_step_cost(running, batch_slowdown)
        + draft * (1.0 + params.draft_batch_cost * others)
        + verify * (1.0 + params.verify_batch_cost * others)
    )


def speedup(
    steps: int,
    topk: int,
    draft_tokens: int,
    params: SpecParams,
    running: int = 1,
    batch_slowdown: float = DEFAULT_BATCH_SLOWDOWN,
) -> float:
    """Decode throughput relative to no speculation at the same batch size (`running` tokens per plain step)."""
    plain = max(running, 1) / plain_step_cost(running, batch_slowdown)
    return throughput(steps, topk, draft_tokens, params, running, batch_slowdown) / plain


def throughput(
    steps: int,
    topk: int,
    draft_tokens: int,
    params: SpecParams,
    running: int = 1,
    batch_slowdown: float = DEFAULT_BATCH_SLOWDOWN,
) -> float:
    """Output tokens per single-request decode step, over the whole batch of `running` requests."""
    cost = step_cost(steps, topk, draft_tokens, params, running, batch_slowdown)
    return max(running, 1) * accept_length(steps, topk, draft_tokens, params) / cost


def best_steps(
    params: SpecParams, running: int, candidates=range(1, 9), batch_slowdown: float = DEFAULT_BATCH_SLOWDOWN
) -> int:
    """The EAGLE top-k 1 step count (draft tokens = steps + 1) with the highest throughput at this batch size."""
    return max(candidates, key=lambda s: throughput(s, 1, s + 1, params, running, batch_slowdown))


def noisy_accept_length(mean: float, draft_tokens: int, noise: float, seed: int, request_id: str) -> float:
    """One request's accept length: the mean times (1 + noise * N(0, 1)), seeded by (seed, request id)."""
    rng = random.Random(f"{seed}:{request_id}")
    value = mean * (1.0 + noise * rng.gauss(0.0, 1.0))
    return min(max(value, 1.0), float(max(draft_tokens, 1)))


def verify_count(completion_tokens: int, request_accept_length: float, draft_tokens: int) -> int:
    """Verify steps needed to emit the tokens: at least one, and never more than draft_tokens per step."""
    if completion_tokens <= 0:
        return 0
    by_length = round(completion_tokens / request_accept_length)
    floor = math.ceil(completion_tokens / max(draft_tokens, 1))
    return max(1, by_length, floor)


def draft_depth(steps: int, topk: int, draft_tokens: int) -> int:
    """The size that draft buffers (KV slots, CUDA graphs) scale with."""
    return max(draft_tokens, steps * topk)


def draft_memory_mib(steps: int, topk: int, draft_tokens: int, base_mib: int, per_token_mib: int) -> int:
    """GPU memory the draft model and its buffers add to each scheduler."""
    return base_mib + per_token_mib * draft_depth(steps, topk, draft_tokens)
