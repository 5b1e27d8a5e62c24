"""Copy the Markdown guides of docs/ into the Sphinx source tree of `make docs`.

Links between guides stay relative (Sphinx resolves them). A relative link to anything else in
the repository (a playbook, an example inventory, the top-level README) becomes a link to that
file in the repository, because the HTML site does not contain it. A relative link whose target
does not exist is an error, so a renamed file cannot leave a dead link behind.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import yaml

# The pages of the site's Guides and Runbooks sections (docs/site/index.rst); other Markdown under
# docs/ (an example's README) is linked to in the repository like any other file.
GUIDE_GLOBS = ("*.md", "runbooks/*.md")
# [text](target) and [text](target "title"); images too. Autolinks and reference-style links are not used.
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^\s*(```|~~~)")
# The site has no Mermaid renderer and Pygments no lexer for it (a warning, which fails the build): there, a diagram
# shows as its source.
MERMAID_FENCE = re.compile(r"^(\s*)```mermaid(?=\s*$)")


def guide_files(docs_dir: Path) -> list[Path]:
    return sorted(path for pattern in GUIDE_GLOBS for path in docs_dir.glob(pattern))


def repository_blob_url(repo_root: Path) -> str:
    galaxy = yaml.safe_load((repo_root / "galaxy.yml").read_text(encoding="utf-8"))
    return galaxy["repository"].rstrip("/") + "/blob/main/"


def rewrite_links(text: str, source: Path, guides: set[Path], repo_root: Path, blob_url: str) -> tuple[str, list[str]]:
    """Return the text with links to anything but a guide made absolute, and the dead links found."""
    dead: list[str] = []

    def replace(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path_part, separator, anchor = target.partition("#")
        resolved = (source.parent / path_part).resolve()
        if not resolved.exists():
            dead.append(target)
            return match.group(0)
        if resolved in guides:
            return match.group(0)
        url = blob_url + resolved.relative_to(repo_root.resolve()).as_posix() + separator + anchor
        return match.group(1) + url + match.group(3)

    lines, in_fence = [], False
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            in_fence = not in_fence
            line = MERMAID_FENCE.sub(r"\1```text", line)
        lines.append(line if in_fence else LINK.sub(replace, line))
    return "".join(lines), dead


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("docs_dir", type=Path, help="the repository's docs/ directory")
    parser.add_argument("dest", type=Path, help="where the guides go inside the Sphinx source tree")
    args = parser.parse_args()

    docs_dir = args.docs_dir
    repo_root = docs_dir.resolve().parent
    blob_url = repository_blob_url(repo_root)
    shutil.rmtree(args.dest, ignore_errors=True)
    sources = guide_files(docs_dir)
    guides = {source.resolve() for source in sources}
    problems = []
    for source in sources:
        text, dead = rewrite_links(source.read_text(encoding="utf-8"), source, guides, repo_root, blob_url)
        problems += [f"{source}: link to {target!r}: no such file" for target in dead]
        target = args.dest / source.relative_to(docs_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
