# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Scoring an engine against its reference: each check with its figures, and the verdict.

Private to the llmops.inference collection; not a public API. Standard library only. Tolerances and their
rationale: reference_settings.py.

Checks (each ``{"check", "passed", "detail", ...figures}``):

- ``logprobs``: per golden prompt, the teacher-forced logprob of every golden token now against the recorded
  one; the first token whose gap exceeds ``logprob_tolerance`` fails it, named with its position and both values.
- ``greedy_tokens``: per golden prompt, the free-running greedy output now against the golden ids; a differing
  token fails unless the golden token was a near tie (recorded probability at most 0.5, within the tolerance)
  and its teacher-forced logprob kept within the tolerance.
- speed, per figure of the fingerprint: throughput (``tok_s_c<N>``) and the accept length fail when the new
  median falls below the reference's lowest repeat by more than ``speed_tolerance``; latencies (``ttft_ms``,
  ``itl_ms``) when it rises above the reference's highest repeat by more than that plus ``latency_floor_ms``.
"""

from __future__ import annotations

import math

NEAR_TIE = math.log(0.5)
HIGHER_IS_BETTER = ("tok_s_", "accept_length")


def _logprob_check(index: int, recorded: dict, forced: list, tolerance: float) -> dict:
    golden = recorded["logprobs"]
    if len(forced) < len(golden):
        return _failed("logprobs", index, f"the engine scored {len(forced)} of the {len(golden)} golden tokens")
    gaps = [abs(new - old) if new is not None and old is not None else math.inf for old, new in zip(golden, forced)]
    worst = max(gaps) if gaps else 0.0
    for position, gap in enumerate(gaps):
        if gap > tolerance:
            return {
                **_failed(
                    "logprobs",
                    index,
                    f"golden token {position} (id {recorded['output_ids'][position]}) of prompt {index}: logprob "
                    f"{_fmt(forced[position])} now, {_fmt(golden[position])} recorded, a gap of {_fmt(gap)} "
                    f"(tolerance {tolerance:g})",
                ),
                "token": position,
                "gap": gap,
                "max_gap": worst,
            }
    return {
        "check": "logprobs",
        "prompt": index,
        "passed": True,
        "max_gap": worst,
        "detail": f"prompt {index}: {len(golden)} tokens within {tolerance:g} (largest gap {_fmt(worst)})",
    }


def _greedy_check(index: int, recorded: dict, observed: dict, tolerance: float, logprob: dict) -> dict:
    golden, now = recorded["output_ids"], observed["output_ids"]
    for position, expected in enumerate(golden):
        actual = now[position] if position < len(now) else None
        if actual == expected:
            continue
        near_tie = recorded["logprobs"][position] <= NEAR_TIE + tolerance
        forced_ok = logprob["passed"] or logprob.get("token", math.inf) > position
        if near_tie and forced_ok:
            return {
                "check": "greedy_tokens",
                "prompt": index,
                "passed": True,
                "first_difference": position,
                "detail": f"prompt {index}: greedy output differs from token {position} on, where the golden "
                "token was a near tie and its logprob is unchanged",
            }
        return {
            **_failed(
                "greedy_tokens",
                index,
                f"greedy output of prompt {index} differs from token {position} on: id {actual} now, {expected} "
                f"recorded (recorded logprob {_fmt(recorded['logprobs'][position])}, no near tie)",
            ),
            "first_difference": position,
        }
    return {
        "check": "greedy_tokens",
        "prompt": index,
        "passed": True,
        "first_difference": None,
        "detail": f"prompt {index}: {len(golden)} greedy tokens identical",
    }


def output_checks(golden: list, observed: list, tolerance: float) -> list:
    checks = []
    for index, (recorded, now) in enumerate(zip(golden, observed)):
        logprob = _logprob_check(index, recorded, now["teacher_forced"], tolerance)
        checks.extend([logprob, _greedy_check(index, recorded, now, tolerance, logprob)])
    return checks


def speed_checks(reference: dict, observed: dict, tolerance: float, floor_ms: float) -> list:
    checks = []
    for name in sorted(reference):
        old, new = reference[name], observed.get(name) or {}
        if old.get("median") is None or new.get("median") is None:
            continue
        higher = name.startswith(HIGHER_IS_BETTER)
        if higher:
            limit = old["low"] * (1.0 - tolerance)
            passed = new["median"] >= limit
            bound = f"at least {limit:.4g} (the reference's lowest repeat {old['low']:.4g} less {tolerance:.0%})"
        else:
            limit = old["high"] * (1.0 + tolerance) + floor_ms
            passed = new["median"] <= limit
            bound = (
                f"at most {limit:.4g} (the reference's highest repeat {old['high']:.4g} plus {tolerance:.0%} "
                f"and {floor_ms:g} ms)"
            )
        ratio = new["median"] / old["median"] if old["median"] else None
        checks.append(
            {
                "check": name,
                "passed": passed,
                "ratio": ratio,
                "median": new["median"],
                "spread": [new["low"], new["high"]],
                "reference_median": old["median"],
                "reference_spread": [old["low"], old["high"]],
                "detail": f"{name}: median {new['median']:.4g} now (spread {new['low']:.4g}-{new['high']:.4g}), "
                f"{old['median']:.4g} recorded (spread {old['low']:.4g}-{old['high']:.4g}), ratio "
                f"{_fmt(ratio)}; must be {bound}",
            }
        )
    return checks


def verdict(checks: list, reference_label: str) -> tuple:
    """``(passed, reason)``: the reason names every failed check, by how much, and the reference."""
    failed = [check for check in checks if not check["passed"]]
    if not failed:
        return True, f"{len(checks)} checks passed against the reference {reference_label}"
    named = "; ".join(f"{check['check']} failed: {check['detail']}" for check in failed)
    return False, f"against the reference {reference_label}: {named}"


def _failed(check: str, index: int, detail: str) -> dict:
    return {"check": check, "prompt": index, "passed": False, "detail": detail}


def _fmt(value) -> str:
    return "none" if value is None else f"{value:.4g}"
