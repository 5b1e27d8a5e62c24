"""Playbooks use roles and modules and restate none of a role's defaults: a role's value reaches a playbook through
the role's `tasks_from: facts` entry point (sglang_service_facts, sglang_patch_facts), never as a `| default(...)`
copy of a role variable, a literal of the role's paths, or a read of the role's files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
PLAYBOOKS = REPO / "playbooks"
ROLES = sorted(path for path in (REPO / "roles").iterdir() if (path / "defaults" / "main.yml").is_file())

# A role variable given to a module as `| default(omit, true)`: an API key, which the roles keep out of their facts
# (a set_fact result is printed at -v) and which a play that did not import the role may not have. Omitting it
# passes no key, the role's own default; no value of the role is copied.
OMIT_ALLOWED = re.compile(r"^sglang_(service|gateway)_(gateway_)?api_key$")

DEFAULT_CALL = re.compile(r"\|\s*default\((?=(?P<arg>[^)|]*))")  # zero-width: a nested one is found too
NAME_BEFORE = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*(?:\[[^\]]+\])?(?:\.[A-Za-z0-9_]+)*)\s*$")
ROLE_VARIABLE = re.compile(r"^(hostvars\[[^\]]+\]\.)?(?P<var>sglang_(service|patch|gateway)_[A-Za-z0-9_]+)")
ROLE_FILE_READ = re.compile(r"roles/sglang_|role_path|fileglob[^\n]*roles")
FILE_NAME = re.compile(r"\b[A-Za-z0-9][A-Za-z0-9_-]*\.(?:conf|lock|env|sha256)\b")


def role_variables() -> set:
    """Every variable a role takes: its defaults and its argument specs' options, of every entry point."""
    names = set()
    for role in ROLES:
        names |= set(yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {})
        specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for entry in specs.values():
            names |= set(entry.get("options") or {})
    return names


def role_literals() -> set:
    """The roles' own paths and file names, as their defaults and vars spell them out."""
    literals = set()
    for role in ROLES:
        for source in ("defaults", "vars"):
            path = role / source / "main.yml"
            if not path.is_file():
                continue
            for value in (yaml.safe_load(path.read_text()) or {}).values():
                if not isinstance(value, str):
                    continue
                if value.startswith("/") and value.count("/") > 1 and "{{" not in value:  # a path, not an endpoint
                    literals.add(value)
                literals |= set(FILE_NAME.findall(value))
    return literals


def playbook_files() -> list:
    return sorted(path for path in PLAYBOOKS.rglob("*") if path.suffix in (".yml", ".yaml"))


def restated_defaults(text: str, variables: set) -> list:
    """`| default(...)` applied to a role variable, except an omitted API key."""
    found = []
    for match in DEFAULT_CALL.finditer(text):  # each one, nested ones too
        before = NAME_BEFORE.search(text[: match.start()])
        role_var = before and ROLE_VARIABLE.match(before.group("name"))
        if not role_var or role_var.group("var") not in variables:
            continue
        if OMIT_ALLOWED.match(role_var.group("var")) and match.group("arg").replace(" ", "") in ("omit", "omit,true"):
            continue
        found.append(f"{before.group('name')} | default({match.group('arg')}")
    return found


def restated_literals(text: str, literals: set) -> list:
    return sorted(
        literal for literal in literals if re.search(r"(?<![\w.-])" + re.escape(literal) + r"(?![\w-])", text)
    )


def test_the_role_variables_and_literals_are_found():
    variables = role_variables()
    assert {
        "sglang_service_name",
        "sglang_service_tp_size",
        "sglang_patch_set_name",
        "sglang_gateway_name",
    } <= variables
    assert {"/etc/systemd/system", "50-speculative.conf"} <= role_literals()


@pytest.mark.parametrize("path", playbook_files(), ids=lambda path: str(path.relative_to(PLAYBOOKS)))
def test_no_playbook_restates_a_role_variable_default(path):
    found = restated_defaults(path.read_text(), role_variables())
    assert not found, (
        f"{path.relative_to(REPO)} gives role variables a default of its own: {found}; read the value from the "
        "role's facts entry point (tasks_from: facts, e.g. sglang_service_facts), extending it if needed"
    )


@pytest.mark.parametrize("path", playbook_files(), ids=lambda path: str(path.relative_to(PLAYBOOKS)))
def test_no_playbook_restates_a_role_path(path):
    found = restated_literals(path.read_text(), role_literals())
    assert not found, (
        f"{path.relative_to(REPO)} spells out the roles' own paths or file names {found}; "
        "take them from the role's facts entry point"
    )


@pytest.mark.parametrize("path", playbook_files(), ids=lambda path: str(path.relative_to(PLAYBOOKS)))
def test_no_playbook_reads_a_roles_files(path):
    found = ROLE_FILE_READ.findall(path.read_text())
    assert not found, (
        f"{path.relative_to(REPO)} reads a role's files ({found}); use the role or its facts entry point (the "
        "deploy's code digest reads the files each role names in its facts, code_files)"
    )


@pytest.mark.parametrize(
    "text",
    [
        "x: \"{{ sglang_service_name | default('sglang') }}.service\"",
        'x: "{{ hostvars[item].sglang_service_tp_size | default(1) | string }}"',
        'x: "{{ sglang_service_timeout_start_sec | default(1200) | int + 60 }}"',
        "x: \"{{ sglang_patch_set_name | default('') }}\"",
        "x: \"{{ sweep_algorithm | default(hostvars[item].sglang_service_speculative_algorithm | default('')) }}\"",
        "x: \"{{ sglang_service_api_key | default('none') }}\"",
    ],
)
def test_a_restated_default_is_found(text):
    assert restated_defaults(text, role_variables())


@pytest.mark.parametrize(
    "text",
    [
        'x: "{{ sglang_service_facts.tp_size }}"',
        'x: "{{ sglang_service_api_key | default(omit, true) }}"',
        "x: \"{{ sweep_hosts | default('sglang') }}\"",
        'x: "{{ sglang_service_gate.healthy | default(false) }}"',
    ],
)
def test_what_is_not_a_restated_default(text):
    assert not restated_defaults(text, role_variables())


def test_a_restated_role_path_is_found():
    text = 'path: "{{ sglang_service_unit_dir }}/{{ name }}.service.d/50-speculative.conf"'
    assert restated_literals(text, role_literals()) == ["50-speculative.conf"]
