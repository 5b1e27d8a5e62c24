# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: cli_args
short_description: Turn a dictionary of settings into C(--long-option value) arguments
version_added: 0.1.0
description:
  - Each key becomes a long option (C(tp_size) becomes C(--tp-size)), in the dictionary's order.
  - A string or number value follows its option as one argument; C(true) gives the bare option;
    a list gives the option followed by each element (argparse C(nargs)).
  - C(null), C(false), an empty string and an empty list leave the option out, so unset settings
    fall back to the program's own defaults.
author:
  - llmops.inference contributors
options:
  _input:
    description: Option names (with underscores or dashes, without the leading C(--)) and their values.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Build SGLang's arguments
  ansible.builtin.debug:
    msg: "{{ {'model_path': '/models/qwen', 'tp_size': 2, 'enable_metrics': true, 'context_length': none}
            | llmops.inference.cli_args }}"
  # ['--model-path', '/models/qwen', '--tp-size', '2', '--enable-metrics']
"""

RETURN = r"""
_value:
  description: The arguments, as a list of strings.
  type: list
  elements: str
"""


def _is_unset(value) -> bool:
    return value is None or value is False or (isinstance(value, (str, list, tuple)) and len(value) == 0)


def _scalar(option: str, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError(f"cli_args: {option} takes strings or numbers, got {type(value).__name__} {value!r}")
    return str(value)


def cli_args(settings) -> list:
    if not isinstance(settings, Mapping):
        raise AnsibleFilterError(f"cli_args expects a dictionary, got {type(settings).__name__}")
    args = []
    for key, value in settings.items():
        name = str(key).strip().lstrip("-").replace("_", "-")
        if not name:
            raise AnsibleFilterError(f"cli_args: empty option name {key!r}")
        if _is_unset(value):
            continue
        option = f"--{name}"
        args.append(option)
        if value is True:
            continue
        if isinstance(value, (list, tuple)):
            args.extend(_scalar(option, item) for item in value)
        else:
            args.append(_scalar(option, value))
    return args


class FilterModule:
    def filters(self):
        return {"cli_args": cli_args}
