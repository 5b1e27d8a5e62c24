# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Known-good snapshots of an SGLang unit: its unit file, drop-ins and environment file, with checksums.

Private to the llmops.inference collection; not a public API. Standard library only.

Layout under a store's root (one root per unit, mode 0700)::

    current/manifest.json    the last state whose probe gate passed
    current/files/<name>     copies of the unit file, environment file and dropins/<name>.conf
    previous/...             the snapshot ``current`` replaced

``save`` copies the live files into ``current`` after the gate passed; the snapshot it replaces becomes
``previous``. Saving the same files and patch state again only records the new verification time.
``restore`` puts a snapshot's files back (drop-ins that the snapshot does not have are removed).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import (
    atomic_write,
    read_bytes,
    sha256_file,
)

SNAPSHOTS = ("current", "previous")
MANIFEST = "manifest.json"
FILES_DIR = "files"
DROPINS = "dropins/"
# Snapshot entries whose content is compared to tell a new known-good state from the current one.
IDENTITY_KEYS = ("files", "patch_state_id")


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


def _dump(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


class KnownGoodStore:
    """The known-good snapshots of one unit, under ``root``."""

    def __init__(self, root: str):
        self.root = root

    def _dir(self, which: str) -> str:
        return os.path.join(self.root, which)

    def read(self, which: str) -> dict | None:
        data = read_bytes(os.path.join(self._dir(which), MANIFEST))
        return None if data is None else json.loads(data)

    def info(self) -> dict:
        return {which: self.read(which) for which in SNAPSHOTS}

    def save(
        self, files: dict, dropin_dir: str, meta: dict, check_mode: bool = False, sources: dict | None = None
    ) -> dict:
        """Record the live ``files`` ({name: path}, e.g. unit and environment) and drop-ins as ``current``.

        ``sources`` ({"python": the engine's interpreter}) names the SGLang installation whose source state the
        snapshot must be able to re-create; None records the unit's files only.
        """
        live = live_files(files, dropin_dir)
        manifest = dict(meta, files=live, saved_at=now_iso())
        manifest["verified_at"] = manifest["saved_at"]
        current = self.read("current")
        if current is not None and all(current.get(key) == manifest.get(key) for key in IDENTITY_KEYS):
            current["verified_at"] = manifest["verified_at"]
            if not check_mode:
                atomic_write(os.path.join(self._dir("current"), MANIFEST), _dump(current), mode=0o600)
            return {"changed": False, "rotated": False, "manifest": current, "msg": "current snapshot re-verified"}
        if check_mode:
            return {
                "changed": True,
                "rotated": current is not None,
                "manifest": manifest,
                "msg": "would save a snapshot",
            }

        os.makedirs(self.root, mode=0o700, exist_ok=True)
        staging = tempfile.mkdtemp(dir=self.root, prefix=".new.")
        try:
            for key, entry in live.items():
                target = os.path.join(staging, FILES_DIR, key)
                os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
                shutil.copy2(entry["path"], target)
                if sha256_file(target) != entry["sha256"]:
                    raise SnapshotError(
                        f"{entry['path']} changed while it was being saved; run the restart chain again"
                    )
            atomic_write(os.path.join(staging, MANIFEST), _dump(manifest), mode=0o600)
            if current is not None:
                shutil.rmtree(self._dir("previous"), ignore_errors=True)
                os.replace(self._dir("current"), self._dir("previous"))
            os.replace(staging, self._dir("current"))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return {"changed": True, "rotated": current is not None, "manifest": manifest, "msg": "snapshot saved"}

    def restore(self, which: str, dropin_dir: str, check_mode: bool = False) -> dict:
        """Put the files of snapshot ``which`` back; remove drop-ins the snapshot does not have."""
        manifest = self.read(which)
        if manifest is None:
            available = [name for name in SNAPSHOTS if self.read(name) is not None]
            raise SnapshotError(
                f"no known-good snapshot {which!r} under {self.root}; available: {', '.join(available) or 'none'}"
            )
        restored, removed = [], []
        for key, entry in sorted(manifest["files"].items()):
            path = entry["path"]
            if sha256_file(path) == entry["sha256"]:
                continue
            restored.append(path)
            if not check_mode:
                saved = os.path.join(self._dir(which), FILES_DIR, key)
                data = read_bytes(saved)
                if data is None or sha256_file(saved) != entry["sha256"]:
                    raise SnapshotError(
                        f"the {which} snapshot's copy of {path} is missing or does not match its checksum"
                    )
                os.makedirs(os.path.dirname(path), exist_ok=True)
                atomic_write(path, data, mode=int(entry["mode"], 8))
        kept = {entry["path"] for key, entry in manifest["files"].items() if key.startswith(DROPINS)}
        if os.path.isdir(dropin_dir):
            for name in sorted(os.listdir(dropin_dir)):
                path = os.path.join(dropin_dir, name)
                if name.endswith(".conf") and path not in kept:
                    removed.append(path)
                    if not check_mode:
                        os.unlink(path)
        return {
            "changed": bool(restored or removed),
            "restored": restored,
            "removed": removed,
            "manifest": manifest,
            "msg": f"{which} snapshot of {manifest.get('saved_at')}: {len(restored)} restored, {len(removed)} removed",
        }
