# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.module_utils.role_vars import problems

DOCUMENTATION = r"""
name: role_var_problems
short_description: A role's variables checked against its argument specs - strict types, and names it does not know
version_added: 0.2.0
description:
  - Checks each variable against its option in the role's C(meta/argument_specs.yml) (the C(main) entry point)
    strictly - a string is not a list, a list is not an integer - where Ansible's own validation would convert it.
  - Finds the variables with the role's prefix that none of the role's entry points knows, each with the closest
    known name (a typo such as C(sglang_service_drain_timout)).
author:
  - llmops.inference contributors
options:
  _input:
    description: The role's known variables and their values.
    type: dict
    required: true
  argument_specs:
    description: The role's C(meta/argument_specs.yml), parsed.
    type: dict
    required: true
  role:
    description: The role's name, such as C(sglang_service); its variables' prefix is the name and C(_).
    type: str
    required: true
  names:
    description: Every variable name defined with the prefix (C(query('ansible.builtin.varnames', '^prefix'))).
    type: list
    elements: str
    default: []
  ignore:
    description: Names with the prefix that the role itself sets (its facts), which are not typos.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Check the role's variables
  ansible.builtin.set_fact:
    problems: >-
      {{ {'sglang_service_gpus': '0,1'} | llmops.inference.role_var_problems(
         lookup('ansible.builtin.file', role_path ~ '/meta/argument_specs.yml') | from_yaml,
         role='sglang_service', names=['sglang_service_drain_timout']) }}
  # problems.errors: ['sglang_service_gpus must be a list (...); got "0,1" (a string)']
  # problems.unknown: [{'name': 'sglang_service_drain_timout', 'closest': 'sglang_service_drain_timeout'}]
"""

RETURN = r"""
_value:
  description: C(errors) (one message per variable of the wrong type, naming it, what it accepts and what it got),
    C(unknown) (each unknown name with its C(closest) known name, or null) and C(unknown_msg) (one line naming them).
  type: dict
"""


def role_var_problems(values, argument_specs, role, names=(), ignore=()) -> dict:
    if not isinstance(values, dict) or not isinstance(argument_specs, dict):
        raise AnsibleFilterError("role_var_problems: give the variables and the argument specs as mappings")
    return problems(dict(values), argument_specs, str(role), list(names or ()), list(ignore or ()))


class FilterModule:
    def filters(self):
        return {"role_var_problems": role_var_problems}
