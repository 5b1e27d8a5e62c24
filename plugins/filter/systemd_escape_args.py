# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: systemd_escape_args
short_description: Quote an argument list for a systemd C(ExecStart=) line
version_added: 0.1.0
description:
  - Joins a list of arguments into one command line that systemd splits back into exactly the same
    arguments, so a value with spaces, quotes, backslashes, C(%) or C($) reaches the process intact.
  - C(%) is doubled to C(%%) (systemd specifiers) and C($) to C($$) (environment variable substitution).
  - An argument that is empty, is a lone C(;), or holds whitespace, a quote, a backslash or a control
    character is put in double quotes, with C(\\) for a backslash, C(\") for a double quote and C-style
    escapes such as C(\n) inside.
  - The first element is the executable. It must be non-empty and must not start with one of systemd's
    prefix characters (C(@), C(-), C(:), C(+), C(!)), which would change how systemd runs it.
author:
  - llmops.inference contributors
options:
  _input:
    description: The arguments, executable first. Strings and numbers are accepted.
    type: list
    elements: raw
    required: true
seealso:
  - name: systemd.service, Command lines
    description: How systemd splits and unescapes C(ExecStart=).
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html#Command%20lines
"""

EXAMPLES = r"""
- name: Render an ExecStart line
  ansible.builtin.debug:
    msg: "ExecStart={{ ['/usr/bin/python3', '-m', 'app', '--name', 'a b%c$d'] | llmops.inference.systemd_escape_args }}"
  # ExecStart=/usr/bin/python3 -m app --name "a b%%c$$d"
"""

RETURN = r"""
_value:
  description: The command line, arguments separated by single spaces.
  type: str
"""


EXECUTABLE_PREFIXES = ("@", "-", ":", "+", "!")
_QUOTE_TRIGGERS = frozenset(" \t\n\r\v\f\"'\\")
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\v": "\\v", "\f": "\\f"}


def _is_control(char: str) -> bool:
    return ord(char) < 0x20 or ord(char) == 0x7F


def escape_arg(value) -> str:
    """One argument as systemd must read it (specifiers and variables escaped, quoted when needed)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"expected a string or a number, got {type(value).__name__} {value!r}")
    text = str(value).replace("%", "%%").replace("$", "$$")
    if text and text != ";" and not any(char in _QUOTE_TRIGGERS or _is_control(char) for char in text):
        return text
    escaped = "".join(_C_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if _is_control(char) else char) for char in text)
    return f'"{escaped}"'


def systemd_escape_args(args) -> str:
    """The whole command line for ``ExecStart=``; raise AnsibleFilterError naming a bad element."""
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise AnsibleFilterError(f"systemd_escape_args expects a list of arguments, got {type(args).__name__}")
    if not args:
        raise AnsibleFilterError("systemd_escape_args needs at least the executable")
    executable = str(args[0])
    if not executable or executable.startswith(EXECUTABLE_PREFIXES):
        raise AnsibleFilterError(
            f"systemd_escape_args: the executable {executable!r} must be non-empty and must not start with "
            f"any of {' '.join(EXECUTABLE_PREFIXES)}"
        )
    escaped = []
    for position, arg in enumerate(args):
        try:
            escaped.append(escape_arg(arg))
        except TypeError as exc:
            raise AnsibleFilterError(f"systemd_escape_args: argument {position}: {exc}") from None
    return " ".join(escaped)


class FilterModule:
    def filters(self):
        return {"systemd_escape_args": systemd_escape_args}
