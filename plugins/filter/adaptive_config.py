# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from ansible_collections.llmops.inference.plugins.module_utils.sweep_adaptive import (
    candidate_union,
    config_errors,
    normalize_config,
    render_config,
    unsupported_reason,
)

DOCUMENTATION = r"""
name: adaptive_config
short_description: Read SGLang's adaptive speculative config from a sweep's result, and check it as SGLang would
version_added: 0.1.0
description:
  - The input is the config itself (a mapping keyed by batch size, each entry with C(candidate_steps) and optional
    knobs), or the path on the controller of a sweep's result - its C(results.json) (the report's deployable adaptive
    config is taken) or its C(results-adaptive-config.json).
  - Returns what a role needs - C(config) (keys as strings, in batch-size order), C(text) (the file's content),
    C(candidate_steps) (every entry's together), C(source) (where it came from) and C(errors), each naming the entry
    that SGLang would refuse at start, skip silently, or that is unusable with the engine's own settings (SGLang's
    C(adaptive_unsupported_reason), C(--speculative-num-steps) outside the candidates). Empty input - no config.
author:
  - llmops.inference contributors
options:
  _input:
    description: The config (a mapping), or the path of a sweep's result on the controller; empty for none.
    type: raw
    required: true
  engine:
    description:
      - The engine's settings - C(algorithm) (C(--speculative-algorithm)), C(topk) (C(--speculative-eagle-topk), null
        - SGLang sets 1), C(num_steps) (C(--speculative-num-steps), null - SGLang takes the middle candidate) and
        C(extra_args) (its other arguments - attention DP, multi-layer EAGLE, two-batch overlap, PD multiplexing).
    type: dict
  variable:
    description: The variable's name, for the errors.
    type: str
"""

EXAMPLES = r"""
- name: Read a sweep's adaptive config
  ansible.builtin.set_fact:
    adaptive: "{{ '/srv/sweeps/qwen/results.json' | llmops.inference.adaptive_config({'algorithm': 'EAGLE'}) }}"
"""

RETURN = r"""
_value:
  description: C(config), C(text), C(candidate_steps), C(source) and C(errors) (empty when usable).
  type: dict
"""


def _from_path(path: str) -> tuple:
    if not os.path.isabs(path):
        return None, f"a path must be absolute on the controller, got {path!r}"
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError) as exc:
        return None, f"cannot read {path}: {exc}"
    if isinstance(document, Mapping) and "deployable" in document:
        adaptive = (document.get("deployable") or {}).get("adaptive") or {}
        if adaptive.get("config") is None:
            return None, f"the sweep's result {path} has no adaptive config: {adaptive.get('reason')}"
        return adaptive["config"], f"the deployable adaptive config of the sweep's result {path}"
    return document, f"the adaptive config file {path}"


def adaptive_config(value, engine=None, variable="the config"):
    engine = engine or {}
    empty = {"config": None, "text": "", "candidate_steps": [], "source": None, "errors": []}
    if value in (None, "", {}):
        return empty
    if isinstance(value, str):
        config, source = _from_path(value)
        if config is None:
            return dict(empty, errors=[f"{variable}: {source}"])
    elif isinstance(value, Mapping):
        config, source = dict(value), "the config given"
    else:
        return dict(empty, errors=[f"{variable}: must be a mapping or a path, got {type(value).__name__}"])
    errors = [f"{variable} ({source}): {error}" for error in config_errors(config)]
    if errors:
        return dict(empty, source=source, errors=errors)
    topk, num_steps = engine.get("topk"), engine.get("num_steps")
    topk = None if topk in (None, "") else int(topk)
    num_steps = None if num_steps in (None, "") else int(num_steps)
    reason = unsupported_reason(engine.get("algorithm"), topk, engine.get("extra_args"))
    if reason is not None:
        errors.append(f"{variable}: SGLang would not run adaptive speculative decoding with this engine: {reason}")
    union = candidate_union(config)
    if num_steps is not None and num_steps not in union:
        errors.append(
            f"{variable}: --speculative-num-steps={num_steps} is not in the adaptive config candidate_steps {union} "
            "(SGLang refuses to start); set sglang_service_speculative_num_steps to one of them or to null"
        )
    normal = normalize_config(config)
    return {
        "config": normal,
        "text": render_config(normal),
        "candidate_steps": union,
        "source": source,
        "errors": errors,
    }


class FilterModule:
    def filters(self):
        return {"adaptive_config": adaptive_config}
