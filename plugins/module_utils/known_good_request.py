# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One known_good module request (read, save or restore the known-good snapshots), from its parameters to its
result.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

import os

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import read_bytes
from ansible_collections.llmops.inference.plugins.module_utils.known_good import (
    DROPINS,
    FILES_DIR,
    SNAPSHOTS,
    KnownGoodStore,
    SnapshotError,
)

READ, RESTORED, SAVED = "read", "restored", "saved"
HIDDEN = "(not shown: the environment file can hold the API key)\n"


def _text(path: str) -> str:
    return (read_bytes(path) or b"").decode("utf-8", "replace")


def restore_with_diff(store: KnownGoodStore, which: str, dropin_dir: str, check_mode: bool) -> dict:
    """``store.restore`` with a ``diff`` list: the unit file and drop-ins before and after; the environment file
    by name only."""
    files = store.manifest(which)["files"]
    shown = {entry["path"]: key for key, entry in files.items() if key == "unit" or key.startswith(DROPINS)}
    present = [os.path.join(dropin_dir, name) for name in os.listdir(dropin_dir)] if os.path.isdir(dropin_dir) else []
    before = {path: _text(path) for path in [*shown, *present]}
    answer = store.restore(which, dropin_dir, check_mode)
    diff = []
    for path in answer["restored"]:
        if path in shown:
            after = _text(os.path.join(store.snapshot_dir(which), FILES_DIR, shown[path]))
            diff.append({"before_header": path, "after_header": path, "before": before[path], "after": after})
        else:
            diff.append({"before_header": path, "after_header": path, "before": HIDDEN, "after": "(restored)\n"})
    for path in answer["removed"]:
        diff.append({"before_header": path, "after_header": f"{path} (removed)", "before": before[path], "after": ""})
    answer["diff"] = diff
    return answer


def handle(params: dict, run_command, check_mode: bool) -> dict:
    """One known_good module request, from its parameters to its result; raises SnapshotError or InstallError."""
    store = KnownGoodStore(params["root"], run_command, params["backup_root"])
    if params["state"] == READ:
        snapshots = store.info()
        found = [which for which in SNAPSHOTS if snapshots[which]]
        return dict(snapshots, changed=False, msg=f"snapshots under {store.root}: {', '.join(found) or 'none'}")
    python = params.get("python")
    if params["state"] == SAVED:
        if not params["files"]:
            raise SnapshotError("files must name the files to record, at least {unit: PATH}")
        sources = {"python": python} if python else None
        return store.save(params["files"], params["dropin_dir"], params["meta"], check_mode, sources)
    which = params["snapshot"]
    answer = restore_with_diff(store, which, params["dropin_dir"], check_mode)
    sources = answer["manifest"].get("sources") or {}
    answer["sources"] = {
        "recorded": bool(sources),
        "patch_state_id": answer["manifest"].get("patch_state_id"),
        "state_id": sources.get("state_id"),
        "files": sorted(sources.get("files") or {}),
        "python": sources.get("python"),
        "source_patch": {"state": "restored", "known_good_root": store.root, "known_good_snapshot": which},
    }
    if python and sources:
        answer["sources"].update(store.sources_status(which, store.locate(python)))
    return answer
