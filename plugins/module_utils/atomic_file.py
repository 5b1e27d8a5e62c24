# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Crash-safe file writes and content hashes.

Private to the llmops.inference collection; not a public API. Standard library only.
A write goes to a temporary file in the target's directory, is fsynced, renamed over the target
and the directory is fsynced, so after a crash the target holds either the old or the new bytes.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile

TEMP_SUFFIX = ".llmops-tmp"
CHUNK = 1024 * 1024


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: str, algorithm: str = "sha256"):
    """The ``hashlib`` hash of a file's content, read in chunks, or None when the file does not exist."""
    digest = hashlib.new(algorithm)
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest


def sha256_file(path: str) -> str | None:
    """Hex sha256 of a file's content, or None when it does not exist."""
    digest = file_digest(path)
    return None if digest is None else digest.hexdigest()


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data``; keeps the old file's mode and owner unless ``mode`` is given."""
    directory, name = os.path.split(path)
    uid = gid = None
    try:
        old = os.stat(path)
        uid, gid = old.st_uid, old.st_gid
        if mode is None:
            mode = stat.S_IMODE(old.st_mode)
    except FileNotFoundError:
        pass
    if mode is None:
        mode = 0o644
    fd, temp = tempfile.mkstemp(prefix="." + name + ".", suffix=TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if uid is not None and (uid, gid) != (os.geteuid(), os.getegid()):
                _chown_quietly(handle.fileno(), uid, gid)
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        _remove_quietly(temp)
        raise
    fsync_dir(directory)


def is_temp_leftover(name: str) -> bool:
    """Whether a file name is one of atomic_write's temporary files (left behind by a crash)."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def _chown_quietly(fd: int, uid: int, gid: int) -> None:
    # Only root may give a file away; a non-root writer keeps its own ownership, as cp would.
    try:
        os.fchown(fd, uid, gid)
    except PermissionError:
        pass


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
