# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What one pass over the probe's tiers found, and the result dict the module returns.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.gpu_memory import reset_message
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import TIER_NAMES

OK, FAILED, SKIPPED = "ok", "failed", "skipped"
EARLIER_FAILED = "earlier tier failed"
TEXT_SAMPLE_CHARS = 200
# What a probe says about a host, most urgent first: memory only a GPU reset frees, a hung engine (requests
# running or queued, no token generated in the progress window), any other failure, serving.
NEEDS_GPU_RESET, HUNG, NOT_SERVING, SERVING = "needs_gpu_reset", "hung", "not_serving", "serving"
STATES = (SERVING, NOT_SERVING, HUNG, NEEDS_GPU_RESET)


class TierResult:
    def __init__(self, name: str, status: str, reason: str = "", elapsed_s: float = 0.0):
        self.name = name
        self.status = status
        self.reason = reason
        self.elapsed_s = elapsed_s

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "reason": self.reason, "elapsed_s": round(self.elapsed_s, 3)}


class Attempt:
    """One pass over the tiers and what it learned."""

    def __init__(self):
        self.tiers = {}
        self.fatal = False
        self.unit_state = None
        self.gpu_memory_mib = {}
        self.model = {}
        self.speculative = {}
        self.generation = None
        self.gpu_errors = []
        self.progress = {}
        self.progress_opening = None
        self.soak = {}
        self.hung = False

    @property
    def failed_tier(self) -> str | None:
        for name in TIER_NAMES:
            tier = self.tiers.get(name)
            if tier is not None and tier.status == FAILED:
                return name
        return None

    @property
    def healthy(self) -> bool:
        return self.failed_tier is None


def probe_state(attempt: Attempt, unreapable) -> str:
    if attempt.healthy:
        return SERVING
    if unreapable:
        return NEEDS_GPU_RESET
    return HUNG if attempt.hung else NOT_SERVING


def probe_result(attempt: Attempt, attempts: int, waited_s: float, elapsed_s: float, unreapable=()) -> dict:
    """The module's result from the last attempt, how many there were, the time waited and spent, and the memory
    found that only a GPU reset frees (``unreapable``, looked for on an unhealthy host)."""
    failed = attempt.failed_tier
    state = attempt.unit_state
    unreapable = list(unreapable)
    return {
        "healthy": failed is None,
        "state": probe_state(attempt, unreapable),
        "failed_tier": failed,
        "reason": attempt.tiers[failed].reason if failed else None,
        "tiers": [attempt.tiers[name].as_dict() for name in TIER_NAMES],
        "main_pid": state.main_pid if state is not None else None,
        "n_restarts": state.n_restarts if state is not None else None,
        "active_state": state.active_state if state is not None else None,
        "gpu_memory_mib": attempt.gpu_memory_mib,
        "gpu_errors": attempt.gpu_errors,
        "model": attempt.model,
        "speculative": attempt.speculative,
        "generation": generation_facts(attempt.generation),
        "progress": dict(attempt.progress),
        "soak": dict(attempt.soak),
        "unreapable": unreapable,
        "reset_gpus": sorted({entry["gpu"] for entry in unreapable if entry["gpu"] is not None}),
        "reset_message": reset_message(unreapable) if unreapable else None,
        "waited_s": round(waited_s, 3),
        "elapsed_s": round(elapsed_s, 3),
        "attempts": attempts,
    }


def _rounded(value, digits: int = 3):
    return round(value, digits) if isinstance(value, float) else value


def generation_facts(result) -> dict:
    if result is None:
        return {}
    return {
        "text": result.text[:TEXT_SAMPLE_CHARS],
        "completion_tokens": result.completion_tokens,
        "latency_s": _rounded(result.latency_s),
        "ttft_s": _rounded(result.ttft_s),
        "tokens_per_s": _rounded(result.tokens_per_s, 1),
        "accept_length": _rounded(result.accept_length),
    }
