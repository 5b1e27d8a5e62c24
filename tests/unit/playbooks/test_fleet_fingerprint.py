"""The deploy's fingerprint (playbooks/vars/sglang_fleet.yml) covers every input that renders or runs something on a
host, so that a change to any of them marks every host for redeploy. The expectations are read off the roles
themselves: the filters their templates and variables use, their templates, the modules their tasks call and the
module_utils those import, and the files the unit's gate copies to the host."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = [REPO / "roles" / "sglang_service", REPO / "roles" / "sglang_patch"]
FLEET_VARS = REPO / "playbooks" / "vars" / "sglang_fleet.yml"
PREFLIGHT = REPO / "playbooks" / "tasks" / "preflight_host.yml"
COLLECTION = "llmops.inference."
# Files of a role or of plugins/ that render nothing on a host.
NOT_RENDERED = re.compile(r"(^|/)(__pycache__|meta|doc_fragments)/|(^|/)README\.md$|\.pyc$")

# Renders with Ansible's own Templar (the builtin lookups and filters the playbooks use, found through Ansible's
# collection finder), one request a line.
RENDERER = """
import json, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[])._install()
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

def trusted(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return value

for request in sys.stdin:
    expression, variables = json.loads(request)
    try:
        templar = Templar(loader=DataLoader(), variables=trusted(variables))
        answer = {"value": templar.template(trust_as_template(expression))}
    except Exception as exc:
        answer = {"error": str(exc)}
    print(json.dumps(answer, default=str), flush=True)
"""


@pytest.fixture(scope="module")
def renderer():
    proc = subprocess.Popen([sys.executable, "-c", RENDERER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def render(renderer):
    def _render(expression: str, root: Path = REPO, **variables):
        fleet = yaml.safe_load(FLEET_VARS.read_text())
        request = [expression, {**fleet, "playbook_dir": str(root / "playbooks"), **variables}]
        renderer.stdin.write(json.dumps(request) + "\n")
        renderer.stdin.flush()
        answer = json.loads(renderer.stdout.readline())
        assert "error" not in answer, answer["error"]
        return answer["value"]

    return _render


def code_files(render, root: Path = REPO) -> set:
    return {str(Path(path).resolve().relative_to(root.resolve())) for path in render("{{ __fleet_code_files }}", root)}


def role_text(*kinds: str) -> str:
    return "\n".join(
        path.read_text()
        for role in ROLES
        for kind in kinds
        for path in sorted((role / kind).glob("*"))
        if path.is_file()
    )


def filter_files() -> dict:
    """Each filter of the collection and the plugin file that defines it (FilterModule.filters' keys)."""
    found = {}
    for path in sorted((REPO / "plugins" / "filter").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "filters":
                returned = next(item.value for item in ast.walk(node) if isinstance(item, ast.Return))
                found.update({key.value: f"plugins/filter/{path.name}" for key in returned.keys})
    return found


def imported_module_utils(path: Path, seen: set) -> set:
    """The collection's module_utils files ``path`` imports, and theirs."""
    text = path.read_text()
    names = re.findall(r"plugins\.module_utils\.(\w+) import", text)
    names += [
        name.strip().split(" as ")[0]
        for group in re.findall(r"plugins\.module_utils import \(?([\w ,\n]+)\)?", text)
        for name in group.split(",")
        if name.strip()
    ]
    for name in names:
        file = f"plugins/module_utils/{name}.py"
        if file not in seen and (REPO / file).is_file():
            seen.add(file)
            imported_module_utils(REPO / file, seen)
    return seen


def test_the_filters_the_roles_render_with_are_covered(render):
    used = set(re.findall(re.escape(COLLECTION) + r"(\w+)", role_text("templates", "vars", "tasks", "defaults")))
    defined = filter_files()
    expected = {defined[name] for name in used if name in defined}
    assert {"plugins/filter/unit_value.py", "plugins/filter/cli_args.py"} <= expected
    assert expected - code_files(render) == set()


def test_every_filter_plugin_is_covered(render):
    filters = {str(path.relative_to(REPO)) for path in (REPO / "plugins" / "filter").glob("*.py")}
    assert filters and filters - code_files(render) == set()


def test_the_roles_templates_are_covered(render):
    templates = {str(path.relative_to(REPO)) for role in ROLES for path in role.glob("templates/*")}
    assert "roles/sglang_service/templates/sglang.service.j2" in templates
    assert templates - code_files(render) == set()


def test_the_module_utils_the_units_gate_copies_are_covered(render):
    helpers = yaml.safe_load((ROLES[0] / "vars" / "main.yml").read_text())["__sglang_service_helper_files"]
    copied = {
        item["src"].replace("{{ __sglang_service_module_utils_src }}", "plugins/module_utils")
        for item in helpers
        if "src" in item
    }
    assert "plugins/module_utils/gpu_gate.py" in copied
    assert copied - code_files(render) == set()


def test_the_modules_the_roles_call_and_their_module_utils_are_covered(render):
    called = set(re.findall(r"^\s*-?\s*" + re.escape(COLLECTION) + r"(\w+):", role_text("tasks", "handlers"), re.M))
    modules = {
        f"plugins/modules/{name}.py" for name in called if (REPO / "plugins" / "modules" / f"{name}.py").is_file()
    }
    assert "plugins/modules/sglang_restart.py" in modules
    expected = set(modules)
    for module in modules:
        imported_module_utils(REPO / module, expected)
    assert "plugins/module_utils/restart_chain.py" in expected
    assert expected - code_files(render) == set()


def test_no_file_of_the_roles_or_plugins_that_renders_something_is_left_out(render):
    """A directory added later (a role's files/, a new plugin type) fails here until the list names it."""
    every = {
        str(path.relative_to(REPO))
        for top in [*ROLES, REPO / "plugins"]
        for path in top.rglob("*")
        if path.is_file() and not NOT_RENDERED.search(str(path.relative_to(REPO)))
    }
    assert every - code_files(render) == set()


def test_a_change_to_any_filter_changes_every_hosts_fingerprint(render, tmp_path):
    for top in ("plugins", "roles", "playbooks"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    digest = next(task for task in yaml.safe_load(PREFLIGHT.read_text()) if "run_once" in task)
    digest = digest["ansible.builtin.set_fact"]["__fleet_code_digest"]
    hosts = {
        "h1": {"sglang_service_name": "sglang-a", "sglang_service_port": 30000},
        "h2": {"sglang_service_name": "sglang-b", "sglang_service_port": 30001},
    }
    patch_facts = {"sglang_patch_facts": {"files": [], "replacements": []}}

    def fingerprints() -> dict:
        code = render(digest, tmp_path)
        return {
            host: render("{{ __fleet_fingerprint }}", tmp_path, __fleet_code_digest=code, **patch_facts, **host_vars)
            for host, host_vars in hosts.items()
        }

    before = fingerprints()
    assert all(re.fullmatch(r"[0-9a-f]{64}", value) for value in before.values()), before
    for path in sorted((tmp_path / "plugins" / "filter").glob("*.py")):
        original = path.read_text()
        path.write_text(original + "\n# how the unit is written changed\n")
        after = fingerprints()
        path.write_text(original)
        changed = [host for host in hosts if after[host] != before[host]]
        assert changed == list(hosts), f"a change to {path.name} left {sorted(set(hosts) - set(changed))} up to date"
    assert fingerprints() == before
