# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checks of a role's variables against its ``meta/argument_specs.yml``, before anything on a host changes.

Private to the llmops.inference collection; not a public API. Standard library only.

Ansible's own argument spec validation converts what it can: a string ``"0,1"`` passes as a list (split on commas),
an integer ``1`` as the list ``['1']``, and the variable itself keeps its original value, which the role's tasks then
use. ``type_errors`` is strict instead: each message names the variable, what it accepts and what it got.
``unknown_names`` finds variables with the role's prefix that the role does not know (almost always a typo) and the
closest known name.
"""

from __future__ import annotations

import difflib
import json
import re

INTEGER = re.compile(r"^\s*[-+]?[0-9]+\s*$")
NUMBER = re.compile(r"^\s*[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$")
# The strings Ansible takes as booleans (ansible.module_utils.parsing.convert_bool).
BOOLEAN_STRINGS = ("yes", "on", "1", "true", "y", "t", "no", "off", "0", "false", "n", "f")
ACCEPTS = {
    "list": "a list (one element per item, such as [0, 1]; not a comma-separated string)",
    "dict": "a mapping of names to values",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "path": "a path (a string)",
    "raw": "any value",
}
ELEMENTS = {"str": "strings or numbers", "int": "integers", "dict": "mappings", "path": "paths"}


KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (dict, "a mapping"),
         ((list, tuple), "a list"))  # fmt: skip


def describe(value) -> str:
    """What kind of value ``value`` is, as a user reads it."""
    if value is None:
        return "null"
    for types, kind in KINDS:
        if isinstance(value, types):
            return kind
    return type(value).__name__


def shown(value) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _is_int(value) -> bool:
    if isinstance(value, str):
        return bool(INTEGER.match(value))
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_float(value) -> bool:
    return isinstance(value, (int, float)) or (isinstance(value, str) and bool(NUMBER.match(value)))


def _is_bool(value) -> bool:
    return isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in BOOLEAN_STRINGS)


# Each type's check; str and path take numbers too (Ansible turns them into strings). A boolean is only a bool.
CHECKS = {
    "raw": lambda value: True,
    "list": lambda value: isinstance(value, (list, tuple)),
    "dict": lambda value: isinstance(value, dict),
    "bool": _is_bool,
    "int": lambda value: not isinstance(value, bool) and _is_int(value),
    "float": lambda value: not isinstance(value, bool) and _is_float(value),
}


def _is_type(value, kind: str) -> bool:
    check = CHECKS.get(kind)
    if check is not None:
        return check(value)
    return not isinstance(value, bool) and isinstance(value, (str, int, float))


def _element_error(name: str, value: list, kind: str) -> str | None:
    for index, element in enumerate(value):
        if element is None or not _is_type(element, kind):
            return (
                f"{name} must be a list of {ELEMENTS.get(kind, kind)}; element {index} is {shown(element)} "
                f"({describe(element)})"
            )
    return None


def type_errors(options: dict, values: dict) -> list:
    """One message per variable of ``values`` whose value does not have the type (or one of the choices) that its
    option in ``options`` (an argument spec's options) states. A variable without an option is not checked here
    (see ``unknown_names``); null passes where the option's default is null."""
    errors = []
    for name in sorted(values):
        spec = options.get(name)
        if not isinstance(spec, dict):
            continue
        value = values[name]
        kind = spec.get("type", "str")
        if value is None:
            if spec.get("default") is not None or spec.get("required"):
                errors.append(f"{name} must be {ACCEPTS.get(kind, kind)}; got null")
            continue
        if not _is_type(value, kind):
            errors.append(f"{name} must be {ACCEPTS.get(kind, kind)}; got {shown(value)} ({describe(value)})")
            continue
        if kind == "list" and spec.get("elements"):
            error = _element_error(name, list(value), spec["elements"])
            if error:
                errors.append(error)
                continue
        choices = spec.get("choices")
        if choices and value not in choices and str(value) not in [str(choice) for choice in choices]:
            errors.append(f"{name} must be one of {', '.join(str(choice) for choice in choices)}; got {shown(value)}")
    return errors


def known_options(argument_specs: dict) -> set:
    """Every option name of every entry point of a role's ``argument_specs`` (the file's top-level mapping or its
    ``argument_specs`` key)."""
    specs = argument_specs.get("argument_specs", argument_specs) if isinstance(argument_specs, dict) else {}
    names = set()
    for entry in (specs or {}).values():
        names.update(((entry or {}).get("options") or {}).keys())
    return names


def unknown_names(names, known, prefix: str) -> list:
    """The names with ``prefix`` that are not ``known``, each as {name, closest} (closest: the most alike known name,
    or None when none is alike)."""
    known = sorted(set(known))
    unknown = []
    for name in sorted(set(names)):
        if not name.startswith(prefix) or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        unknown.append({"name": name, "closest": close[0] if close else None})
    return unknown


def unknown_message(unknown: list, role: str) -> str:
    """One line naming each unknown variable and the known one it most likely means."""
    parts = []
    for entry in unknown:
        hint = f" (did you mean {entry['closest']}?)" if entry["closest"] else ""
        parts.append(f"{entry['name']}{hint}")
    return f"{role} does not know the variable(s) {'; '.join(parts)}"


def problems(values: dict, argument_specs: dict, role: str, names=(), ignore=()) -> dict:
    """{errors, unknown, unknown_msg} for role ``role``'s variables (prefix ``role_``): ``values`` maps the known
    variables to their values, ``names`` every variable name defined with the prefix, ``ignore`` the names the role
    itself sets (its facts)."""
    prefix = f"{role}_"
    specs = argument_specs.get("argument_specs", argument_specs) if isinstance(argument_specs, dict) else {}
    main = ((specs or {}).get("main") or {}).get("options") or {}
    known = known_options(argument_specs) | set(ignore)
    unknown = unknown_names(names, known, prefix)
    return {
        "errors": type_errors(main, values),
        "unknown": unknown,
        "unknown_msg": unknown_message(unknown, role) if unknown else "",
    }
