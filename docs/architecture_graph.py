"""Write the dependency diagram of docs/architecture.md (Mermaid) from the collection's code as it is.

Read from the files, nothing listed by hand: the playbooks (playbooks/*.yml, and the task files they import or
include) -> the roles they use (with the entry points, tasks_from) and the modules they call; the roles (their tasks
and handlers) -> the modules they call, the filters their tasks, variables and templates use, and the Python
scripts their templates install on a host; modules, filters and those scripts -> the module_utils they import
(Python's ast); module_utils -> module_utils. A module_utils subpackage is drawn as a box of its files.

    python docs/architecture_graph.py            print the diagram
    python docs/architecture_graph.py --write    replace the one in docs/architecture.md
    python docs/architecture_graph.py --check    exit 1 when the one in docs/architecture.md differs
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOC = "docs/architecture.md"
BEGIN = "<!-- generated: architecture graph (python docs/architecture_graph.py --write) -->"
END = "<!-- end generated -->"
COLLECTION = "llmops.inference."
PACKAGE = "ansible_collections.llmops.inference.plugins.module_utils"
INCLUDE_TASKS = {f"{prefix}{name}" for prefix in ("", "ansible.builtin.") for name in ("include_tasks", "import_tasks")}
INCLUDE_ROLE = {f"{prefix}{name}" for prefix in ("", "ansible.builtin.") for name in ("include_role", "import_role")}
BLOCKS = ("block", "rescue", "always")
PLAY_TASKS = ("pre_tasks", "tasks", "post_tasks", "handlers")
GROUPS = {
    "pb": "playbooks",
    "role": "roles",
    "mod": "modules",
    "flt": "filters",
    "host": "scripts on the host",
    "mu": "module_utils",
}


@dataclass
class Graph:
    nodes: dict = field(default_factory=dict)  # id -> label
    edges: dict = field(default_factory=dict)  # (from, to) -> set of labels
    packages: dict = field(default_factory=dict)  # module_utils subpackage -> ids of its files

    def edge(self, source: str, target: str, label: str = "") -> None:
        labels = self.edges.setdefault((source, target), set())
        if label:
            labels.add(label)


def node_id(kind: str, name: str) -> str:
    """A Mermaid id: a subpackage's "/" becomes "__", so that restart/chain.py and restart_chain.py differ."""
    return f"{kind}_{re.sub(r'[^A-Za-z0-9_]', '_', name.replace('/', '__'))}"


def load_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return None


# -- what YAML task files use ----------------------------------------------------------------------------------------
@dataclass
class Uses:
    roles: dict = field(default_factory=dict)  # role name -> entry points
    modules: set = field(default_factory=set)
    files: set = field(default_factory=set)  # task files already read


def short_name(name) -> str:
    name = str(name)
    return name[len(COLLECTION) :] if name.startswith(COLLECTION) else name


def without_suffix(name: str, suffix: str) -> str:
    return name[: -len(suffix)] if name.endswith(suffix) else name


def task_file(value, here: Path, root: Path):
    """The task file an import/include names, where Ansible looks for it: beside the including file, then in the
    playbooks' directory. None for a templated or missing name."""
    name = value.get("file") if isinstance(value, dict) else value
    if not isinstance(name, str) or "{{" in name:
        return None
    for directory in (here.parent, root / "playbooks", root / "playbooks" / "tasks"):
        if (directory / name).is_file():
            return (directory / name).resolve()
    return None


def read_tasks(tasks, here: Path, root: Path, modules: set, uses: Uses) -> None:
    for task in tasks if isinstance(tasks, list) else []:
        if not isinstance(task, dict):
            continue
        for key in BLOCKS:
            read_tasks(task.get(key), here, root, modules, uses)
        for key, value in task.items():
            if key in INCLUDE_TASKS:
                read_file(task_file(value, here, root), root, modules, uses)
            elif key in INCLUDE_ROLE and isinstance(value, dict) and value.get("name"):
                uses.roles.setdefault(short_name(value["name"]), set()).add(value.get("tasks_from", "main"))
            elif str(key).startswith(COLLECTION) and short_name(key) in modules:
                uses.modules.add(short_name(key))


def read_file(path, root: Path, modules: set, uses: Uses) -> None:
    if path is None or path in uses.files:
        return
    uses.files.add(path)
    read_tasks(load_yaml(path), path, root, modules, uses)


