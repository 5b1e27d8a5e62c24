# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Backups of the package files a patch set touches: layout, manifest, integrity, lock.

Private to the llmops.inference collection; not a public API. Standard library only.

A backup is a directory ``<root>/<UTC timestamp>-<patch set name>/`` (mode 0700) holding the
original files under ``files/<path>`` and ``manifest.json``. It is assembled under a hidden
``.partial-`` name and renamed into place once the originals and the manifest are on disk, so a
backup directory with a manifest is always complete. The manifest moves through the states
``pending`` (written before any package file changes) -> ``applied`` -> ``restoring`` ->
``restored``; a ``pending`` or ``restoring`` manifest found later marks an interrupted run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import (
    atomic_write,
    fsync_dir,
    read_bytes,
    sha256_bytes,
)

FORMAT = 1
# Where the sglang_patch role and the source_patch module keep the backups unless told otherwise.
DEFAULT_ROOT = "/var/lib/llmops/sglang-backups"
MANIFEST = "manifest.json"
FILES = "files"
LOCK = ".lock"
PARTIAL_PREFIX = ".partial-"
PENDING, APPLIED, RESTORING, RESTORED = "pending", "applied", "restoring", "restored"
INTERRUPTED = (PENDING, RESTORING)
PRISTINE = "pristine"
LATEST = "latest"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
LOCK_POLL_INTERVAL = 0.1


class BackupError(Exception):
    """A backup that cannot be used as asked."""


class BackupIntegrityError(BackupError):
    """A backup whose originals are missing or do not match the manifest's checksums."""


class UnknownBackupError(BackupError):
    pass


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        raise ValueError(
            f"patch set name {name!r} is not accepted: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def state_id(sglang_version: str, patch_sets: list) -> str:
    """Stable id of the sources: 'pristine', or a hash of the sglang version and the applied sets' checksums."""
    if not patch_sets:
        return PRISTINE
    payload = json.dumps({"sglang": sglang_version, "patch_sets": [s["checksum"] for s in patch_sets]}, sort_keys=True)
    return sha256_bytes(payload.encode())[:16]


def belongs_to(manifest: Manifest, package_dir: str, sglang_version: str) -> bool:
    """Whether a backup was taken of this installation (same package directory and sglang version)."""
    same_dir = os.path.realpath(manifest.package_dir) == os.path.realpath(package_dir)
    return same_dir and manifest.sglang_version == sglang_version


def applied_stack(manifests: list, package_dir: str, sglang_version: str) -> list:
    """The applied backups of one installation, oldest first: the top one's state_id_after is its patch state."""
    return [m for m in manifests if m.state == APPLIED and belongs_to(m, package_dir, sglang_version)]


def expected_files(stack: list) -> dict:
    """{path: sha256 or None} that the applied backups say the files have now (the newest record wins)."""
    expected = {}
    for manifest in stack:
        for record in manifest.files:
            expected[record.path] = record.sha256_after
    return expected


def utc_now(clock=time.time) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock()))


@dataclass
class FileRecord:
    path: str
    existed_before: bool
    sha256_before: str | None
    mode_before: int | None
    exists_after: bool
    sha256_after: str | None

    def to_dict(self) -> dict:
        data = dict(self.__dict__)
        data["mode_before"] = None if self.mode_before is None else f"{self.mode_before:04o}"
        return data

    @classmethod
    def from_dict(cls, data: dict) -> FileRecord:
        mode = data.get("mode_before")
        return cls(
            path=data["path"],
            existed_before=bool(data["existed_before"]),
            sha256_before=data.get("sha256_before"),
            mode_before=None if mode is None else int(mode, 8),
            exists_after=bool(data["exists_after"]),
            sha256_after=data.get("sha256_after"),
        )


# The manifest's fields a backup listing shows (with the paths of its files).
SUMMARY_KEYS = (
    "backup_id", "name", "state", "created", "sglang_version", "package_dir", "state_id_before", "state_id_after",
    "adopted",
)  # fmt: skip


@dataclass
class Manifest:
    backup_id: str
    sequence: int
    name: str
    state: str
    sglang_version: str
    package_dir: str
    base_dir: str
    patch_set: dict
    exclusive: bool
    state_id_before: str
    state_id_after: str
    applied_sets_before: list
    applied_sets_after: list
    files: list = field(default_factory=list)
    created_dirs: list = field(default_factory=list)
    adopted: bool = False
    history: list = field(default_factory=list)

    def set_state(self, state: str, note: str = "", clock=time.time) -> None:
        self.state = state
        entry = {"state": state, "at": utc_now(clock)}
        if note:
            entry["note"] = note
        self.history.append(entry)

    @property
    def created(self) -> str:
        return self.history[0]["at"] if self.history else ""

    def to_dict(self) -> dict:
        data = {key: value for key, value in self.__dict__.items() if key != "files"}
        data["format"] = FORMAT
        data["files"] = [record.to_dict() for record in self.files]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        values = {key: data[key] for key in cls.__dataclass_fields__ if key in data and key != "files"}
        values["files"] = [FileRecord.from_dict(item) for item in data.get("files", [])]
        return cls(**values)

    def summary(self) -> dict:
        """What a listing shows of the backup: its identity, states and the paths of its files."""
        summary = {key: getattr(self, key) for key in SUMMARY_KEYS}
        summary["files"] = [record.path for record in self.files]
        return summary


