"""meta/runtime.yml's action group sglang_server lists exactly the modules that take the server's shared options
(url, api_key, validate_certs: module_utils/sglang.py server_argument_spec), so that one module_defaults entry,
group/llmops.inference.sglang_server, reaches each of them."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from ansible_collections.llmops.inference.plugins.module_utils.sglang import server_argument_spec

REPO = Path(__file__).resolve().parents[4]
MODULES = REPO / "plugins" / "modules"


def argument_spec(path: Path) -> dict:
    """The module's ARGUMENT_SPEC (written in the module, or imported from its module_utils), or {}."""
    module = importlib.import_module(f"ansible_collections.llmops.inference.plugins.modules.{path.stem}")
    return getattr(module, "ARGUMENT_SPEC", {})


def test_the_sglang_server_group_is_the_modules_with_the_server_options():
    groups = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["action_groups"]
    sharing = {path.stem for path in MODULES.glob("*.py") if set(server_argument_spec()) <= set(argument_spec(path))}
    assert sharing, "no module takes server_argument_spec()"
    assert set(groups["sglang_server"]) == sharing


def test_every_grouped_module_exists():
    groups = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["action_groups"]
    for members in groups.values():
        for name in members:
            assert (MODULES / f"{name}.py").is_file(), name
