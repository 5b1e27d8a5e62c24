# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: unit_value
short_description: Check a value for a systemd unit, drop-in or environment file, and escape it for its field
version_added: 0.2.0
description:
  - The one check every value rendered into a unit, drop-in, environment or config file passes through, called
    inline by the templates with the name of the variable the value comes from.
  - Refuses line breaks and every other control character (Unicode categories Cc, Zl, Zp), anywhere in the value,
    also inside lists and dictionaries, with an error that names the variable (and the item) and the position. A
    line break would end the line, and what follows it would be read as a directive of its own, such as an extra
    C(ExecStartPre=). The value itself is never shown, so secrets can pass through it.
  - Then escapes the value for its field (O(kind)). C(raw) returns it unchanged, for a filter that quotes it next
    (P(llmops.inference.systemd_escape_args#filter) for C(Exec) lines,
    P(llmops.inference.systemd_env_value#filter) for environment files, C(to_json) for YAML). C(text) doubles
    C(%), which systemd expands as a specifier in settings such as C(Description=). C(path) also requires an
    absolute path. C(environment) takes a dictionary and renders it for C(Environment=), each assignment in double
    quotes with C(\\) and C(") escaped and C(%) doubled (systemd does not expand C($) there).
author:
  - llmops.inference contributors
options:
  _input:
    description: The value; strings, numbers, booleans and null, or lists and dictionaries of them.
    type: raw
    required: true
  name:
    description:
      - The variable the value comes from, named in errors (with C(.KEY) or C([INDEX]) for an item). For a dictionary,
        C({}) in it is replaced by each key instead; with O(kind=environment) the values are named O(name) itself.
    type: str
    required: true
  kind:
    description: How the value is escaped for its field.
    type: str
    choices: [raw, text, path, environment]
    default: raw
seealso:
  - name: systemd.unit, Specifiers
    description: The C(%) specifiers systemd expands in unit files.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html#Specifiers
  - name: systemd.exec, Environment
    description: How C(Environment=) is quoted.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.exec.html#Environment=
"""

EXAMPLES = r"""
- name: A unit line from a free-text variable
  ansible.builtin.copy:
    dest: /etc/systemd/system/app.service
    mode: "0644"
    content: |
      [Unit]
      Description={{ app_description | llmops.inference.unit_value('app_description', 'text') }}
  # "100% up" becomes "100%% up"; "x\nExecStartPre=/bin/evil" fails: app_description: a line break (\n)
  # at character 2 is not allowed ...

- name: Check every value of a settings dictionary, naming each variable
  ansible.builtin.debug:
    msg: "{{ {'model_path': '/models/x', 'port': 30000} | llmops.inference.unit_value('app_{}') }}"
"""

RETURN = r"""
_value:
  description: The value, escaped for its field (unchanged for C(raw)).
  type: raw
"""

KINDS = ("raw", "text", "path", "environment")
_NAMED = {"\n": "a line break (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab (\\t)", "\0": "a NUL (\\0)"}


def _control(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Zl", "Zp")


def _check_text(name: str, text: str) -> None:
    for position, char in enumerate(text, start=1):
        if _control(char):
            what = _NAMED.get(char) or f"the control character U+{ord(char):04X}"
            raise AnsibleFilterError(
                f"{name}: {what} at character {position} is not allowed in a unit, drop-in or environment file "
                "(line breaks and control characters would start a directive of their own); remove it"
            )


def check_value(name: str, value) -> None:
    """Refuse a control character anywhere in ``value``; the error names ``name`` and the item."""
    if isinstance(value, str):
        _check_text(name, value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_text(f"{name} (a key)", str(key))
            check_value(name.format(key) if "{}" in name else f"{name}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_value(f"{name}[{index}]", item)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise AnsibleFilterError(f"{name}: expected text, a number or a list, got {type(value).__name__}")


def _specifiers(text: str) -> str:
    return text.replace("%", "%%")


def _environment(name: str, value) -> str:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{name}: kind 'environment' takes a dictionary of variables, got {value!r}")
    assignments = []
    for key, item in value.items():
        # The variables are the role's own; a bad value is named after the variable it came from.
        check_value(f"{name} (a key)", str(key))
        check_value(name.format(key) if "{}" in name else name, item)
        text = f"{key}={'' if item is None else item}"
        assignments.append('"' + _specifiers(text.replace("\\", "\\\\").replace('"', '\\"')) + '"')
    return " ".join(assignments)


def unit_value(value, name, kind="raw"):
    if kind not in KINDS:
        raise AnsibleFilterError(f"unit_value: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not name:
        raise AnsibleFilterError("unit_value: name the variable the value comes from")
    if kind == "environment":
        return _environment(name, value)
    check_value(name, value)
    if kind == "raw":
        return value
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise AnsibleFilterError(f"{name}: expected text for kind {kind!r}, got {type(value).__name__}")
    text = str(value)
    if kind == "path" and not os.path.isabs(text):
        raise AnsibleFilterError(f"{name}: must be an absolute path, got {text!r}")
    return _specifiers(text)


class FilterModule:
    def filters(self):
        return {"unit_value": unit_value}
