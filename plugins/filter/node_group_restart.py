# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.module_utils.node_group import NodeGroupError
from ansible_collections.llmops.inference.plugins.module_utils.node_group_restart import STEPS, decide, judge

DOCUMENTATION = r"""
name: node_group_restart
short_description: Whether a multi-node engine restarts, and its group's verdict after each step of the restart
version_added: 0.2.0
description:
  - A multi-node engine (the C(llmops.inference.sglang_service) role's C(sglang_service_node_group)) restarts as one.
    Every member evaluates this filter on the same inputs - its members' values read from C(hostvars) - and so
    reaches the same answer.
  - With O(step=decide), the input maps each member to whether it needs a restart; the result says whether the
    group restarts (any member needs it), this host's C(rank) and the members in rank C(order). A member that is not
    in the play any more fails the filter, naming its rank and host.
  - With O(step) one of V(stop_rank0), V(stop_ranks), V(start), V(gate_ranks), V(gate_rank0) (the steps of a group
    restart, in order) or V(cleanup) (the stop of every member after a failure), the input maps each member to the
    result of its M(llmops.inference.sglang_restart) phase; the result is the group's verdict - C(ok), C(touched)
    (whether an engine of the group was stopped), C(failed) (C(rank), C(host), C(step), C(reason) of each failed
    member) and C(msg) naming them.
author:
  - llmops.inference contributors
options:
  _input:
    description: Each member's answer (O(step=decide)) or its sglang_restart result, by inventory name.
    type: dict
    required: true
  step:
    description: V(decide), or the step of the group restart just run.
    type: str
    choices: [decide, stop_rank0, stop_ranks, start, gate_ranks, gate_rank0, cleanup]
    required: true
  host:
    description: With O(step=decide), this host (C(inventory_hostname)).
    type: str
  ranks:
    description: Each member's rank (C(ranks) of M(llmops.inference.sglang_info)'s C(node_group) check).
    type: dict
    required: true
  play_hosts:
    description: The hosts still in the play (C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
  previous:
    description: The verdict of the step before; a group that failed stays failed.
    type: dict
  force:
    description: With O(step=decide), restart the group even when no member needs it.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Decide whether the group restarts
  ansible.builtin.set_fact:
    group_restart: >-
      {{ {'gpu-a': true, 'gpu-b': false} | llmops.inference.node_group_restart('decide', host=inventory_hostname,
         ranks={'gpu-a': 0, 'gpu-b': 1}, play_hosts=ansible_play_hosts) }}
"""

RETURN = r"""
_value:
  description: The decision (C(restart), C(why), C(rank), C(order), C(members)) or the verdict (C(ok), C(touched),
    C(failed), C(msg)).
  type: dict
"""


def node_group_restart(values, step, **given) -> dict:
    unknown = sorted(set(given) - {"host", "ranks", "play_hosts", "previous", "force"})
    if unknown:
        raise AnsibleFilterError(f"node_group_restart: unknown argument(s) {', '.join(unknown)}")
    ranks = given.get("ranks")
    if not isinstance(values, dict):
        raise AnsibleFilterError(f"node_group_restart expects a dict by member, got {type(values).__name__}")
    if not isinstance(ranks, dict) or not ranks:
        raise AnsibleFilterError(
            "node_group_restart: ranks must map each member of the group to its rank (the role's preflight in this "
            "play finds them)"
        )
    play_hosts = given.get("play_hosts")
    try:
        if step == "decide":
            return decide(values, given.get("host"), ranks, play_hosts, force=bool(given.get("force")))
        if step not in STEPS:
            raise AnsibleFilterError(
                f"node_group_restart: step must be decide or one of {', '.join(STEPS)}, got {step!r}"
            )
        return judge(values, step, ranks, play_hosts, given.get("previous"))
    except NodeGroupError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"node_group_restart": node_group_restart}
