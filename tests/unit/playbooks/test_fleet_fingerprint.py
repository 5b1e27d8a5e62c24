"""The deploy's fingerprint (playbooks/vars/sglang_fleet.yml) covers every input that renders or runs something on a
host, so that a change to any of them marks every host for redeploy. The expectations are read off the roles
themselves: the filters their templates and variables use, their templates, the modules their tasks call and the
module_utils those import, and the files the unit's gate copies to the host."""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "docs"))
from architecture_graph import module_utils_targets
from templar_worker import TemplarWorker

REPO = Path(__file__).resolve().parents[3]
ROLES = [REPO / "roles" / "sglang_service", REPO / "roles" / "sglang_patch"]
FLEET_VARS = REPO / "playbooks" / "vars" / "sglang_fleet.yml"
HOST_FACTS = REPO / "playbooks" / "tasks" / "host_facts.yml"
MODULE_UTILS = REPO / "plugins" / "module_utils"
COLLECTION = "llmops.inference."
# Files of a role or of plugins/ that render nothing on a host.
NOT_RENDERED = re.compile(r"(^|/)(__pycache__|meta|doc_fragments)/|(^|/)README\.md$|\.pyc$")

ROLE_FACTS = {"sglang_service_facts": ROLES[0], "sglang_patch_facts": ROLES[1]}


@pytest.fixture(scope="module")
def renderer():
    with TemplarWorker() as worker:  # the builtin lookups and filters the playbooks and facts use
        yield worker


@pytest.fixture
def render(renderer):
    def _render(expression: str, root: Path = REPO, **variables):
        fleet = yaml.safe_load(FLEET_VARS.read_text())
        return renderer.render(expression, {**fleet, "playbook_dir": str(root / "playbooks"), **variables})

    return _render


def role_code_files(render, root: Path = REPO) -> dict:
    """Each role's facts' code_files, rendered as its tasks_from: facts renders them (the task's vars, role_path)."""
    facts = {}
    for name, role in ROLE_FACTS.items():
        task = yaml.safe_load((role / "tasks" / "facts.yml").read_text())[0]
        expression = task["ansible.builtin.set_fact"][name]["code_files"]
        facts[name] = {
            "code_files": render(expression, root, role_path=str(root / role.relative_to(REPO)), **task["vars"])
        }
    return facts


def code_files(render, root: Path = REPO) -> set:
    files = render("{{ __fleet_code_files }}", root, **role_code_files(render, root))
    return {str(Path(path).resolve().relative_to(root.resolve())) for path in files}


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
    for name in module_utils_targets(path, MODULE_UTILS, path.read_text()):
        file = f"plugins/module_utils/{name}"
        if file not in seen:
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
    assert any("restart" in file for file in expected - modules), expected  # the restart chain's module_utils
    assert expected - code_files(render) == set()


def test_no_file_of_the_roles_or_plugins_that_renders_something_is_left_out(render):
    """A directory added later (a role's files/, a subpackage of module_utils, a new plugin type) fails here until
    the role's facts (code_files) name it."""
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
    digest = next(task for task in yaml.safe_load(HOST_FACTS.read_text()) if "run_once" in task)
    digest = digest["ansible.builtin.set_fact"]["__fleet_code_digest"]
    hosts = {
        "h1": {"sglang_service_name": "sglang-a", "sglang_service_port": 30000},
        "h2": {"sglang_service_name": "sglang-b", "sglang_service_port": 30001},
    }

    def fingerprints() -> dict:
        facts = role_code_files(render, tmp_path)
        facts["sglang_patch_facts"].update(files=[], replacements=[])
        facts["sglang_service_facts"].update(adaptive_config=adaptive)
        code = render(digest, tmp_path, **facts)
        return {
            host: render("{{ __fleet_fingerprint }}", tmp_path, __fleet_code_digest=code, **facts, **host_vars)
            for host, host_vars in hosts.items()
        }

    adaptive = None
    before = fingerprints()
    assert all(re.fullmatch(r"[0-9a-f]{64}", value) for value in before.values()), before
    # The adaptive config's content (a sweep's result file may change under the same path) is an input too.
    adaptive = {"1": {"candidate_steps": [3, 4]}}
    with_adaptive = fingerprints()
    adaptive = {"1": {"candidate_steps": [3]}}
    assert all(with_adaptive[host] != before[host] != fingerprints()[host] for host in hosts)
    adaptive = None
    for path in sorted((tmp_path / "plugins" / "filter").glob("*.py")):
        original = path.read_text()
        path.write_text(original + "\n# how the unit is written changed\n")
        after = fingerprints()
        path.write_text(original)
        changed = [host for host in hosts if after[host] != before[host]]
        assert changed == list(hosts), f"a change to {path.name} left {sorted(set(hosts) - set(changed))} up to date"
    assert fingerprints() == before
