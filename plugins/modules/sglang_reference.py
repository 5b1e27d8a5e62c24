#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_reference
short_description: Golden greedy outputs of an SGLang engine without speculation, and whether a setting reproduces them
version_added: 0.2.0
description:
  - Speculative decoding must not change greedy output. This module finds the golden outputs of the model without
    speculation and scores the engine running now against them, as the reference gate of
    M(llmops.inference.sglang_restart) scores a changed engine against its known-good.
  - O(action=golden) returns the golden outputs (prompt token ids, greedy output ids and their logprobs) - from the
    host's reference under O(known_good_root) when it was recorded without speculation, else from the engine running
    now when it runs none (SGLang's C(/generate) with C(return_logprob)). When neither is possible RV(golden) is null
    and RV(reason) says so.
  - O(action=score) scores the engine running now against O(golden) - teacher-forced (C(input_ids),
    C(logprob_start_len), C(max_new_tokens) 0, or 1 with speculation) and free-running - and says whether it is
    lossless (RV(lossless)); a greedy output that differs beyond O(logprob_tolerance) is not.
attributes:
  check_mode:
    support: full
    description: It only sends generation requests, which change nothing on the server, so it runs in check mode too.
  diff_mode:
    support: none
    description: Nothing on the server changes; there is no diff.
  idempotent:
    support: full
    description: It never changes anything (C(changed) is always false).
extends_documentation_fragment:
  - llmops.inference.sglang_server
options:
  action:
    description: Find the golden outputs (V(golden)), or score the engine against them (V(score)).
    type: str
    choices: [golden, score]
    required: true
  golden:
    description: With O(action=score), the golden outputs RV(golden) returned.
    type: list
    elements: dict
  known_good_root:
    description: The host's known-good store (its C(reference.json)), looked at first by O(action=golden).
    type: path
  prompts:
    description: The prompts, when the golden outputs are recorded from the engine.
    type: list
    elements: str
    default:
      - Explain in three sentences why the sky is blue.
      - Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.
      - List the planets of the solar system in order from the sun, one per line.
  max_new_tokens:
    description: Tokens of each golden output, when recorded from the engine.
    type: int
    default: 48
  logprob_tolerance:
    description: The largest gap, in nats, of a golden token's teacher-forced logprob (the reference gate's default).
    type: float
    default: 0.1
  timeout:
    description: Seconds one request may take.
    type: float
    default: 120.0
seealso:
  - module: llmops.inference.sglang_restart
author:
  - llmops.inference contributors (@llmops)
"""

EXAMPLES = r"""
- name: The golden outputs without speculation
  llmops.inference.sglang_reference:
    action: golden
    known_good_root: /var/lib/llmops/known-good/sglang-qwen
  register: golden

- name: Is the speculative setting running now lossless?
  llmops.inference.sglang_reference:
    action: score
    golden: "{{ golden.golden }}"
  register: scored
  when: golden.golden is not none
"""

RETURN = r"""
golden:
  description: With O(action=golden), each prompt's C(prompt), C(prompt_ids), C(output_ids), C(logprobs), or null.
  returned: with O(action=golden)
  type: list
  elements: dict
source:
  description: With O(action=golden), where they came from (V(reference), V(engine)), or null.
  returned: with O(action=golden)
  type: str
reason:
  description: Where the golden outputs came from, or why there are none.
  returned: with O(action=golden)
  type: str
lossless:
  description:
    - With O(action=score), whether the engine reproduced every golden output (null when it could not be scored).
  returned: with O(action=score)
  type: bool
detail:
  description: With O(action=score), the failed checks (the first differing token and its logprob gap), or a summary.
  returned: with O(action=score)
  type: str
checks:
  description: With O(action=score), every check (C(logprobs), C(greedy_tokens) per prompt) with its figures.
  returned: with O(action=score)
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.reference_lossless import (  # noqa: E402
    golden_without_speculation,
    score_lossless,
)
from ansible_collections.llmops.inference.plugins.module_utils.reference_record import (  # noqa: E402
    ReferenceEngine,
    ReferenceMeasureError,
)
from ansible_collections.llmops.inference.plugins.module_utils.reference_settings import DEFAULT_PROMPTS  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.sglang import (  # noqa: E402
    SglangError,
    server_argument_spec,
    validate_url,
)

ARGUMENT_SPEC = dict(
    server_argument_spec(),
    action=dict(type="str", choices=["golden", "score"], required=True),
    golden=dict(type="list", elements="dict"),
    known_good_root=dict(type="path"),
    prompts=dict(type="list", elements="str", default=DEFAULT_PROMPTS),
    max_new_tokens=dict(type="int", default=48, no_log=False),
    logprob_tolerance=dict(type="float", default=0.1),
    timeout=dict(type="float", default=120.0),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC, supports_check_mode=True, required_if=[("action", "score", ["golden"])]
    )
    params = module.params
    try:
        url = validate_url(params["url"])
    except ValueError as exc:
        module.fail_json(msg=f"url: {exc}", option="url", changed=False)
    for name, low in (("max_new_tokens", 1), ("timeout", 1), ("logprob_tolerance", 0)):
        if params[name] < low:
            module.fail_json(msg=f"{name} must be at least {low}, got {params[name]}", option=name, changed=False)
    options = {key: params[key] for key in ("prompts", "max_new_tokens", "timeout")}
    engine = ReferenceEngine(url, params["api_key"], params["validate_certs"], options)
    try:
        if params["action"] == "golden":
            result = golden_without_speculation(engine, options, params["known_good_root"])
        else:
            result = score_lossless(engine, params["golden"], params["logprob_tolerance"])
    except (ReferenceMeasureError, SglangError) as exc:
        module.fail_json(msg=f"{params['action']}: {exc}", changed=False)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
