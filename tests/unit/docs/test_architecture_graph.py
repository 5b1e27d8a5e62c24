"""docs/architecture.md's diagram is the one docs/architecture_graph.py draws from the code now, and the generator
finds what the collection holds (every playbook, role, module, filter and module_utils file) without a list of it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "docs"))
import architecture_graph as graph

REPO = Path(__file__).resolve().parents[3]
REGENERATE = ".venv/bin/python docs/architecture_graph.py --write"


@pytest.fixture(scope="module")
def drawn():
    return graph.collect(REPO)


def test_the_embedded_diagram_is_current(drawn):
    embedded = graph.embedded((REPO / graph.DOC).read_text())
    assert embedded, f"{graph.DOC} has no {graph.BEGIN!r} ... {graph.END!r} block for the diagram"
    assert embedded == graph.block(drawn), (
        f"{graph.DOC}: the diagram differs from what the code gives now; regenerate it with: {REGENERATE}"
    )


def test_every_part_of_the_collection_is_drawn(drawn):
    labels = set(drawn.nodes.values())
    assert {path.name for path in (REPO / "playbooks").glob("*.yml")} <= labels
    assert {path.name for path in (REPO / "roles").iterdir() if (path / "tasks").is_dir()} <= labels
    for kind in ("modules", "filter"):
        assert {path.stem for path in (REPO / "plugins" / kind).glob("*.py")} <= labels
    module_utils = REPO / "plugins" / "module_utils"
    files = {path.name for path in module_utils.rglob("*.py") if path.name != "__init__.py"}
    assert files <= labels


def test_the_known_dependencies_are_drawn(drawn):
    edges = {(drawn.nodes[source], drawn.nodes[target]): labels for (source, target), labels in drawn.edges.items()}
    assert "facts" in edges[("deploy.yml", "sglang_service")]
    assert "restart" in edges[("spec_sweep.yml", "sglang_service")]
    assert ("sglang_service", "sglang_restart") in edges
    assert ("sglang_patch", "source_patch") in edges
    assert edges[("sglang_service", "llmops_gate.py")] == {"installs"}
    assert ("llmops_gate.py", "gpu_gate.py") in edges
    assert ("sglang_service", "unit_value") in edges


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_module_utils_subpackage_is_drawn_as_a_box_of_its_files(tmp_path):
    package = "ansible_collections.llmops.inference.plugins.module_utils"
    write(tmp_path, "plugins/modules/thing.py", f"from {package}.pkg.first import run\nfrom {package} import top\n")
    write(tmp_path, "plugins/module_utils/top.py", "")
    write(tmp_path, "plugins/module_utils/pkg/__init__.py", "")
    write(tmp_path, "plugins/module_utils/pkg/first.py", "from .second import step\nfrom .. import top\n")
    write(tmp_path, "plugins/module_utils/pkg/second.py", f"from {package}.pkg import first\n")
    write(tmp_path, "roles/r/tasks/main.yml", "- name: Call\n  llmops.inference.thing: {}\n")
    write(
        tmp_path,
        "playbooks/p.yml",
        "- hosts: all\n  tasks:\n    - name: Use\n      ansible.builtin.include_tasks: tasks/t.yml\n",
    )
    write(
        tmp_path,
        "playbooks/tasks/t.yml",
        "- name: Role\n  ansible.builtin.include_role:\n    name: llmops.inference.r\n    tasks_from: facts\n"
        "- block:\n    - name: Module\n      llmops.inference.thing: {}\n",
    )
    text = graph.mermaid(graph.collect(tmp_path))
    box = '    subgraph mupkg_pkg["pkg/"]\n      mu_pkg__first["first.py"]\n      mu_pkg__second["second.py"]\n    end'
    assert box in text
    assert '    mu_top["top.py"]' in text and "__init__" not in text
    for edge in (
        "mod_thing --> mu_pkg__first",
        "mod_thing --> mu_top",
        "mu_pkg__first --> mu_pkg__second",
        "mu_pkg__first --> mu_top",
        "mu_pkg__second --> mu_pkg__first",
        "role_r --> mod_thing",
        "pb_p_yml -->|facts| role_r",
        "pb_p_yml --> mod_thing",
    ):
        assert f"  {edge}\n" in text + "\n", edge


def test_embed_replaces_only_the_block():
    page = f"# Title\n\n{graph.BEGIN}\nold\n{graph.END}\n\nmore\n"
    new = f"{graph.BEGIN}\nnew\n{graph.END}"
    assert graph.embed(page, new) == f"# Title\n\n{new}\n\nmore\n"
