# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Losslessness of a speculative setting: its greedy outputs scored against the no-speculation golden ones.

Private to the llmops.inference collection; not a public API. Standard library plus the collection's clients.

``golden_without_speculation`` finds the golden outputs of the model without speculation: the host's reference
(known_good.py ``reference.json``) when it was recorded without speculation, else the engine running now when it
runs none; otherwise there is none, and the sweep says its points' losslessness was not checked.
``score_lossless`` scores them on the engine running now (teacher-forced and free-running, as the reference gate
does) with the reference gate's output checks: a point whose greedy output differs beyond the tolerance is not
lossless, however fast.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore, SnapshotError
from ansible_collections.llmops.inference.plugins.module_utils.reference_record import (
    ReferenceEngine,
    ReferenceMeasureError,
    golden,
)
from ansible_collections.llmops.inference.plugins.module_utils.reference_score import output_checks
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangError


def speculative_algorithm(client) -> str | None:
    info = client.server_info()
    return (info or {}).get("speculative_algorithm") if isinstance(info, dict) else None


def golden_without_speculation(engine: ReferenceEngine, options: dict, known_good_root: str | None) -> dict:
    """``{"golden": [...] or None, "source": "reference" | "engine" | None, "reason": ...}``."""
    if known_good_root:
        try:
            reference = KnownGoodStore(known_good_root).read_reference()
        except (SnapshotError, OSError):
            reference = None
        if reference and not reference.get("speculative") and reference.get("golden"):
            at = reference.get("recorded_at")
            return {"golden": reference["golden"], "source": "reference", "reason": f"the host's reference of {at}"}
    client = engine.client()
    algorithm = speculative_algorithm(client)
    if algorithm:
        return {
            "golden": None,
            "source": None,
            "reason": f"the engine runs {algorithm} and the host has no reference recorded without speculation: "
            "losslessness is not checked",
        }
    outputs = [golden(client, prompt, options["max_new_tokens"], options["timeout"]) for prompt in options["prompts"]]
    return {"golden": outputs, "source": "engine", "reason": "recorded now from the engine, which runs no speculation"}


def score_lossless(engine: ReferenceEngine, golden_outputs: list, tolerance: float) -> dict:
    """``{"lossless": bool, "detail": ..., "checks": [...]}`` of the engine running now."""
    try:
        speculative = bool(speculative_algorithm(engine.client()))
        observed = engine.observe(golden_outputs, speculative, performance=False)
    except (ReferenceMeasureError, SglangError) as exc:
        return {"lossless": None, "detail": f"could not be scored: {exc}", "checks": []}
    checks = output_checks(golden_outputs, observed["scores"], tolerance)
    failed = [check for check in checks if not check["passed"]]
    detail = "; ".join(check["detail"] for check in failed) or f"{len(golden_outputs)} golden outputs reproduced"
    return {"lossless": not failed, "detail": detail, "checks": checks}
