# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The installed files of one Python package, and the only ways this collection changes them.

Private to the llmops.inference collection; not a public API. Standard library only.
Paths are given relative to the install base (the site-packages directory that holds the package,
as in the package's RECORD), e.g. ``sglang/srt/speculative/spec_info.py``. A path that is absolute,
contains ``..``, or resolves (through symlinks) outside the package directory is refused.
"""

from __future__ import annotations

import os
import re

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import (
    atomic_write,
    is_temp_leftover,
    read_bytes,
)

BYTECODE_DIR = "__pycache__"


class PathSafetyError(ValueError):
    """A path that would reach outside the package directory."""


def normalize_relpath(path: str) -> str:
    """``path`` as 'a/b/c' relative to the install base; refuses absolute paths and '..'."""
    if not isinstance(path, str) or not path.strip():
        raise PathSafetyError(f"empty path {path!r}: give a path relative to site-packages, like sglang/srt/x.py")
    if path.startswith("/") or path.startswith("~"):
        raise PathSafetyError(
            f"{path}: absolute paths are refused; give a path relative to site-packages, like sglang/srt/x.py"
        )
    parts = path.split("/")
    if ".." in parts:
        raise PathSafetyError(f"{path}: paths containing '..' are refused")
    if "\x00" in path:
        raise PathSafetyError(f"{path!r}: NUL bytes are refused in paths")
    parts = [part for part in parts if part not in ("", ".")]
    if not parts:
        raise PathSafetyError(f"{path}: names no file")
    return "/".join(parts)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class SourceTree:
    """Reads and atomically writes files of the package at ``package_dir`` inside ``base_dir``."""

    def __init__(self, base_dir: str, package_dir: str):
        self.base_dir = base_dir
        self.package_dir = package_dir
        self.package_name = os.path.relpath(package_dir, base_dir)
        self._package_real = os.path.realpath(package_dir)

    def path_of(self, rel: str) -> str:
        """The real path ``rel`` names; raises PathSafetyError when it leaves the package directory."""
        rel = normalize_relpath(rel)
        if rel != self.package_name and not rel.startswith(self.package_name + "/"):
            raise PathSafetyError(
                f"{rel} is outside the package: paths are relative to {self.base_dir} "
                f"and must start with '{self.package_name}/'"
            )
        real = os.path.realpath(os.path.join(self.base_dir, rel))
        if not _within(real, self._package_real) or real == self._package_real:
            raise PathSafetyError(
                f"{rel} resolves to {real}, outside the package directory {self._package_real} (symlink escape)"
            )
        if os.path.isdir(real):
            raise PathSafetyError(f"{rel} is a directory, not a file")
        return real

    def check(self, rel: str) -> str:
        """Validate ``rel`` and return it normalized."""
        self.path_of(rel)
        return normalize_relpath(rel)

    def read(self, rel: str) -> bytes | None:
        return read_bytes(self.path_of(rel))

    def mode(self, rel: str) -> int | None:
        try:
            return os.stat(self.path_of(rel)).st_mode & 0o7777
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes, mode: int | None = None) -> list:
        """Atomically replace (or create) ``rel``; returns the directories it had to create (relative)."""
        path = self.path_of(rel)
        created = self._make_parents(os.path.dirname(path))
        atomic_write(path, data, mode)
        return created

    def remove(self, rel: str) -> bool:
        try:
            os.unlink(self.path_of(rel))
        except FileNotFoundError:
            return False
        return True

    def remove_empty_dirs(self, rels: list) -> list:
        """Remove the given directories (deepest first) when empty; a package dir must not linger as a namespace."""
        removed = []
        for rel in sorted(rels, key=lambda r: r.count("/"), reverse=True):
            path = os.path.join(self._package_real, os.path.relpath(rel, self.package_name))
            cache = os.path.join(path, BYTECODE_DIR)
            if os.path.isdir(cache) and not os.listdir(cache):
                os.rmdir(cache)
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)
                removed.append(rel)
        return removed

    def purge_bytecode(self, rel: str) -> list:
        """Delete the cached bytecode of module ``rel`` (every interpreter tag and optimization level)."""
        path = self.path_of(rel)
        directory, name = os.path.split(path)
        if not name.endswith(".py"):
            return []
        stem = name[:-3]
        candidates = [os.path.join(directory, stem + ".pyc")]
        cache = os.path.join(directory, BYTECODE_DIR)
        if os.path.isdir(cache):
            cached = re.compile(rf"^{re.escape(stem)}\.[A-Za-z0-9_-]+(\.opt-[0-9]+)?\.pyc$")
            candidates += [os.path.join(cache, entry) for entry in sorted(os.listdir(cache)) if cached.match(entry)]
        removed = []
        for candidate in candidates:
            try:
                os.unlink(candidate)
            except FileNotFoundError:
                continue
            removed.append(self._relative(candidate))
        return removed

    def remove_temp_leftovers(self, rel: str) -> list:
        """Delete temporary files an interrupted atomic write left beside ``rel``."""
        directory = os.path.dirname(self.path_of(rel))
        if not os.path.isdir(directory):
            return []
        removed = []
        prefix = "." + os.path.basename(rel) + "."
        for entry in os.listdir(directory):
            if entry.startswith(prefix) and is_temp_leftover(entry):
                os.unlink(os.path.join(directory, entry))
                removed.append(self._relative(os.path.join(directory, entry)))
        return removed

    def missing_parents(self, rel: str) -> list:
        """The directories (relative) that writing ``rel`` would create, outermost first."""
        missing = []
        directory = os.path.dirname(self.path_of(rel))
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        return [self._relative(path) for path in reversed(missing)]

    def _make_parents(self, directory: str) -> list:
        missing = []
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for path in reversed(missing):
            os.mkdir(path, 0o755)
        return [self._relative(path) for path in reversed(missing)]

    def _relative(self, real: str) -> str:
        return os.path.join(self.package_name, os.path.relpath(real, self._package_real))
