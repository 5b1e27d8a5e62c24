# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: systemd_env_value
short_description: Quote a value for a systemd C(EnvironmentFile=)
version_added: 0.1.0
description:
  - Returns the value in double quotes with each backslash, double quote, C($) and backtick escaped by
    a backslash, so systemd's environment file parser reads back exactly the original string, also with spaces,
    quotes, C(#) or C($) in it.
  - A value with a newline, carriage return or NUL is refused; such a value cannot be passed through an
    environment file line by line.
author:
  - llmops.inference contributors
options:
  _input:
    description: The value. Strings and numbers are accepted.
    type: raw
    required: true
seealso:
  - name: systemd.exec, EnvironmentFile
    description: The format systemd reads environment files in.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.exec.html#EnvironmentFile=
"""

EXAMPLES = r"""
- name: Write one environment file line
  ansible.builtin.copy:
    dest: /etc/llmops/sglang.env
    mode: "0600"
    content: "HF_TOKEN={{ hf_token | llmops.inference.systemd_env_value }}\n"
"""

RETURN = r"""
_value:
  description: The quoted value, including the surrounding double quotes.
  type: str
"""


_ESCAPED = frozenset('\\"$`')
_REFUSED = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL character"}


def systemd_env_value(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError(
            f"systemd_env_value expects a string or a number, got {type(value).__name__} {value!r}"
        )
    text = str(value)
    for char, what in _REFUSED.items():
        if char in text:
            raise AnsibleFilterError(f"systemd_env_value: an environment file value cannot hold {what}")
    return '"' + "".join("\\" + char if char in _ESCAPED else char for char in text) + '"'


class FilterModule:
    def filters(self):
        return {"systemd_env_value": systemd_env_value}
