"""sglang_restart's options: the argument spec is the one place of each option and default.

DOCUMENTATION (with its doc fragment) documents exactly the spec; ChainOptions and the parser restate no default.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml
from restart_world import PARAMS, validated

from ansible_collections.llmops.inference.plugins.doc_fragments.sglang_server import ModuleDocFragment
from ansible_collections.llmops.inference.plugins.module_utils.restart import options as options_module
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    ARGUMENT_SPEC,
    ChainOptions,
    GatewayOptions,
    KnownGoodOptions,
    LockOptions,
    parse_chain_options,
)
from ansible_collections.llmops.inference.plugins.modules import sglang_restart

PACKAGE = Path(options_module.__file__).parent
MODULE = Path(sglang_restart.__file__)


def documented_options() -> dict:
    options = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    options.update(yaml.safe_load(sglang_restart.DOCUMENTATION)["options"])
    return options


def as_documented(spec: dict) -> dict:
    """An argument spec in DOCUMENTATION's terms (``type`` str by default, ``suboptions`` for ``options``)."""
    shown = {}
    for name, option in spec.items():
        entry = {
            "type": option.get("type", "str"),
            "default": option.get("default"),
            "required": option.get("required", False),
            "choices": option.get("choices"),
            "elements": option.get("elements"),
            "aliases": option.get("aliases"),
        }
        if "options" in option:
            entry["suboptions"] = as_documented(option["options"])
        shown[name] = entry
    return shown


def from_documentation(options: dict) -> dict:
    return as_documented(
        {
            name: {
                **{key: value for key, value in doc.items() if key not in ("description", "suboptions")},
                **({"options": doc["suboptions"]} if "suboptions" in doc else {}),
            }
            for name, doc in options.items()
        }
    )


def test_the_documentation_documents_exactly_the_argument_spec():
    assert from_documentation(documented_options()) == as_documented(ARGUMENT_SPEC)


def test_the_module_passes_the_spec_of_options_py():
    assert sglang_restart.ARGUMENT_SPEC is ARGUMENT_SPEC


@pytest.mark.parametrize("options_class", [ChainOptions, LockOptions, KnownGoodOptions, GatewayOptions])
def test_the_chains_options_have_no_defaults_of_their_own(options_class):
    restated = [
        field.name
        for field in dataclasses.fields(options_class)
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    ]
    assert restated == []


def test_the_parser_reads_every_option_without_a_fallback():
    """``params.get(name, default)`` would restate a default the spec already applied."""
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and len(node.args) == 2:
                receiver = ast.unparse(node.func.value)
                assert receiver not in ("params", "probe", "reap", "lock", "known_good"), (path.name, ast.unparse(node))


def option_names(spec: dict) -> set:
    names = set()
    for name, option in spec.items():
        names.add(name)
        names |= option_names(option.get("options") or {})
    return names


def restated_defaults(source: str, names: set) -> list:
    """Where ``source`` gives one of ``names`` a default of its own: ``name: type = value``, ``x.get("name", value)``,
    or a number as ``name=5`` or ``{"name": 5}`` (0, False and "" start a count or a flag; they are no defaults)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        numbers_only = True
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) in names:
            pairs, numbers_only = [(node.target.id, node.value)], False
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and len(node.args) == 2:
            pairs, numbers_only = [(getattr(node.args[0], "value", None), node.args[1])], False
        elif isinstance(node, ast.keyword):
            pairs = [(node.arg, node.value)]
        elif isinstance(node, ast.Dict):
            pairs = [(getattr(key, "value", None), value) for key, value in zip(node.keys, node.values)]
        else:
            continue
        for name, value in pairs:
            literal = value.value if isinstance(value, ast.Constant) else None
            number = isinstance(literal, (int, float)) and not isinstance(literal, bool) and literal != 0
            if name in names and literal and (number or not numbers_only):
                found.append(f"{name}={literal!r}")
    return found


@pytest.mark.parametrize("path", [*sorted(PACKAGE.glob("*.py")), MODULE], ids=lambda path: path.name)
def test_no_file_of_the_chain_restates_a_default_of_the_spec(path):
    assert restated_defaults(path.read_text(), option_names(ARGUMENT_SPEC)) == []


def test_validated_parameters_reach_the_chain_unchanged():
    options = parse_chain_options(validated({"unit": "sglang-t"}))
    assert (options.ready_timeout, options.stability_window, options.soak) == (1260, 5, 3)
    assert options.reap == {"grace": 10, "timeout": 60, "threshold_mib": 1024}
    lock = options.lock
    assert (lock.timeout, lock.renew_period, lock.renew_margin, lock.retake) == (600, 30, 60, False)
    assert options.known_good.patch_state_id == "unknown"
    assert (options.gateway.min_healthy, options.gateway.unreachable, options.journal_lines) == (1, "fail", 30)
    assert parse_chain_options(validated(PARAMS)).probe["expected_model"] == "Qwen/Qwen3-8B"