def read_playbook(path: Path, root: Path, modules: set, uses: Uses) -> None:
    for play in load_yaml(path) or []:
        if not isinstance(play, dict):
            continue
        for key in ("import_playbook", "ansible.builtin.import_playbook"):
            if isinstance(play.get(key), str) and (path.parent / play[key]).is_file():
                read_playbook(path.parent / play[key], root, modules, uses)
        for role in play.get("roles") or []:
            name = role if isinstance(role, str) else role.get("role") or role.get("name")
            uses.roles.setdefault(short_name(name), set()).add("main")
        for key in PLAY_TASKS:
            read_tasks(play.get(key), path, root, modules, uses)


# -- what Python files import ----------------------------------------------------------------------------------------
def python_imports(text: str) -> list:
    """The import statements of a Python file, or of a template of one (line by line where Jinja breaks the
    parse)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        statements = []
        for line in text.splitlines():
            if re.match(r"\s*(from|import)\s", line):
                try:
                    statements += ast.parse(line.strip()).body
                except SyntaxError:
                    continue
        return statements
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def imported_parts(node, path: Path, module_utils: Path):
    """The module_utils path parts a ``from`` import ``node`` in ``path`` names, or None for other imports."""
    if node.level:  # relative: only inside module_utils
        if module_utils not in path.parents:
            return None
        package = path.parent.relative_to(module_utils).parts
        return list(package[: len(package) - (node.level - 1)]) + (node.module.split(".") if node.module else [])
    if node.module == PACKAGE:
        return []
    if (node.module or "").startswith(PACKAGE + "."):
        return node.module[len(PACKAGE) + 1 :].split(".")
    return None


def module_utils_targets(path: Path, module_utils: Path, text: str) -> set:
    """The module_utils files ``text`` (the content of ``path``) imports, as paths relative to module_utils."""
    found = set()

    def add(parts: list) -> bool:
        base = module_utils.joinpath(*parts) if parts else module_utils
        for candidate in (base.with_suffix(".py") if parts else None, base / "__init__.py"):
            if candidate is not None and candidate.is_file():
                found.add(candidate.relative_to(module_utils).as_posix())
                return True
        return False

    for node in python_imports(text):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    add(alias.name[len(PACKAGE) + 1 :].split("."))
            continue
        parts = imported_parts(node, path, module_utils)
        if parts is None:
            continue
        submodules = [alias.name for alias in node.names if add([*parts, alias.name])]
        if len(submodules) < len(node.names):  # names defined in the module or package itself
            add(parts)
    return found


# -- the graph -------------------------------------------------------------------------------------------------------
def filter_names(root: Path) -> dict:
    """Each filter name and the plugin file that defines it (the keys FilterModule.filters returns)."""
    found = {}
    for path in sorted((root / "plugins" / "filter").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "filters":
                for item in ast.walk(node):
                    if isinstance(item, ast.Return) and isinstance(item.value, ast.Dict):
                        found.update({key.value: path.stem for key in item.value.keys if isinstance(key, ast.Constant)})
    return found


def files_of(directory: Path, pattern: str) -> list:
    return sorted(path for path in directory.glob(pattern) if path.is_file()) if directory.is_dir() else []


class Collector:
    """Builds the graph: module_utils, modules and filters, then what each role and playbook uses."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.graph = Graph()
        self.plugins = root / "plugins"
        self.module_utils = self.plugins / "module_utils"
        self.modules = {path.stem for path in files_of(self.plugins / "modules", "*.py") if path.stem != "__init__"}
        self.filters = filter_names(root)
        self.filter_use = re.compile(re.escape(COLLECTION) + r"(\w+)")

    def python_node(self, kind: str, path: Path, label: str) -> str:
        source = node_id(kind, label)
        self.graph.nodes[source] = label
        for target in module_utils_targets(path, self.module_utils, path.read_text()):
            self.graph.edge(source, self.mu_node(target))
        return source

    def mu_node(self, relative: str) -> str:
        ident = node_id("mu", without_suffix(relative, ".py"))
        package, name = relative.rpartition("/")[::2]
        self.graph.nodes[ident] = name
        if package:
            self.graph.packages.setdefault(package, set()).add(ident)
        return ident

    def filter_edges(self, source: str, text: str) -> None:
        for name in sorted({self.filters[name] for name in self.filter_use.findall(text) if name in self.filters}):
            self.graph.edge(source, node_id("flt", name))

    def use_edges(self, source: str, uses: Uses) -> None:
        for name, entry_points in sorted(uses.roles.items()):
            for entry_point in entry_points:
                self.graph.edge(source, node_id("role", name), entry_point)
        for name in sorted(uses.modules):
            self.graph.edge(source, node_id("mod", name))

    def add_plugins(self) -> None:
        for path in files_of(self.module_utils, "**/*.py"):
            relative = path.relative_to(self.module_utils).as_posix()
            if "__pycache__" in relative:
                continue
            targets = module_utils_targets(path, self.module_utils, path.read_text()) - {relative}
            if path.name != "__init__.py" or targets:
                source = self.mu_node(relative)
                for target in targets:
                    self.graph.edge(source, self.mu_node(target))
        for name in sorted(self.modules):
            self.python_node("mod", self.plugins / "modules" / f"{name}.py", name)
        for path in files_of(self.plugins / "filter", "*.py"):
            self.python_node("flt", path, path.stem)

    def add_role(self, role: Path) -> None:
        source = node_id("role", role.name)
        self.graph.nodes[source] = role.name
        uses = Uses()
        for path in files_of(role / "tasks", "*.yml") + files_of(role / "handlers", "*.yml"):
            read_file(path.resolve(), self.root, self.modules, uses)
        self.use_edges(source, uses)
        kinds = ("tasks", "handlers", "vars", "defaults", "templates")
        self.filter_edges(source, "\n".join(path.read_text() for kind in kinds for path in files_of(role / kind, "*")))
        for path in files_of(role / "templates", "*.py.j2"):
            self.graph.edge(source, self.python_node("host", path, without_suffix(path.name, ".j2")), "installs")

    def add_playbook(self, path: Path) -> None:
        source = node_id("pb", path.name)
        self.graph.nodes[source] = path.name
        uses = Uses()
        read_playbook(path, self.root, self.modules, uses)
        self.use_edges(source, uses)
        self.filter_edges(source, "\n".join(file.read_text() for file in sorted(uses.files | {path})))