class BackupStore:
    """The backup directories under ``root``."""

    def __init__(self, root: str, clock=time.time):
        self.root = root
        self.clock = clock

    def exists(self) -> bool:
        return os.path.isdir(self.root)

    def ensure_root(self) -> None:
        parent = os.path.dirname(self.root.rstrip("/"))
        if parent:
            os.makedirs(parent, 0o755, exist_ok=True)
        if not os.path.isdir(self.root):
            os.mkdir(self.root, 0o700)
        os.chmod(self.root, 0o700)

    @contextlib.contextmanager
    def lock(self, timeout: float):
        """Exclusive lock over the store, so two runs on one host never interleave."""
        self.ensure_root()
        fd = os.open(os.path.join(self.root, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise BackupError(
                            f"another run holds the lock {os.path.join(self.root, LOCK)}; "
                            f"gave up after {timeout} s (lock_timeout)"
                        ) from None
                    time.sleep(LOCK_POLL_INTERVAL)
            yield
        finally:
            os.close(fd)

    def manifests(self) -> list:
        """Every complete backup, oldest first."""
        if not self.exists():
            return []
        found = []
        for entry in os.listdir(self.root):
            path = os.path.join(self.root, entry, MANIFEST)
            if entry.startswith(".") or not os.path.isfile(path):
                continue
            found.append(self._read_manifest(entry, path))
        return sorted(found, key=lambda manifest: manifest.sequence)

    def load(self, backup_id: str) -> Manifest:
        path = os.path.join(self.root, backup_id, MANIFEST)
        if "/" in backup_id or backup_id.startswith(".") or not os.path.isfile(path):
            available = [manifest.backup_id for manifest in self.manifests()]
            raise UnknownBackupError(
                "backup id {!r} not found in {}; available: {} (or {!r} for the newest)".format(
                    backup_id, self.root, ", ".join(available) or "none", LATEST
                )
            )
        return self._read_manifest(backup_id, path)

    def new_id(self, name: str, existing: list) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        taken = set(existing)
        candidate = f"{stamp}-{name}"
        suffix = 2
        while candidate in taken or os.path.exists(os.path.join(self.root, candidate)):
            candidate = f"{stamp}-{name}-{suffix}"
            suffix += 1
        return candidate

    def create(self, manifest: Manifest, originals: dict) -> None:
        """Write the originals and the manifest, then make the backup visible in one rename."""
        self.ensure_root()
        self.remove_partials()
        staging = os.path.join(self.root, PARTIAL_PREFIX + manifest.backup_id)
        os.mkdir(staging, 0o700)
        for rel, data in sorted(originals.items()):
            target = os.path.join(staging, FILES, rel)
            _make_private_dirs(staging, os.path.dirname(target))
            atomic_write(target, data, 0o600)
        atomic_write(os.path.join(staging, MANIFEST), self._encode(manifest), 0o600)
        os.rename(staging, os.path.join(self.root, manifest.backup_id))
        fsync_dir(self.root)

    def save(self, manifest: Manifest) -> None:
        atomic_write(os.path.join(self.root, manifest.backup_id, MANIFEST), self._encode(manifest), 0o600)

    def remove_partials(self) -> list:
        """Remove backups a crash left half-assembled; no manifest ever pointed at them."""
        if not self.exists():
            return []
        removed = []
        for entry in os.listdir(self.root):
            if entry.startswith(PARTIAL_PREFIX):
                shutil.rmtree(os.path.join(self.root, entry))
                removed.append(entry)
        return removed

    def original(self, manifest: Manifest, record: FileRecord) -> bytes | None:
        """The backed-up original of one file (None: it did not exist), checked against the manifest."""
        if not record.existed_before:
            return None
        data = read_bytes(os.path.join(self.root, manifest.backup_id, FILES, record.path))
        if data is None:
            raise BackupIntegrityError(
                f"backup {manifest.backup_id} is incomplete: the original of {record.path} is missing"
            )
        if sha256_bytes(data) != record.sha256_before:
            raise BackupIntegrityError(
                f"backup {manifest.backup_id} is damaged: the original of {record.path} has sha256 "
                f"{sha256_bytes(data)}, the manifest says {record.sha256_before}"
            )
        return data

    def find_original(self, sha256: str) -> bytes | None:
        """Any backed-up original whose content has this sha256 (checked), or None when no backup holds one."""
        for manifest in reversed(self.manifests()):
            for record in manifest.files:
                if record.existed_before and record.sha256_before == sha256:
                    data = read_bytes(os.path.join(self.root, manifest.backup_id, FILES, record.path))
                    if data is not None and sha256_bytes(data) == sha256:
                        return data
        return None

    def digest(self) -> str:
        """A digest of every backup's manifest: any apply, restore or interrupted run since changes it."""
        digest = hashlib.sha256()
        try:
            names = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        except FileNotFoundError:
            names = []
        for name in names:
            data = read_bytes(os.path.join(self.root, name, MANIFEST))
            digest.update(json.dumps([name, None if data is None else sha256_bytes(data)]).encode())
        return digest.hexdigest()

    def problems(self, manifest: Manifest) -> list:
        """Every reason the originals of ``manifest`` cannot be restored (empty when they can)."""
        found = []
        for record in manifest.files:
            try:
                self.original(manifest, record)
            except BackupIntegrityError as exc:
                found.append(str(exc))
        return found

    def _encode(self, manifest: Manifest) -> bytes:
        return (json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n").encode()

    def _read_manifest(self, backup_id: str, path: str) -> Manifest:
        try:
            with open(path, "rb") as handle:
                data = json.loads(handle.read().decode())
            manifest = Manifest.from_dict(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise BackupError(f"backup {backup_id} has an unreadable manifest {path}: {exc}") from exc
        if manifest.backup_id != backup_id:
            raise BackupError(f"backup directory {backup_id} holds the manifest of {manifest.backup_id}")
        return manifest


def _make_private_dirs(top: str, directory: str) -> None:
    """Create ``directory`` below ``top``, every level mode 0700 (os.makedirs gives only the leaf its mode)."""
    missing = []
    while directory != top and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        os.mkdir(path, 0o700)
