"""The installed real `sglang` package, read without importing it.

The simulator stands in for SGLang's process, not its sources: the algorithm names come from the
installed spec_info.py, and an installed .py file that differs from the wheel's RECORD is compiled
during the load, so a patch that does not compile crashes the launch as it would on a real host.

What a patch does at run time cannot be simulated from its code, so a patched file can say it: a comment
line `# sglang-sim-fault: degenerate` (any fault names, comma-separated) in a file that differs from the
wheel turns those faults on, as if the patched runtime behaved that way. The wheel's own files are never read
for it.
"""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from . import faults

SPEC_INFO = Path("srt") / "speculative" / "spec_info.py"
SPEC_REGISTRY = Path("srt") / "speculative" / "spec_registry.py"
ENUM_CLASS = "SpeculativeAlgorithm"
ALIASES_NAME = "_RESERVED_ALIASES"
FALLBACK_VERSION = "0.5.23"
FAULT_MARKER = re.compile(r"^[ \t]*#[ \t]*sglang-sim-fault:(.*)$", re.MULTILINE)


class SglangNotInstalled(Exception):
    """No `sglang` package is importable by this interpreter."""


@dataclass(frozen=True)
class InstalledSglang:
    package_dir: Path
    dist_info: Path | None

    @property
    def site_dir(self) -> Path:
        return self.package_dir.parent

    def version(self) -> str:
        if self.dist_info is None:
            return FALLBACK_VERSION
        try:
            for line in (self.dist_info / "METADATA").read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return FALLBACK_VERSION


def locate() -> InstalledSglang:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangNotInstalled(
            "the sglang package is not installed in this Python environment "
            f"(looked with importlib from {sys.executable}); install sglang==0.5.23 into this venv"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    candidates = sorted(package_dir.parent.glob("sglang-*.dist-info"))
    return InstalledSglang(package_dir, candidates[-1] if candidates else None)


def algorithm_names(installed: InstalledSglang) -> tuple[frozenset[str], frozenset[str]]:
    """Member names of class SpeculativeAlgorithm in spec_info.py, and the reserved aliases (NEXTN)."""
    members = _enum_members(installed.package_dir / SPEC_INFO)
    aliases = _frozenset_literal(installed.package_dir / SPEC_REGISTRY, ALIASES_NAME)
    return members, aliases


def _enum_members(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == ENUM_CLASS:
            names = set()
            for statement in node.body:
                targets = statement.targets if isinstance(statement, ast.Assign) else []
                if isinstance(statement, ast.AnnAssign) and statement.value is not None:
                    targets = [statement.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("_"))
            return frozenset(names)
    raise ValueError(f"class {ENUM_CLASS} not found in {path}")


def _frozenset_literal(path: Path, name: str) -> frozenset[str]:
    """The string elements of `name = frozenset({...})` in a module, or empty if absent."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError):
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return frozenset(
                c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
    return frozenset()


def _record_hashes(installed: InstalledSglang) -> dict[str, str]:
    """RECORD's sha256 (urlsafe base64, unpadded) of each sglang .py file, by path relative to site-packages."""
    if installed.dist_info is None:
        return {}
    hashes = {}
    with open(installed.dist_info / "RECORD", newline="") as handle:
        for row in csv.reader(handle):
            if len(row) >= 2 and row[0].endswith(".py") and row[1].startswith("sha256="):
                hashes[row[0]] = row[1][len("sha256=") :]
    return hashes


def _sha256_b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def modified_sources(installed: InstalledSglang) -> list[Path]:
    """Installed sglang .py files that differ from RECORD or are not in it (added by a patch)."""
    hashes = _record_hashes(installed)
    changed = []
    for root, dirs, files in os.walk(installed.package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(root) / name
            relative = path.relative_to(installed.site_dir).as_posix()
            expected = hashes.get(relative)
            if expected is None or _sha256_b64(path.read_bytes()) != expected:
                changed.append(path)
    return changed


def compile_sources(paths: list[Path]) -> None:
    """Compile each file as the import would; a SyntaxError propagates with the file's name and line."""
    for path in paths:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)


def declared_faults(installed: InstalledSglang, paths: list[Path]) -> dict[str, dict]:
    """Faults named by `# sglang-sim-fault:` lines in the given (modified) files, by path relative to site-packages.

    Raises ValueError naming the file and the line for an unknown fault.
    """
    declared = {}
    for path in paths:
        relative = path.relative_to(installed.site_dir).as_posix()
        names: dict = {}
        for match in FAULT_MARKER.finditer(path.read_text(errors="replace")):
            try:
                names.update(faults.parse_faults([match.group(1)]))
            except ValueError as exc:
                raise ValueError(f"{relative}: {match.group(0).strip()!r}: {exc}") from None
        if names:
            declared[relative] = names
    return declared
