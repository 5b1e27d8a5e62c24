"""The module_utils the role copies to the host for the unit's gate and log filter (vars/main.yml,
__sglang_service_helper_files) are exactly those their entry points (templates/llmops_gate.py.j2,
templates/llmops_log_filter.py.j2) import, directly or through each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "sglang_service"
MODULE_UTILS = REPO / "plugins" / "module_utils"
PACKAGE = "ansible_collections.llmops.inference.plugins.module_utils"
ENTRY_POINTS = [ROLE / "templates" / "llmops_gate.py.j2", ROLE / "templates" / "llmops_log_filter.py.j2"]
JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}")


def imported_module_utils(tree: ast.AST) -> set:
    """Names of the collection's module_utils a module imports, anywhere in it (a function's import counts)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                names |= {alias.name for alias in node.names}
            elif node.module.startswith(PACKAGE + "."):
                names.add(node.module[len(PACKAGE) + 1 :].split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    names.add(alias.name[len(PACKAGE) + 1 :].split(".")[0])
    return names


def needed_by(entry_points: list) -> set:
    """The module_utils the entry points import, transitively within plugins/module_utils."""
    todo = set()
    for entry in entry_points:
        # A Jinja template whose expressions stand where Python values do: parsed with each as None.
        todo |= imported_module_utils(ast.parse(JINJA.sub("None", entry.read_text())))
    needed = set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo |= imported_module_utils(ast.parse((MODULE_UTILS / f"{name}.py").read_text())) - needed
    return needed


def copied() -> dict:
    """The module_utils the role copies: file name -> destination, from __sglang_service_helper_files."""
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    files = {}
    for entry in variables["__sglang_service_helper_files"]:
        if "src" in entry:
            assert entry["src"].startswith("{{ __sglang_service_module_utils_src }}/"), entry
            files[Path(entry["src"]).stem] = entry["dest"]
    return files


def test_the_entry_points_import_the_gate_and_the_log_filter():
    assert {"gpu_gate", "log_redact"} <= needed_by(ENTRY_POINTS)


def test_every_module_util_the_gate_imports_is_copied_and_no_other():
    needed, listed = needed_by(ENTRY_POINTS), set(copied())
    assert not needed - listed, (
        f"imported by the unit's gate or log filter but not copied to the host: {needed - listed}"
    )
    assert not listed - needed, f"copied to the host but imported by neither entry point: {listed - needed}"


def test_each_copy_lands_under_its_own_name():
    for name, dest in copied().items():
        assert dest == "{{ __sglang_service_module_utils_dir }}/" + f"{name}.py"


def test_an_import_added_without_the_copy_is_found(tmp_path):
    entry = tmp_path / "entry.py.j2"
    entry.write_text(f"from {PACKAGE}.gpu_gate import main\nfrom {PACKAGE} import sglang\n")
    assert {"gpu_gate", "sglang"} <= needed_by([entry])
    assert "sglang" not in copied()
