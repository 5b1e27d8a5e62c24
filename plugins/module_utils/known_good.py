# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Known-good snapshots of an SGLang unit: its unit file, drop-ins, environment file and SGLang sources.

Private to the llmops.inference collection; not a public API. Standard library only.

Layout under a store's root (one root per unit, every level mode 0700, every file 0600)::

    current/manifest.json    the last state whose probe gate passed
    current/files/<name>     copies of the unit file, environment file and dropins/<name>.conf
    previous/...             the snapshot ``current`` replaced
    objects/<sha256>         SGLang source file contents the snapshots need, named by their sha256
    sources-scan.json        (size, mtime, ctime, inode) -> sha256 of the installed sglang files: a cache
    reference.json           how the known-good build behaved: golden outputs and a performance fingerprint

A snapshot saved with ``sources`` records, in its manifest's ``sources``, every installed sglang file that
differs from the wheel's RECORD: its sha256 now (None: the file is missing) and the sha256 RECORD gives it
(None: a file the wheel does not have). The content of each such file is kept in ``objects/``, and so is the
wheel's original of each one, found in the sglang_patch backups, so that the snapshot can re-create its
sources from any other state, and return files it changed to the wheel's content.

Retention: the store keeps two snapshots. A save whose state differs from ``current`` makes it ``previous``
and drops the snapshot that was ``previous``; after every save, objects that neither snapshot names and
leftovers of an interrupted save are deleted. A rollback can target only ``current`` and ``previous``, so
nothing it can reach is ever pruned.

``save`` copies the live files into ``current`` after the gate passed. Saving the same files, patch state and
sources again only records the new verification time (and a snapshot saved before snapshots recorded their
sources gains them). A multi-node engine's members save with the id of their group restart
(``node_group_restart``), a new one each time, so every save of the group rotates on every member: ``current``
and ``previous`` then name the same two group restarts on all of them, and a rollback returns every rank to the
same one, also a rank whose own files did not change in between.

