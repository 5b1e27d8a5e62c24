# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.fleet_report import fleet_report as _fleet_report

DOCUMENTATION = r"""
name: fleet_report
short_description: The fleet probe's report, one line per host and one per multi-node engine
version_added: 0.2.0
description:
  - Writes the report of C(playbooks/fleet_probe.yml) from each host's M(llmops.inference.sglang_probe) result - a
    headline with the count of hosts serving, hung and needing a GPU reset, one line per host (state, why, main PID,
    restarts, GPU memory, generation speed), then one line per multi-node engine
    (C(sglang_service_node_group)).
  - A multi-node engine serves only when every rank does - its line takes the most urgent state of its ranks and names
    each rank that does not serve or was not probed.
author:
  - llmops.inference contributors
options:
  _input:
    description: The hosts probed, in report order (C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
  probes:
    description: Each host's M(llmops.inference.sglang_probe) result.
    type: dict
    required: true
  ranks:
    description: Each host's rank in its multi-node engine (missing - 0).
    type: dict
    required: true
  node_groups:
    description: Each host's C(sglang_service_node_group) (empty or missing - a single-node engine).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Print the fleet's health
  ansible.builtin.debug:
    msg: >-
      {{ (ansible_play_hosts | llmops.inference.fleet_report(probes=probes, ranks=ranks, node_groups=groups)).lines }}
"""

RETURN = r"""
_value:
  description: C(lines) (the headline, a line per host, a line per multi-node engine) and C(counts) (hosts per state -
    C(serving), C(not_serving), C(hung), C(needs_gpu_reset)).
  type: dict
"""


def fleet_report(hosts, probes, ranks, node_groups) -> dict:
    return _fleet_report(list(hosts), dict(probes), dict(ranks), dict(node_groups))


class FilterModule:
    def filters(self):
        return {"fleet_report": fleet_report}
