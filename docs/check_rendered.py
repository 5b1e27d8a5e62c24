"""Fail unless every module, documented plugin and role of the collection has a rendered HTML page.

Run by `make docs` after sphinx-build. A page antsibull-docs wrote for documentation it could not
parse counts as missing. Then antsibull-docs' own linter runs over the collection's plugin and role
documentation (schema, markup, references to the collection's own content).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

# antsibull-docs' text on the page it writes in place of documentation it could not parse.
MALFORMED_MARKER = "was malformed"
# Plugin directories without pages of their own.
UNDOCUMENTED_PLUGIN_DIRS = {"module_utils", "doc_fragments", "plugin_utils", "action", "__pycache__"}


def expected_pages(collection: Path) -> dict[str, str]:
    """Map 'type name' (for messages) to the page file name antsibull-docs gives it."""
    pages = {}
    plugins = collection / "plugins"
    for plugin_dir in sorted(p for p in plugins.iterdir() if p.is_dir()) if plugins.is_dir() else []:
        if plugin_dir.name in UNDOCUMENTED_PLUGIN_DIRS:
            continue
        plugin_type = "module" if plugin_dir.name == "modules" else plugin_dir.name
        for source in sorted(plugin_dir.glob("*.py")):
            name = source.stem
            if name == "__init__":
                continue
            documented = plugin_type == "module" or _has_documentation(source)
            if documented:
                pages[f"{plugin_type} {name}"] = f"{name}_{plugin_type}.html"
    roles = collection / "roles"
    for role_dir in sorted(p for p in roles.iterdir() if p.is_dir()) if roles.is_dir() else []:
        # Roles starting with "_" are the collection's internal task libraries, not documented.
        if not role_dir.name.startswith("_"):
            pages[f"role {role_dir.name}"] = f"{role_dir.name}_role.html"
    return pages


def _has_documentation(source: Path) -> bool:
    sidecars = (source.with_suffix(".yml"), source.with_suffix(".yaml"))
    return "DOCUMENTATION" in source.read_text(encoding="utf-8") or any(p.exists() for p in sidecars)


def page_problems(collection: Path, html_dir: Path) -> tuple[list[str], int]:
    galaxy = yaml.safe_load((collection / "galaxy.yml").read_text(encoding="utf-8"))
    page_dir = html_dir / "collections" / galaxy["namespace"] / galaxy["name"]
    problems = []
    pages = expected_pages(collection)
    for what, file_name in pages.items():
        page = page_dir / file_name
        if not page.is_file():
            problems.append(f"{what}: no page {page}")
        elif MALFORMED_MARKER in page.read_text(encoding="utf-8"):
            problems.append(f"{what}: {page} says its documentation {MALFORMED_MARKER}")
    return problems, len(pages)


def lint(collection: Path, antsibull_docs: str) -> tuple[int, str]:
    result = subprocess.run(
        # rstcheck is skipped: sphinx-build -W has just built the same generated RST, and it doubles the time.
        [antsibull_docs, "lint-collection-docs", "--plugin-docs", "--skip-rstcheck", str(collection)],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode, (result.stdout + result.stderr).strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", type=Path, default=Path("."), help="collection root (holds galaxy.yml)")
    parser.add_argument("--html", type=Path, required=True, help="sphinx-build's HTML output directory")
    parser.add_argument(
        "--antsibull-docs",
        default=str(Path(sys.executable).parent / "antsibull-docs"),
        help="antsibull-docs executable (default: the one next to this Python)",
    )
    args = parser.parse_args()
    if not (args.collection / "galaxy.yml").is_file():
        parser.error(f"--collection {args.collection}: no galaxy.yml there")
    if not args.html.is_dir():
        parser.error(f"--html {args.html}: not a directory (run sphinx-build first)")

    problems, page_count = page_problems(args.collection, args.html)
    for problem in problems:
        print(f"not rendered: {problem}", file=sys.stderr)
    lint_rc, lint_output = lint(args.collection, args.antsibull_docs)
    if lint_rc != 0:
        print(f"antsibull-docs lint-collection-docs failed (rc={lint_rc}):\n{lint_output}", file=sys.stderr)
    if problems or lint_rc != 0:
        return 1
    print(f"docs: {page_count} plugin and role pages rendered; antsibull-docs lint passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
