# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.module_utils.rollout import RolloutError, plan_rollout

DOCUMENTATION = r"""
name: rollout_plan
short_description: The batches of a rolling deploy, a multi-node engine's hosts always in one batch
version_added: 0.2.0
description:
  - Groups the hosts into batches of O(batch) hosts in their order, as C(serial) would, except that the hosts of a
    multi-node engine (C(sglang_service_node_group)) are never split across two batches - it restarts as one - and an
    engine larger than the batch is a batch of its own.
  - Hosts that are up to date are left out, unless another member of their engine is not, or O(force) is set.
author:
  - llmops.inference contributors
options:
  _input:
    description: The hosts, in deploy order (C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
  batch:
    description: Hosts per batch, a number or a share of the hosts deployed such as C(25%).
    type: raw
    required: true
  node_groups:
    description: Each host's C(sglang_service_node_group) (empty or missing - a single-node engine).
    type: dict
    required: true
  up_to_date:
    description: Whether each host is up to date (missing - it is not).
    type: dict
    required: true
  force:
    description: Deploy every host, also those that are up to date.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Plan the batches
  ansible.builtin.set_fact:
    plan: >-
      {{ ['gpu-a', 'gpu-b', 'gpu-c'] | llmops.inference.rollout_plan(1,
         node_groups={'gpu-a': ['gpu-a', 'gpu-b'], 'gpu-b': ['gpu-a', 'gpu-b']}, up_to_date={}) }}
  # plan.sizes: [2, 1] - the two hosts of one engine in the first batch, gpu-c in the second
"""

RETURN = r"""
_value:
  description: C(rollout) (the hosts to deploy, in batch order), C(sizes) (hosts per batch, for C(serial)),
    C(batches) and C(skipped) (the hosts left as they are).
  type: dict
"""


def rollout_plan(hosts, batch, node_groups, up_to_date, force=False) -> dict:
    try:
        return plan_rollout(list(hosts), batch, dict(node_groups), dict(up_to_date), bool(force))
    except RolloutError as exc:
        raise AnsibleFilterError(f"rollout_plan: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"rollout_plan": rollout_plan}
