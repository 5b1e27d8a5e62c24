"""Every role's defaults/main.yml and meta/argument_specs.yml agree: the same variables, the same defaults, values
of the declared types."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = sorted(path for path in (REPO / "roles").iterdir() if (path / "meta" / "argument_specs.yml").is_file())
TYPES = {"str": str, "path": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict}


def load(role: Path) -> tuple:
    defaults_path = role / "defaults" / "main.yml"
    defaults = (yaml.safe_load(defaults_path.read_text()) or {}) if defaults_path.is_file() else {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = {}
    for entry in specs.values():
        for name, spec in (entry.get("options") or {}).items():
            options.setdefault(name, spec)
    return defaults, options


def templated(value) -> bool:
    return isinstance(value, str) and "{{" in value


def test_every_role_is_checked():
    assert {role.name for role in ROLES} >= {"sglang_service", "sglang_patch", "sglang_gateway"}


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_every_default_is_a_documented_option(role):
    defaults, options = load(role)
    assert sorted(set(defaults) - set(options)) == [], "in defaults/main.yml but in no entry point's argument spec"


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_every_option_with_a_default_is_in_defaults(role):
    defaults, options = load(role)
    documented = {name for name, spec in options.items() if "default" in spec}
    assert sorted(documented - set(defaults)) == [], "documented default missing from defaults/main.yml"


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_defaults_agree_with_the_argument_spec(role):
    defaults, options = load(role)
    wrong = {}
    for name, value in defaults.items():
        spec = options.get(name, {})
        if "default" in spec and not templated(value) and spec["default"] != value:
            wrong[name] = (value, spec["default"])
    assert wrong == {}, "defaults/main.yml value vs argument_specs default"


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_defaults_have_the_declared_type(role):
    defaults, options = load(role)
    wrong = {}
    for name, value in defaults.items():
        kind = (options.get(name) or {}).get("type", "str")
        if value is None or templated(value) or kind not in TYPES:
            continue
        if not isinstance(value, TYPES[kind]) or (kind in ("int", "float") and isinstance(value, bool)):
            wrong[name] = (kind, value)
    assert wrong == {}, "defaults/main.yml values that are not of their argument spec's type"
