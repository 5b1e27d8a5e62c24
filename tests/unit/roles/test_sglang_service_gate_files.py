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


def _module_file(dotted: str, root: Path) -> str | None:
    """The file under plugins/module_utils of a dotted module name below it ("gpu" -> "gpu.py"), or None."""
    for candidate in (dotted.replace(".", "/") + ".py", dotted.replace(".", "/") + "/__init__.py"):
        if (root / candidate).is_file():
            return candidate
    return None


def imported_module_utils(tree: ast.AST, root: Path) -> set:
    """The files (relative to plugins/module_utils) of the collection's module_utils a module imports, anywhere in
    it (a function's import counts); a package's __init__.py counts with each module imported from it."""
    dotted = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                dotted |= {alias.name for alias in node.names}
            elif node.module.startswith(PACKAGE + "."):
                module = node.module[len(PACKAGE) + 1 :]
                dotted.add(module)
                # ``from PACKAGE.pkg import mod`` imports the module pkg/mod.py where there is one.
                dotted |= {
                    f"{module}.{alias.name}" for alias in node.names if _module_file(f"{module}.{alias.name}", root)
                }
        elif isinstance(node, ast.Import):
            dotted |= {alias.name[len(PACKAGE) + 1 :] for alias in node.names if alias.name.startswith(PACKAGE + ".")}
    files = set()
    for name in dotted:
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            found = _module_file(".".join(parts[:depth]), root)
            assert found is not None or depth < len(parts), f"no module_utils file for {name}"
            if found is not None:
                files.add(found)
    return files


def needed_by(entry_points: list, root: Path = MODULE_UTILS) -> set:
    """The module_utils files the entry points import, transitively within plugins/module_utils."""
    todo = set()
    for entry in entry_points:
        # A Jinja template whose expressions stand where Python values do: parsed with each as None.
        todo |= imported_module_utils(ast.parse(JINJA.sub("None", entry.read_text())), root)
    needed = set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo |= imported_module_utils(ast.parse((root / name).read_text()), root) - needed
    return needed


def copied() -> dict:
    """The module_utils the role copies: file (relative to plugins/module_utils) -> destination, from
    __sglang_service_helper_files."""
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    files = {}
    prefix = "{{ __sglang_service_module_utils_src }}/"
    for entry in variables["__sglang_service_helper_files"]:
        if "src" in entry:
            assert entry["src"].startswith(prefix), entry
            files[entry["src"][len(prefix) :]] = entry["dest"]
    return files


def test_the_entry_points_import_the_gate_and_the_log_filter():
    assert {"gpu_gate.py", "log_redact.py"} <= needed_by(ENTRY_POINTS)


def test_every_module_util_the_gate_imports_is_copied_and_no_other():
    needed, listed = needed_by(ENTRY_POINTS), set(copied())
    assert not needed - listed, (
        f"imported by the unit's gate or log filter but not copied to the host: {needed - listed}"
    )
    assert not listed - needed, f"copied to the host but imported by neither entry point: {listed - needed}"


def test_each_copy_lands_under_its_own_name():
    for name, dest in copied().items():
        assert dest == "{{ __sglang_service_module_utils_dir }}/" + name


def test_an_import_added_without_the_copy_is_found(tmp_path):
    entry = tmp_path / "entry.py.j2"
    entry.write_text(f"from {PACKAGE}.gpu_gate import main\nfrom {PACKAGE} import sglang\n")
    assert {"gpu_gate.py", "gpu_query.py", "gpu_nvml.py", "gpu_smi.py", "sglang.py"} <= needed_by([entry])
    assert "sglang.py" not in copied()


def test_a_module_of_a_package_counts_with_the_package(tmp_path):
    package = tmp_path / "package"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text("")
    entry = tmp_path / "entry.py.j2"
    entry.write_text(f"from {PACKAGE}.sub import mod\n")
    assert needed_by([entry], package) == {"sub/__init__.py", "sub/mod.py"}
