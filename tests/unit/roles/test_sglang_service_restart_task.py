"""sglang_service's tasks/restart.yml: one sglang_restart call whose inputs are all written in the task, each an
option of the module's argument spec, and the README's table of what each role variable feeds stays true."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ansible_collections.llmops.inference.plugins.module_utils.restart.options import ARGUMENT_SPEC

ROLE = Path(__file__).resolve().parents[3] / "roles" / "sglang_service"
TASKS = yaml.safe_load((ROLE / "tasks" / "restart.yml").read_text())
CHAIN = next(task for task in TASKS if "llmops.inference.sglang_restart" in task)
ARGS = CHAIN["llmops.inference.sglang_restart"]


def test_every_input_is_an_option_of_the_module():
    assert sorted(set(ARGS) - set(ARGUMENT_SPEC)) == []
    for name, value in ARGS.items():
        if isinstance(value, dict):
            assert sorted(set(value) - set(ARGUMENT_SPEC[name]["options"])) == [], name


def test_the_dict_options_are_written_in_the_task_not_taken_from_role_vars():
    for name in ("reap", "probe", "lock", "known_good"):
        assert isinstance(ARGS[name], dict), f"{name} is built elsewhere: {ARGS[name]!r}"


def test_the_lock_token_is_an_explicit_input():
    text = (ROLE / "tasks" / "restart.yml").read_text()
    assert "__sglang_service_lock." not in text, "restart.yml reads the registered lock of tasks/main.yml itself"
    assert "__sglang_service_restart_lock_token" in ARGS["lock"]["token"]
    handlers = (ROLE / "handlers" / "main.yml").read_text()
    assert "__sglang_service_restart_lock_token:" in handlers


def test_the_readmes_table_names_real_variables_and_options():
    readme = (ROLE / "README.md").read_text()
    section = readme.split("| role variable | `sglang_restart` option |", 1)[1].split("\n\n", 1)[0]
    table = re.findall(r"^\| (.*?) \| `([\w.]+)`", section, re.M)
    assert len(table) > 20
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for variables, option in table:
        top, sub = option.partition(".")[::2]
        assert top in ARGUMENT_SPEC, option
        assert not sub or sub in ARGUMENT_SPEC[top]["options"], option
        for variable in re.findall(r"`(sglang_service_\w+)`", variables):
            assert variable in defaults, f"{variable} (README table) is not a role variable"
    mapped = {option.partition(".")[0] for _variables, option in table}
    assert sorted(set(ARGS) - mapped) == [], "an input of restart.yml is missing from the README's table"


def passed_straight(args: dict, spec: dict, prefix: str = ""):
    """(option, spec entry, role variable) for each input that is one role variable as it is."""
    for name, value in args.items():
        entry = spec[name]
        if isinstance(value, dict):
            yield from passed_straight(value, entry["options"], f"{prefix}{name}.")
            continue
        found = re.fullmatch(r"\{\{ (sglang_service_\w+) \}\}", str(value).strip())
        if found:
            yield prefix + name, entry, found.group(1)


# Where the role means to differ from the module: the role's unit has the ExecStartPost ready gate (so "active"
# means ready), the module's default fits any unit.
ROLE_DIFFERS = {"ready_when_active": ("sglang_service_ready_gate", True, False)}


def test_a_role_default_that_feeds_an_option_agrees_with_the_modules_default():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    compared, differ = [], {}
    for option, entry, variable in passed_straight(ARGS, ARGUMENT_SPEC):
        role_default = defaults[variable]
        if "default" not in entry or (isinstance(role_default, str) and "{{" in role_default):
            continue
        compared.append(option)
        if role_default != entry["default"]:
            differ[option] = (variable, role_default, entry["default"])
    assert len(compared) > 10, compared
    assert differ == ROLE_DIFFERS, differ


def test_a_node_group_member_restarts_its_group_after_the_chain_task_it_skips():
    """A skipped task still registers its skip: were the chain's task (register: sglang_service_gate) after the
    group restart, a member's sglang_service_gate would read "skipped" instead of its group's result."""
    names = [next(iter(task)) if "name" not in task else task["name"] for task in TASKS]
    group = next(i for i, task in enumerate(TASKS) if task.get("ansible.builtin.include_tasks") == "group_restart.yml")
    assert group == len(TASKS) - 1, names
    assert TASKS.index(CHAIN) < group
