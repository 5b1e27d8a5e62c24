"""role_vars: a role's variables checked strictly against its argument specs (where Ansible's own validation would
convert a string into a list), and names with the role's prefix that the role does not know, with the closest known
one. Read against the roles' real meta/argument_specs.yml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.llmops.inference.plugins.filter.role_var_problems import FilterModule
from ansible_collections.llmops.inference.plugins.module_utils.role_vars import (
    known_options,
    problems,
    type_errors,
    unknown_names,
)

REPO = Path(__file__).resolve().parents[4]
SERVICE_SPECS = yaml.safe_load((REPO / "roles" / "sglang_service" / "meta" / "argument_specs.yml").read_text())
PATCH_SPECS = yaml.safe_load((REPO / "roles" / "sglang_patch" / "meta" / "argument_specs.yml").read_text())
SERVICE = SERVICE_SPECS["argument_specs"]["main"]["options"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "sglang_service_gpus",
            "0,1",
            "sglang_service_gpus must be a list (one element per item, such as [0, 1]; not a comma-separated string); "
            'got "0,1" (a string)',
        ),
        ("sglang_service_gpus", 1, "sglang_service_gpus must be a list (one element per item, such as [0, 1]; "),
        ("sglang_service_port", "http", 'sglang_service_port must be an integer; got "http" (a string)'),
        ("sglang_service_port", [30000], "sglang_service_port must be an integer; got [30000] (a list)"),
        ("sglang_service_port", True, "sglang_service_port must be an integer; got true (a boolean)"),
        ("sglang_service_port", 1.5, "sglang_service_port must be an integer; got 1.5 (a number)"),
        ("sglang_service_port", None, "sglang_service_port must be an integer; got null"),
        ("sglang_service_environment", ["A=1"], "sglang_service_environment must be a mapping of names to values"),
        ("sglang_service_log_filter", "maybe", 'sglang_service_log_filter must be true or false; got "maybe"'),
        ("sglang_service_model_path", ["a"], 'sglang_service_model_path must be a string; got ["a"] (a list)'),
    ],
)
def test_a_value_of_the_wrong_type_is_named_with_what_its_variable_accepts(name, value, message):
    errors = type_errors(SERVICE, {name: value})
    assert len(errors) == 1 and errors[0].startswith(message), errors


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("sglang_service_gpus", [0, 1]),
        ("sglang_service_gpus", ["0", "GPU-3b1c"]),
        ("sglang_service_gpus", []),
        ("sglang_service_port", 30000),
        ("sglang_service_port", "30000"),  # -e sglang_service_port=30000 gives a string
        ("sglang_service_port", 70000),  # a range is the role's rule (tasks/variables.yml), not a type
        ("sglang_service_log_filter", "yes"),
        ("sglang_service_mem_fraction_static", None),  # its default is null
        ("sglang_service_mem_fraction_static", "0.8"),
        ("sglang_service_environment", {"A": "1"}),
        ("sglang_service_model_path", "Qwen/Qwen3-8B"),
    ],
)
def test_a_value_of_the_right_type_passes(name, value):
    assert type_errors(SERVICE, {name: value}) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["a", True], "x_names must be a list of strings or numbers; element 1 is true (a boolean)"),
        ([{"a": 1}], 'x_names must be a list of strings or numbers; element 0 is {"a": 1} (a mapping)'),
        (["a", None], "x_names must be a list of strings or numbers; element 1 is null (null)"),
    ],
)
def test_a_list_element_of_the_wrong_type_is_named_by_its_position(value, message):
    options = {"x_names": {"type": "list", "elements": "str", "default": []}}
    assert type_errors(options, {"x_names": value}) == [message]


def test_a_choice_outside_the_options_choices_is_named_with_them():
    options = {"x_state": {"type": "str", "choices": ["present", "absent"], "default": "present"}}
    assert type_errors(options, {"x_state": "gone"}) == ['x_state must be one of present, absent; got "gone"']


def test_known_names_are_every_entry_points_options():
    known = known_options(SERVICE_SPECS)
    assert {"sglang_service_drain_timeout", "sglang_service_speculative_point", "sglang_service_strict_vars"} <= known
    assert known_options(PATCH_SPECS) >= {"sglang_patch_files", "sglang_patch_strict_vars"}


def test_a_typo_is_named_with_the_closest_known_variable():
    known = known_options(SERVICE_SPECS)
    found = unknown_names(["sglang_service_drain_timout", "sglang_service_port", "other_var"], known, "sglang_service_")
    assert found == [{"name": "sglang_service_drain_timout", "closest": "sglang_service_drain_timeout"}]


def test_a_name_like_no_known_one_has_no_closest():
    assert unknown_names(["sglang_service_zzzzzzzzzzzzzzzzzzzz"], {"sglang_service_port"}, "sglang_service_") == [
        {"name": "sglang_service_zzzzzzzzzzzzzzzzzzzz", "closest": None}
    ]


def test_the_roles_own_facts_are_not_typos():
    result = problems(
        {}, SERVICE_SPECS, "sglang_service", names=["sglang_service_facts"], ignore=["sglang_service_facts"]
    )
    assert result == {"errors": [], "unknown": [], "unknown_msg": ""}


def test_the_filter_returns_errors_and_unknown_names_in_one_line():
    role_var_problems = FilterModule().filters()["role_var_problems"]
    result = role_var_problems(
        {"sglang_service_gpus": "0,1"}, SERVICE_SPECS, "sglang_service", names=["sglang_service_drain_timout"]
    )
    assert result["errors"] and result["errors"][0].startswith("sglang_service_gpus must be a list")
    assert result["unknown_msg"] == (
        "sglang_service does not know the variable(s) sglang_service_drain_timout "
        "(did you mean sglang_service_drain_timeout?)"
    )
