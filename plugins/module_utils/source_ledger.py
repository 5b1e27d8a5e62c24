# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The transactions of source_patch on an installed sglang: backups written before any change, the writes (or, in
check mode, an overlay of would-be contents), the undo of a backup, the roll-back of an interrupted run, and the
patch state the records give.

Private to the llmops.inference collection; not a public API. Standard library only. The model and the safety rules
are in source_patcher.py.
"""

from __future__ import annotations

import time

from ansible_collections.llmops.inference.plugins.module_utils.source_backup import (
    APPLIED,
    INTERRUPTED,
    LATEST,
    PENDING,
    PRISTINE,
    RESTORED,
    RESTORING,
    BackupIntegrityError,
    FileRecord,
    Manifest,
    UnknownBackupError,
    applied_stack,
    belongs_to,
    expected_files,
    state_id,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_inputs import (
    INTERRUPTED_STATE,
    MODIFIED_STATE,
    SourcePatchError,
    Transition,
    sha_of,
)

NEW_FILE_MODE = 0o644


class SourceLedger:
    """The backups and files of one run against one sglang installation; the caller holds the backup store's lock."""

    clock = staticmethod(time.time)

    def __init__(self, install, store, tree, python, check_mode: bool = False):
        self.install = install
        self.store = store
        self.tree = tree
        self.python = python
        self.check_mode = check_mode
        self.recovered = []
        self.warnings = []
        self._manifests = store.manifests()
        self._overlay = {}
        self._initial = {}
        self._virtual = set()
        self._state_at_start = self._reported_state()

    def _new_manifest(self, move: Transition, changes: dict, state_after: str | None = None) -> tuple:
        records, originals, created_dirs = [], {}, []
        for rel in sorted(changes):
            before, after = self._read(rel), changes[rel]
            mode = self.tree.mode(rel) if before is not None else None
            records.append(FileRecord(rel, before is not None, sha_of(before), mode, after is not None, sha_of(after)))
            if before is not None:
                originals[rel] = before
            if after is not None:
                created_dirs += [d for d in self.tree.missing_parents(rel) if d not in created_dirs]
        manifest = Manifest(
            backup_id=self.store.new_id(move.patch_set.name, [m.backup_id for m in self._manifests]),
            sequence=max([m.sequence for m in self._manifests] or [0]) + 1,
            name=move.patch_set.name,
            state=PENDING,
            sglang_version=self.install.version,
            package_dir=self.install.package_dir,
            base_dir=self.install.base_dir,
            patch_set=move.patch_set.describe(),
            exclusive=move.exclusive,
            state_id_before=move.state_before,
            state_id_after=state_after or state_id(self.install.version, move.sets_after),
            applied_sets_before=move.sets_before,
            applied_sets_after=move.sets_after,
            files=records,
            created_dirs=created_dirs,
        )
        manifest.set_state(PENDING, "backup written before any change", self.clock)
        return manifest, originals

    # ----- changing things -----

    def _create(self, manifest: Manifest, originals: dict) -> None:
        if self.check_mode:
            self._virtual.add(manifest.backup_id)
        else:
            self.store.create(manifest, originals)
        self._manifests.append(manifest)

    def _commit(self, manifest: Manifest, originals: dict, changes: dict) -> None:
        self._create(manifest, originals)
        try:
            for rel in sorted(changes):
                self._put(rel, changes[rel], None if rel in originals else NEW_FILE_MODE)
        except Exception as exc:
            raise SourcePatchError(self._roll_back_failed_apply(manifest, exc)) from exc
        manifest.set_state(APPLIED, "", self.clock)
        self._save(manifest)

    def _roll_back_failed_apply(self, manifest: Manifest, error: Exception) -> str:
        """Undo a write that failed half-way (disk full, permissions); the message for the error."""
        failed = f"applying patch set {manifest.name} failed: {error}"
        try:
            self._undo(manifest, f"apply failed ({error}); rolled back")
        except Exception as undo_error:  # the pending manifest stays; the next run rolls back
            return (
                f"{failed}; rolling back failed too ({undo_error}); the next run rolls back backup {manifest.backup_id}"
            )
        return f"{failed}; the files were restored from backup {manifest.backup_id}"

    def _adopt(self, move: Transition, originals: dict) -> dict:
        """Record a backup for a patch set found already applied without one; the sources stay as they are."""
        manifest = self._new_manifest(move, {rel: self._read(rel) for rel in originals})[0]
        for record in manifest.files:
            record.existed_before = originals[record.path] is not None
            record.sha256_before = sha_of(originals[record.path])
        manifest.adopted = True
        manifest.set_state(APPLIED, "found applied without a backup; originals computed by reversing it", self.clock)
        self._create(manifest, {rel: data for rel, data in originals.items() if data is not None})
        name = move.patch_set.name
        self.warnings.append(
            f"patch set {name} was already applied without a backup record (was the backup directory removed?); "
            f"recorded backup {manifest.backup_id} with the originals computed by reversing the patches"
        )
        return self._result(
            False,
            backup_id=manifest.backup_id,
            adopted=True,
            msg=f"patch set {name} is already applied (adopted into backup {manifest.backup_id})",
        )

    def _recover(self) -> None:
        for manifest in reversed(self._manifests):
            if manifest.state not in INTERRUPTED:
                continue
            if not self._mine(manifest):
                self.warnings.append(
                    f"backup {manifest.backup_id} records an interrupted run on sglang {manifest.sglang_version} "
                    f"at {manifest.package_dir}, not this installation; left alone"
                )
                continue
            interrupted = "apply" if manifest.state == PENDING else "restore"
            problems = self.store.problems(manifest)
            if problems:
                raise BackupIntegrityError(
                    f"backup {manifest.backup_id} records an interrupted {interrupted} but cannot be rolled back: "
                    f"{'; '.join(problems)}. Nothing was changed; inspect {self.store.root}"
                )
            self._undo(manifest, f"interrupted {interrupted} rolled back")
            files = [record.path for record in manifest.files]
            self.recovered.append(
                {"backup_id": manifest.backup_id, "interrupted": interrupted, "action": "rolled back", "files": files}
            )
            self.warnings.append(
                f"backup {manifest.backup_id} recorded an interrupted {interrupted}; rolled it back to the originals"
            )

    def _undo(self, manifest: Manifest, note: str) -> None:
        """Put back the originals of one backup (checked first), then mark it restored."""
        originals = {record.path: self.store.original(manifest, record) for record in manifest.files}
        if manifest.state != RESTORING:
            manifest.set_state(RESTORING, "", self.clock)
            self._save(manifest)
        for record in manifest.files:
            self._put(record.path, originals[record.path], record.mode_before)
            if not self.check_mode:
                self.tree.remove_temp_leftovers(record.path)
        if not self.check_mode:
            self.tree.remove_empty_dirs(manifest.created_dirs)
        for record in manifest.files:
            actual = sha_of(self._read(record.path))
            if actual != record.sha256_before:
                raise SourcePatchError(
                    f"after restoring backup {manifest.backup_id}, {record.path} has sha256 {actual} "
                    f"instead of {record.sha256_before}"
                )
        manifest.set_state(RESTORED, note, self.clock)
        self._save(manifest)

    def _put(self, rel: str, data: bytes | None, mode: int | None) -> None:
        if rel not in self._initial:
            self._initial[rel] = self._read(rel)
        if self.check_mode:
            self._overlay[rel] = data
            return
        if data is None:
            self.tree.remove(rel)
        else:
            self.tree.write(rel, data, mode)
        self.tree.purge_bytecode(rel)

    def _save(self, manifest: Manifest) -> None:
        if not self.check_mode:
            self.store.save(manifest)

    def _compile(self, contents: dict) -> dict:
        """Write fresh bytecode for the changed modules; {rel: error} for those that do not compile."""
        if self.check_mode:
            return {}
        paths = {self.tree.path_of(rel): rel for rel, data in contents.items() if rel.endswith(".py") and data}
        errors = self.python.compile_files(sorted(paths))
        return {paths[path]: error for path, error in errors.items()}

    # ----- state -----

    def _read(self, rel: str) -> bytes | None:
        if rel in self._overlay:
            return self._overlay[rel]
        return self.tree.read(rel)

    def _mine(self, manifest: Manifest) -> bool:
        return belongs_to(manifest, self.install.package_dir, self.install.version)

    def _stack(self) -> list:
        return applied_stack(self._manifests, self.install.package_dir, self.install.version)

    def _recorded_state(self, stack: list) -> tuple:
        if not stack:
            return PRISTINE, []
        return stack[-1].state_id_after, list(stack[-1].applied_sets_after)

    def _reported_state(self) -> str:
        if any(m.state in INTERRUPTED and self._mine(m) for m in self._manifests):
            return INTERRUPTED_STATE
        stack = self._stack()
        if self._drift(stack):
            return MODIFIED_STATE
        return self._recorded_state(stack)[0]

    def _drift(self, stack: list) -> list:
        """Files whose content is not what the applied backups say it is."""
        return sorted(rel for rel, sha in expected_files(stack).items() if sha_of(self._read(rel)) != sha)

    def _refuse_drift(self, stack: list) -> None:
        drift = self._drift(stack)
        if drift:
            raise SourcePatchError(
                f"sglang files changed outside this module since backup {stack[-1].backup_id} recorded them: "
                f"{', '.join(drift)}. Restore a backup (state=restored) or reinstall sglang {self.install.version} "
                f"first; nothing was changed{self._recovery_note()}"
            )

    def _reachable_states(self) -> list:
        stack = self._stack()
        states = [self._recorded_state(stack)[0]] + [m.state_id_before for m in reversed(stack)]
        return list(dict.fromkeys(states))

    def _restore_target(self, backup_id: str | None, target_state_id: str | None) -> tuple:
        if target_state_id:
            return target_state_id, f"patch state {target_state_id}"
        mine = [m for m in self._manifests if self._mine(m)]
        if backup_id in (None, "", LATEST):
            if not mine:
                where = f"sglang {self.install.version} at {self.install.package_dir}"
                return None, f"no backups of {where} in {self.store.root}; nothing to restore"
            return mine[-1].state_id_before, f"backup {mine[-1].backup_id}"
        found = [m for m in self._manifests if m.backup_id == backup_id]
        if not found:
            available = ", ".join(m.backup_id for m in mine) or "none"
            raise UnknownBackupError(
                f"backup id {backup_id!r} not found in {self.store.root}; available: {available} "
                f"(or {LATEST!r} for the newest)"
            )
        manifest = found[0]
        if not self._mine(manifest):
            raise SourcePatchError(
                f"backup {backup_id} was made for sglang {manifest.sglang_version} at {manifest.package_dir}, but "
                f"{self.install.python} has sglang {self.install.version} at {self.install.package_dir}; restoring "
                "it would mix versions"
            )
        return manifest.state_id_before, f"backup {manifest.backup_id}"

    def _recovery_note(self) -> str:
        if not self.recovered:
            return ""
        ids = ", ".join(item["backup_id"] for item in self.recovered)
        return f" (beyond rolling back the interrupted run of backup {ids})"

    def _stack_note(self, stack: list) -> str:
        if not stack:
            return ""
        names = ", ".join(item["name"] for item in stack[-1].applied_sets_after)
        return f" (patch sets applied now: {names}, patch state {stack[-1].state_id_after})"

    def _result(self, changed: bool, **extra) -> dict:
        stack = self._stack()
        result = {
            "changed": changed,
            "state_id": self._reported_state(),
            "state_id_before": self._state_at_start,
            "applied_sets": self._recorded_state(stack)[1],
            "sglang": self.install.facts(),
            "backups": [m.summary() for m in self._manifests if m.backup_id not in self._virtual],
            "recovered": self.recovered,
            "files": sorted(rel for rel, before in self._initial.items() if before != self._read(rel)),
            "backup_id": None,
            "compile_errors": {},
        }
        result.update(extra)
        if result["backup_id"] in self._virtual:
            result["backup_id"] = None
        return result
