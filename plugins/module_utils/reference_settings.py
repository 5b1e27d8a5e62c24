# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reference gate's options: what is recorded with a known-good, how it is measured, the tolerances.

Private to the llmops.inference collection; not a public API. Standard library only.

REFERENCE_SPEC is the one place each option and its default is written (sglang_restart's ``reference``).

Why the default tolerances hold on one build and fail on a real change:

- Outputs are scored at batch size 1 (one request at a time), so a GPU's batch-shape dependent kernels do not
  move them; on the same build and numerics the logprobs of a teacher-forced continuation agree to about 1e-3
  nats. ``logprob_tolerance`` (0.1 nats per token, about 10 % in probability) leaves room for that and for a
  different but equivalent kernel choice, and is far below what a wrong numerics change, a broken sampler or a
  lossy draft does to the golden tokens (whole nats). SGLang's ``--enable-deterministic-inference`` makes the
  engine batch-invariant; with it the tolerance can be tightened towards 0.
- A free-running greedy token may differ from the golden one only where the golden token was a near tie
  (recorded probability below 0.5, within the tolerance), since only then can noise flip the argmax.
- Speed is compared noise-aware: each figure is the median of ``repeats`` runs, and a new median fails only
  beyond the reference's own spread (its worst repeat) by more than ``speed_tolerance`` (10 %); latencies get
  ``latency_floor_ms`` more, since a few milliseconds are noise on any machine.
"""

from __future__ import annotations

import math

from ansible_collections.llmops.inference.plugins.module_utils.bench_prompts import BUILTIN_PROMPTS
from ansible_collections.llmops.inference.plugins.module_utils.module_support import OptionError

MODE_CHANGED = "changed"
MODE_ALWAYS = "always"
MODE_OFF = "off"
MODES = (MODE_CHANGED, MODE_ALWAYS, MODE_OFF)
DEFAULT_PROMPTS = list(BUILTIN_PROMPTS[:3])

REFERENCE_SPEC = dict(
    mode=dict(type="str", choices=list(MODES), default=MODE_CHANGED),
    accept=dict(type="bool", default=False),
    record_missing=dict(type="bool", default=True),
    prompts=dict(type="list", elements="str", default=DEFAULT_PROMPTS),
    max_new_tokens=dict(type="int", default=48, no_log=False),
    logprob_tolerance=dict(type="float", default=0.1),
    speed_tolerance=dict(type="float", default=0.1),
    latency_floor_ms=dict(type="float", default=5.0),
    concurrency=dict(type="list", elements="int", default=[1, 4]),
    requests_per_user=dict(type="int", default=2),
    repeats=dict(type="int", default=3),
    perf_max_new_tokens=dict(type="int", default=64, no_log=False),
    timeout=dict(type="float", default=120.0),
)


class ReferenceInputError(OptionError):
    """A reference option is wrong; nothing on the host was touched."""


def defaults() -> dict:
    return {
        name: (list(spec["default"]) if isinstance(spec["default"], list) else spec["default"])
        for name, spec in REFERENCE_SPEC.items()
    }


def parse_reference_options(given: dict | None) -> dict:
    """The options with defaults filled in, checked; ReferenceInputError names ``reference.<option>``."""
    options = defaults()
    options.update({key: value for key, value in (given or {}).items() if value is not None})
    unknown = sorted(set(options) - set(REFERENCE_SPEC))
    if unknown:
        raise ReferenceInputError(
            f"reference.{unknown[0]}", f"reference has no option {unknown[0]!r}; accepted: {', '.join(REFERENCE_SPEC)}"
        )
    if options["mode"] not in MODES:
        raise ReferenceInputError(
            "reference.mode", f"reference.mode must be one of {', '.join(MODES)}, got {options['mode']!r}"
        )
    prompts = options["prompts"]
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ReferenceInputError("reference.prompts", "reference.prompts must be a non-empty list of prompts")
    for name, low in (("max_new_tokens", 1), ("requests_per_user", 1), ("repeats", 2), ("perf_max_new_tokens", 1)):
        _at_least(options, name, low)
    for name in ("logprob_tolerance", "speed_tolerance", "latency_floor_ms"):
        _at_least(options, name, 0.0)
    _at_least(options, "timeout", 1.0)
    levels = options["concurrency"]
    if not levels or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in levels):
        raise ReferenceInputError(
            "reference.concurrency",
            f"reference.concurrency must list whole numbers >= 1, such as [1, 4], got {levels!r}",
        )
    options["concurrency"] = sorted(set(levels))
    return options


def _at_least(options: dict, name: str, low: float) -> None:
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ReferenceInputError(f"reference.{name}", f"reference.{name} must be a number >= {low:g}, got {value!r}")
