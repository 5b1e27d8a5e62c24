# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.module_utils.rollout import preflight_verdict as _verdict

DOCUMENTATION = r"""
name: preflight_verdict
short_description: What a rolling run does after its preflight, and a record for every host it holds back
version_added: 0.2.0
description:
  - A deploy is refused whole when a host failed its preflight or was not reached; so is a rollback when a host
    failed its preflight, or was not reached and O(require_all_reachable) is set.
  - Otherwise a rollback goes on without the hosts not reached, and without every member of a node group
    (C(sglang_service_node_group)) that has one, since a group returns whole; each is named in the records.
author:
  - llmops.inference contributors
options:
  _input:
    description: Every host the preflight targeted, in order (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  answers:
    description:
      - What each host that answered said - C(before) (its state before the run, C(__fleet_before), none when its
        preflight did not finish), C(refusal) (why its preflight failed, none when it did not) and C(node_group) (the
        members of its node group, empty for a single-node engine). A host missing here, or with neither a state
        nor a refusal, was not reached.
    type: dict
    required: true
  purpose:
    description: The run.
    type: str
    choices: [deploy, rollback]
    required: true
  require_all_reachable:
    description: Refuse a rollback, too, when a host was not reached.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Judge the preflight
  ansible.builtin.set_fact:
    verdict: >-
      {{ ['gpu-a', 'gpu-b', 'gpu-c'] | llmops.inference.preflight_verdict(
         {'gpu-a': {'before': {}}, 'gpu-b': {'before': {}}}, 'rollback') }}
  # verdict.go: [gpu-a, gpu-b]; verdict.records.gpu-c.outcome: skipped
"""

RETURN = r"""
_value:
  description: C(go) (the hosts that go on, in order), C(refused), C(note) (the summary's line on what was held back
    and why, empty when nothing was) and C(records) (per host held back, C(outcome) and C(detail)).
  type: dict
"""


def preflight_verdict(hosts, answers, purpose, require_all_reachable=False) -> dict:
    if purpose not in ("deploy", "rollback"):
        raise AnsibleFilterError(f"preflight_verdict: purpose must be deploy or rollback, got {purpose!r}")
    state = {
        host: {
            "passed": (answer or {}).get("before") is not None,
            "refusal": (answer or {}).get("refusal"),
            "node_group": (answer or {}).get("node_group"),
        }
        for host, answer in dict(answers or {}).items()
    }
    return _verdict(list(hosts), state, purpose, bool(require_all_reachable))


class FilterModule:
    def filters(self):
        return {"preflight_verdict": preflight_verdict}
