# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One source_patch request, from module parameters to result: read inputs, locate sglang, lock, act.

Private to the llmops.inference collection; not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import os

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import read_bytes
from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore, SnapshotError
from ansible_collections.llmops.inference.plugins.module_utils.patchset import PatchError
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import InstallError, TargetPython
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import BackupError, BackupStore
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_inputs import (
    PatchSetInput,
    SourcePatchError,
    SourceTarget,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_patcher import SourcePatcher
from ansible_collections.llmops.inference.plugins.module_utils.source_tree import PathSafetyError, SourceTree

APPLIED, RESTORED, VERIFIED = "applied", "restored", "verified"
# Every error a request can end with; each message names the input at fault.
REQUEST_ERRORS = (PatchError, PathSafetyError, BackupError, InstallError, SourcePatchError, SnapshotError, ValueError)
UNKNOWN_STATE = "unknown"


def _read_input(path: str, what: str) -> bytes:
    data = read_bytes(path) if os.path.isfile(path) else None
    if data is None:
        raise SourcePatchError(f"{what} {path} does not exist on the host (or is not a regular file)")
    return data


def read_patch_set(name: str, patches: list, replacements: list) -> PatchSetInput:
    """The patch set from files on the host; refuses a missing file before anything else happens."""
    if not name:
        raise SourcePatchError("name is required with state=applied: the patch set's name, used in backup ids")
    diffs = [(os.path.basename(path), _read_input(path, "patch file")) for path in patches or []]
    files = [
        (item["dest"], os.path.basename(item["src"]), _read_input(item["src"], "replacement source"))
        for item in replacements or []
    ]
    return PatchSetInput(name, diffs, files)


def restore_known_good(patcher: SourcePatcher, store: KnownGoodStore, which: str, check_mode: bool) -> dict:
    """Return the sources to what known-good snapshot ``which`` recorded: its file set when it has one (every
    object checked first), else its patch state through the backups."""
    manifest = store.manifest(which)
    label = f"the {which} known-good snapshot (saved {manifest.get('saved_at')})"
    sources = manifest.get("sources")
    if not sources:
        state = manifest.get("patch_state_id") or UNKNOWN_STATE
        if state == UNKNOWN_STATE:
            raise SourcePatchError(
                f"{label} under {store.root} records neither its SGLang sources nor their patch state; "
                "nothing was changed"
            )
        return patcher.restore(target_state_id=state)
    problems = store.source_problems(which)
    if problems:
        raise SourcePatchError(f"cannot re-create {label}: {'; '.join(problems)}; nothing was changed")
    target = SourceTarget(
        label=label,
        name=f"known-good-{which}",
        files=sources["files"],
        state_id=sources.get("state_id") or manifest.get("patch_state_id"),
        applied_sets=sources.get("applied_sets") or [],
        sglang_version=sources["sglang_version"],
        package_dir=sources["package_dir"],
        content=store.object,
    )
    return patcher.reach(target, lambda: store.scan(patcher.install, check_mode))


def run(params: dict, run_command, check_mode: bool) -> tuple:
    """Carry out one request; returns (result, diff text, warnings). Raises one of REQUEST_ERRORS."""
    state = params["state"]
    patch_set = None
    if state == APPLIED:
        patch_set = read_patch_set(params["name"], params.get("patches"), params.get("replacements"))
    python = TargetPython(run_command, params["python"])
    install = python.locate()
    store = BackupStore(params["backup_root"])
    tree = SourceTree(install.base_dir, install.package_dir)
    # Runs that only read (verify, check mode) do not create the backup directory just to lock it.
    writes = state != VERIFIED and not check_mode
    locking = store.lock(params["lock_timeout"]) if store.exists() or writes else contextlib.nullcontext()
    with locking:
        patcher = SourcePatcher(install, store, tree, python, check_mode=check_mode)
        try:
            if state == APPLIED:
                result = patcher.apply(patch_set, params["exclusive"], params["compile_check"])
            elif state == RESTORED and params.get("known_good_snapshot"):
                store = KnownGoodStore(params["known_good_root"], run_command, params["backup_root"])
                result = restore_known_good(patcher, store, params["known_good_snapshot"], check_mode)
            elif state == RESTORED:
                result = patcher.restore(params.get("backup_id"), params.get("target_state_id"))
            else:
                result = patcher.verify()
        except REQUEST_ERRORS as exc:
            # Rolling back an interrupted run may have changed files before the request failed.
            exc.changed = bool(patcher.recovered)
            raise
    return result, patcher.diff(), patcher.warnings