def collect(root: Path = ROOT) -> Graph:
    collector = Collector(root)
    collector.add_plugins()
    for role in sorted(path for path in (root / "roles").iterdir() if (path / "tasks").is_dir()):
        collector.add_role(role)
    for path in files_of(root / "playbooks", "*.yml"):
        collector.add_playbook(path)
    return collector.graph


def mermaid(graph: Graph) -> str:
    lines = ["flowchart LR"]
    in_package = {ident for idents in graph.packages.values() for ident in idents}
    for kind, title in GROUPS.items():
        idents = sorted(ident for ident in graph.nodes if ident.startswith(kind + "_") and ident not in in_package)
        packages = sorted(graph.packages) if kind == "mu" else []
        if not idents and not packages:
            continue
        lines.append(f'  subgraph {kind}["{title}"]')
        lines += [f'    {ident}["{graph.nodes[ident]}"]' for ident in idents]
        for package in packages:
            lines.append(f'    subgraph {node_id("mupkg", package)}["{package}/"]')
            lines += [f'      {ident}["{graph.nodes[ident]}"]' for ident in sorted(graph.packages[package])]
            lines.append("    end")
        lines.append("  end")
    for (source, target), labels in sorted(graph.edges.items()):
        arrow = f"-->|{', '.join(sorted(labels))}|" if labels else "-->"
        lines.append(f"  {source} {arrow} {target}")
    return "\n".join(lines)


def block(graph: Graph) -> str:
    return f"{BEGIN}\n```mermaid\n{mermaid(graph)}\n```\n{END}"


def embedded(text: str) -> str:
    """The generated block of a page, markers included; '' when the page has none."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if start >= 0 and end > start else ""


def embed(text: str, generated: str) -> str:
    current = embedded(text)
    if not current:
        sys.exit(f"{DOC}: no lines {BEGIN!r} ... {END!r} to put the diagram between")
    return text.replace(current, generated)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"replace the diagram in {DOC}")
    action.add_argument("--check", action="store_true", help=f"exit 1 when the diagram in {DOC} is not current")
    args = parser.parse_args(argv)
    generated = block(collect(ROOT))
    doc = ROOT / DOC
    if args.write:
        doc.write_text(embed(doc.read_text(), generated))
    elif args.check:
        if embedded(doc.read_text()) != generated:
            print(f"{DOC}: the diagram is not current; run: python docs/architecture_graph.py --write", file=sys.stderr)
            return 1
    else:
        print(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