The reference (``reference.json``) is recorded by the reference gate (restart/reference_gate.py) with a known-good
save when there is none, and again only when an intended change is accepted; a rollback leaves it as it is, so
every later change is held to the same behaviour. It names the engine inputs it was recorded with
(:func:`inputs_of`: the unit's files and the SGLang sources).

``restore`` puts a snapshot's files back (drop-ins that the snapshot does not have are removed) after checking
every copy and object it holds against its checksum.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import (
    atomic_write,
    is_temp_leftover,
    read_bytes,
    sha256_bytes,
    sha256_file,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import (
    InstallError,
    SglangInstall,
    TargetPython,
    source_differences,
    subprocess_runner,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import (
    DEFAULT_ROOT,
    BackupError,
    BackupStore,
    applied_stack,
    expected_files,
)

SNAPSHOTS = ("current", "previous")
MANIFEST = "manifest.json"
FILES_DIR = "files"
OBJECTS_DIR = "objects"
SCAN_CACHE = "sources-scan.json"
REFERENCE = "reference.json"
STAGING_PREFIX = ".new."
DROPINS = "dropins/"
# Named files a snapshot may lack: restoring one that lacks it removes the file the other snapshot named.
OPTIONAL_FILES = ("adaptive_config",)
SOURCES_FORMAT = 1
# Snapshot entries whose content is compared to tell a new known-good state from the current one.
IDENTITY_KEYS = ("files", "patch_state_id", "node_group_restart")


class SnapshotError(Exception):
    pass


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def live_files(files: dict, dropin_dir: str) -> dict:
    """{snapshot name: {path, sha256, mode}} for the named files and the *.conf drop-ins of ``dropin_dir``."""
    entries = dict(files)
    if os.path.isdir(dropin_dir):
        for name in sorted(os.listdir(dropin_dir)):
            if name.endswith(".conf"):
                entries[DROPINS + name] = os.path.join(dropin_dir, name)
    found = {}
    for key, path in entries.items():
        if not os.path.isfile(path):
            raise SnapshotError(f"{path} does not exist; nothing known-good to record")
        found[key] = {"path": path, "sha256": sha256_file(path), "mode": oct(os.stat(path).st_mode & 0o7777)}
    return found


def sources_digest(files: dict) -> str:
    """The identity of a source state: a digest of its {path: {sha256, pristine}} map."""
    return sha256_bytes(json.dumps(files, sort_keys=True).encode())


def source_objects(sources: dict | None) -> set:
    """Every object a snapshot's ``sources`` names: the content of its files and the wheel's originals."""
    named = set()
    for entry in ((sources or {}).get("files") or {}).values():
        named.update(sha for sha in (entry.get("sha256"), entry.get("pristine")) if sha)
    return named


def inputs_of(manifest: dict | None) -> dict | None:
    """The engine inputs a manifest (or a reference) records: each file's sha256, the sources' digest and version."""
    if not manifest:
        return None
    sources = manifest.get("sources") or {}
    return {
        "files": {name: entry["sha256"] for name, entry in sorted((manifest.get("files") or {}).items())},
        "sources": sources.get("digest"),
        "sglang_version": sources.get("sglang_version"),
    }


def _dump(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _same_state(current: dict, manifest: dict) -> bool:
    if any(current.get(key) != manifest.get(key) for key in IDENTITY_KEYS):
        return False
    old, new = current.get("sources"), manifest.get("sources")
    # A snapshot saved without sources (by an older collection, or with no sglang to read) is not a different
    # state for lack of them; it gains them instead.
    return old is None or new is None or old.get("digest") == new.get("digest")


def _make_private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)


class KnownGoodStore:
    """The known-good snapshots of one unit, under ``root``.

    ``run_command(args, data=None) -> (rc, stdout, stderr)`` runs the engine's Python to locate sglang (a plain
    subprocess by default); ``backup_root`` is where the sglang_patch backups (the wheel's originals) are.
    """

    def __init__(self, root: str, run_command=None, backup_root: str = DEFAULT_ROOT):
        self.root = root
        self.run_command = run_command or subprocess_runner
        self.backup_root = backup_root

    def snapshot_dir(self, which: str) -> str:
        return os.path.join(self.root, which)

    def _object_path(self, sha256: str) -> str:
        return os.path.join(self.root, OBJECTS_DIR, sha256)

    # ----- reading -----

    def read(self, which: str) -> dict | None:
        return _read_json(os.path.join(self.snapshot_dir(which), MANIFEST), f"the {which} known-good manifest")

    def info(self) -> dict:
        return {which: self.read(which) for which in SNAPSHOTS}

    def manifest(self, which: str) -> dict:
        """The manifest of snapshot ``which``; SnapshotError naming the ones there are when it does not exist."""
        manifest = self.read(which) if which in SNAPSHOTS else None
        if manifest is None:
            available = [name for name in SNAPSHOTS if self.read(name) is not None]
            raise SnapshotError(
                f"no known-good snapshot {which!r} under {self.root}; available: {', '.join(available) or 'none'}"
            )
        return manifest

    def object(self, sha256: str) -> bytes | None:
        """The stored content with this sha256, checked; None when it is missing or does not match."""
        data = read_bytes(self._object_path(sha256)) if sha256 else None
        return data if data is not None and sha256_bytes(data) == sha256 else None

    def problems(self, which: str) -> list:
        """Every reason snapshot ``which`` cannot be restored: copies and objects missing or not matching."""
        manifest = self.manifest(which)
        found = []
        for key, entry in sorted(manifest["files"].items()):
            copy = os.path.join(self.snapshot_dir(which), FILES_DIR, key)
            actual = sha256_file(copy)
            if actual != entry["sha256"]:
                state = "is missing" if actual is None else f"does not match its checksum (sha256 {actual})"
                found.append(f"the copy of {entry['path']} ({copy}) {state}; the manifest says {entry['sha256']}")
        return found + self.source_problems(which)

    def source_problems(self, which: str) -> list:
        """Every source file of snapshot ``which`` whose stored content is missing or does not match."""
        found = []
        for rel, entry in sorted(((self.manifest(which).get("sources") or {}).get("files") or {}).items()):
            sha = entry.get("sha256")
            if sha and self.object(sha) is None:
                state = "is missing" if read_bytes(self._object_path(sha)) is None else "does not match its checksum"
                found.append(f"the stored content of {rel} ({self._object_path(sha)}) {state}")
        return found

    # ----- the reference -----

    def read_reference(self) -> dict | None:
        return _read_json(os.path.join(self.root, REFERENCE), "the reference")

    def write_reference(self, reference: dict) -> str:
        """Record ``reference`` (replacing the one there was); returns its path."""
        _make_private_dir(self.root)
        path = os.path.join(self.root, REFERENCE)
        atomic_write(path, _dump(reference), mode=0o600)
        return path

    def live_inputs(self, files: dict, dropin_dir: str, python: str | None) -> dict:
        """The engine inputs on the host now, in :func:`inputs_of`'s shape (sources None when not readable)."""
        manifest = {"files": live_files(files, dropin_dir)}
        if python:
            try:
                manifest["sources"] = self.record_sources(python, check_mode=True)[0]
            except (InstallError, SnapshotError):
                manifest["sources"] = None
        return inputs_of(manifest)

    # ----- the sources -----

    def locate(self, python: str) -> SglangInstall:
        return TargetPython(self.run_command, python).locate()

    def scan(self, install: SglangInstall, check_mode: bool = False) -> dict:
        """sglang_install.source_differences, with the hashes of unchanged files kept in the store's cache."""
        path = os.path.join(self.root, SCAN_CACHE)
        try:
            kept = json.loads(read_bytes(path) or b"{}")
        except ValueError:
            kept = {}
        cache = kept.get("files", {}) if kept.get("base_dir") == install.base_dir else {}
        before = json.dumps(cache, sort_keys=True)
        found = source_differences(install, cache)
        if not check_mode and json.dumps(cache, sort_keys=True) != before:
            _make_private_dir(self.root)
            atomic_write(path, json.dumps({"base_dir": install.base_dir, "files": cache}).encode(), mode=0o600)
        return found

    def record_sources(self, python: str, check_mode: bool = False) -> tuple:
        """(the ``sources`` entry of a manifest, {sha256: content} to keep as objects) for sglang of ``python``."""
        install = self.locate(python)
        differences = self.scan(install, check_mode)
        blobs, unavailable = {}, []
        backups = BackupStore(self.backup_root)
        for rel, entry in sorted(differences.items()):
            if entry["sha256"]:
                data = read_bytes(os.path.join(install.base_dir, rel))
                if data is None or sha256_bytes(data) != entry["sha256"]:
                    raise SnapshotError(f"{rel} changed while it was being saved; run the restart chain again")
                blobs[entry["sha256"]] = data
            pristine = entry["pristine"]
            if pristine and pristine not in blobs and self.object(pristine) is None:
                data = self._backed_up(backups, pristine)
                if data is None:
                    unavailable.append(rel)
                else:
                    blobs[pristine] = data
        state_id, applied_sets = self._recorded_patch_state(backups, install, differences)
        sources = {
            "format": SOURCES_FORMAT,
            "python": python,
            "sglang_version": install.version,
            "package_dir": install.package_dir,
            "base_dir": install.base_dir,
            "files": differences,
            "digest": sources_digest(differences),
            "state_id": state_id,
            "applied_sets": applied_sets,
            # Files whose wheel original no backup holds: leaving this state returns them only if another
            # snapshot or a backup has the original by then.
            "pristine_unavailable": unavailable,
        }
        return sources, blobs

    @staticmethod
    def _backed_up(backups: BackupStore, sha256: str) -> bytes | None:
        try:
            return backups.find_original(sha256)
        except BackupError:
            return None

    @staticmethod
    def _recorded_patch_state(backups: BackupStore, install: SglangInstall, differences: dict) -> tuple:
        """The sglang_patch state id and applied sets the backups record, when the files agree with them."""
        try:
            stack = applied_stack(backups.manifests(), install.package_dir, install.version)
        except BackupError:
            return None, []
        expected = expected_files(stack)
        if any(rel not in expected for rel in differences):
            return None, []  # changed by hand as well
        for rel, sha in expected.items():
            if rel in differences:
                actual = differences[rel]["sha256"]
            else:
                actual = sha256_file(os.path.join(install.base_dir, rel))
            if actual != sha:
                return None, []
        if not stack:
            return ("pristine", []) if not differences else (None, [])
        return stack[-1].state_id_after, list(stack[-1].applied_sets_after)

    def sources_status(self, which: str, install: SglangInstall) -> dict:
        """What the live sources need to match snapshot ``which``: the files that differ from it now."""
        sources = self.manifest(which).get("sources")
        if not sources:
            return {"recorded": False, "differ": [], "installation": None}
        same_dir = os.path.realpath(sources["package_dir"]) == os.path.realpath(install.package_dir)
        if not same_dir or sources["sglang_version"] != install.version:
            mismatch = (
                f"sglang {install.version} at {install.package_dir} is installed; the snapshot recorded "
                f"sglang {sources['sglang_version']} at {sources['package_dir']}"
            )
            return {"recorded": True, "differ": sorted(sources["files"]), "installation": mismatch}
        want = sources["files"]
        now = self.scan(install, check_mode=True)
        differ = sorted(
            rel
            for rel in set(want) | set(now)
            if (want[rel]["sha256"] if rel in want else now[rel]["pristine"])
            != (now[rel]["sha256"] if rel in now else want[rel]["pristine"])
        )
        return {"recorded": True, "differ": differ, "installation": None}

    # ----- changing the store -----

    def save(
        self, files: dict, dropin_dir: str, meta: dict, check_mode: bool = False, sources: dict | None = None
    ) -> dict:
        """Record the live ``files`` ({name: path}, e.g. unit and environment) and drop-ins as ``current``.

        ``sources`` ({"python": the engine's interpreter}, optionally "backup_root") names the SGLang
        installation whose source state the snapshot records, so that it can be re-created; None records the
        unit's files only. When sglang cannot be read there, the snapshot is saved without its sources and
        ``warnings`` says why.
        """
        live = live_files(files, dropin_dir)
        manifest = dict(meta, files=live, saved_at=now_iso())
        manifest["verified_at"] = manifest["saved_at"]
        blobs, warnings = {}, []
        if sources:
            if sources.get("backup_root"):
                self.backup_root = sources["backup_root"]
            try:
                manifest["sources"], blobs = self.record_sources(sources["python"], check_mode)
            except InstallError as exc:
                warnings.append(f"the snapshot does not record the SGLang sources: {exc}")
        current = self.read("current")
        if current is not None and _same_state(current, manifest):
            answer = self._reverify(current, manifest, blobs, check_mode)
        elif check_mode:
            answer = self._answer(True, current is not None, manifest, "would save a snapshot", [])
        else:
            self._write_snapshot(live, manifest, blobs, rotate=current is not None)
            answer = self._answer(True, current is not None, manifest, "snapshot saved", self.prune())
        answer["warnings"] = warnings
        return answer

    def _reverify(self, current: dict, manifest: dict, blobs: dict, check_mode: bool) -> dict:
        """The current snapshot already records this state: mark it verified now (adding its sources if it had
        none)."""
        gains_sources = current.get("sources") is None and manifest.get("sources") is not None
        if gains_sources:
            current["sources"] = manifest["sources"]
        current["verified_at"] = manifest["verified_at"]
        if not check_mode:
            self._write_objects(blobs, source_objects(current.get("sources")))
            atomic_write(os.path.join(self.snapshot_dir("current"), MANIFEST), _dump(current), mode=0o600)
        pruned = self.prune(check_mode)
        message = "current snapshot re-verified" + ("; it records its sources now" if gains_sources else "")
        return self._answer(gains_sources, False, current, message, pruned)

    def _write_snapshot(self, live: dict, manifest: dict, blobs: dict, rotate: bool) -> None:
        """Write the snapshot beside the others, then make it ``current`` (the current one ``previous`` when
        ``rotate``)."""
        _make_private_dir(self.root)
        self._write_objects(blobs, source_objects(manifest.get("sources")))
        staging = tempfile.mkdtemp(dir=self.root, prefix=STAGING_PREFIX)
        try:
            for key, entry in live.items():
                target = os.path.join(staging, FILES_DIR, key)
                _make_private_dir(os.path.dirname(target))
                data = read_bytes(entry["path"])
                if data is None or sha256_bytes(data) != entry["sha256"]:
                    raise SnapshotError(
                        f"{entry['path']} changed while it was being saved; run the restart chain again"
                    )
                atomic_write(target, data, mode=0o600)
            atomic_write(os.path.join(staging, MANIFEST), _dump(manifest), mode=0o600)
            if rotate:
                shutil.rmtree(self.snapshot_dir("previous"), ignore_errors=True)
                os.replace(self.snapshot_dir("current"), self.snapshot_dir("previous"))
            os.replace(staging, self.snapshot_dir("current"))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @staticmethod
    def _answer(changed: bool, rotated: bool, manifest: dict, message: str, pruned: list) -> dict:
        return {"changed": changed, "rotated": rotated, "manifest": manifest, "msg": message, "pruned": pruned}

    def _write_objects(self, blobs: dict, named: set) -> None:
        """Store every content the snapshot names and does not have yet (an object that does not match is
        replaced)."""
        for sha in sorted(named):
            data = blobs.get(sha)
            if data is None or self.object(sha) is not None:
                continue
            _make_private_dir(os.path.join(self.root, OBJECTS_DIR))
            atomic_write(self._object_path(sha), data, mode=0o600)

    def prune(self, check_mode: bool = False) -> list:
        """Delete objects neither snapshot names and leftovers of interrupted saves; returns what went."""
        if not os.path.isdir(self.root):
            return []
        named = set()
        for which in SNAPSHOTS:
            named |= source_objects((self.read(which) or {}).get("sources"))
        removed = []
        objects = os.path.join(self.root, OBJECTS_DIR)
        for name in sorted(os.listdir(objects)) if os.path.isdir(objects) else []:
            if name not in named or is_temp_leftover(name):
                removed.append(f"{OBJECTS_DIR}/{name}")
                if not check_mode:
                    os.unlink(os.path.join(objects, name))
        for name in sorted(os.listdir(self.root)):
            if name.startswith(STAGING_PREFIX):
                removed.append(name)
                if not check_mode:
                    shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        return removed

    def _optional_files_gone(self, which: str, manifest: dict) -> list:
        """Files that the other snapshot names and ``which`` does not (an adaptive config added since): a restore of
        ``which`` removes them."""
        named = {entry["path"] for key, entry in manifest["files"].items() if not key.startswith(DROPINS)}
        other = self.read("previous" if which == "current" else "current") or {}
        return [
            entry["path"]
            for key, entry in sorted((other.get("files") or {}).items())
            if key in OPTIONAL_FILES and entry.get("path") not in named and os.path.isfile(entry.get("path") or "")
        ]

    def restore(self, which: str, dropin_dir: str, check_mode: bool = False) -> dict:
        """Put the files of snapshot ``which`` back; remove drop-ins the snapshot does not have.

        Every copy and source object of the snapshot is checked first: a snapshot that cannot be restored
        whole is refused before anything changes, naming what is missing or damaged.
        """
        manifest = self.manifest(which)
        problems = self.problems(which)
        if problems:
            raise SnapshotError(
                f"the {which} known-good snapshot of {manifest.get('saved_at')} under {self.root} cannot be "
                f"restored: {'; '.join(problems)}. Nothing was changed"
            )
        restored = []
        for key, entry in sorted(manifest["files"].items()):
            path = entry["path"]
            if sha256_file(path) == entry["sha256"]:
                continue
            restored.append(path)
            if not check_mode:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                data = read_bytes(os.path.join(self.snapshot_dir(which), FILES_DIR, key))
                atomic_write(path, data, mode=int(entry["mode"], 8))
        kept = {entry["path"] for key, entry in manifest["files"].items() if key.startswith(DROPINS)}
        removed = self._optional_files_gone(which, manifest)
        if os.path.isdir(dropin_dir):
            for name in sorted(os.listdir(dropin_dir)):
                path = os.path.join(dropin_dir, name)
                if name.endswith(".conf") and path not in kept:
                    removed.append(path)
        if not check_mode:
            for path in removed:
                os.unlink(path)
        return {
            "changed": bool(restored or removed),
            "restored": restored,
            "removed": removed,
            "manifest": manifest,
            "msg": f"{which} snapshot of {manifest.get('saved_at')}: {len(restored)} restored, {len(removed)} removed",
        }


def _read_json(path: str, what: str) -> dict | None:
    """The JSON document at ``path``; None when there is none; SnapshotError naming ``what`` when unreadable."""
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError as exc:
        raise SnapshotError(f"{what} {path} is unreadable: {exc}") from exc
