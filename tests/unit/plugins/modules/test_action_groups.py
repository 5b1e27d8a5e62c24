"""meta/runtime.yml's action group sglang_server lists exactly the modules that take the server's shared options
(url, api_key, validate_certs: module_utils/sglang.py server_argument_spec), so that one module_defaults entry,
group/llmops.inference.sglang_server, reaches each of them."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[4]
MODULES = REPO / "plugins" / "modules"


def test_the_sglang_server_group_is_the_modules_with_the_server_options():
    groups = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["action_groups"]
    sharing = {path.stem for path in MODULES.glob("*.py") if "server_argument_spec()" in path.read_text()}
    assert sharing, "no module takes server_argument_spec()"
    assert set(groups["sglang_server"]) == sharing


def test_every_grouped_module_exists():
    groups = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["action_groups"]
    for members in groups.values():
        for name in members:
            assert (MODULES / f"{name}.py").is_file(), name
