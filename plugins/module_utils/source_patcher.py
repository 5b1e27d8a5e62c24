# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Apply, restore and verify patch sets on an installed sglang: the work behind the source_patch module.

Private to the llmops.inference collection; not a public API. Standard library only.

Model: every apply is one transaction recorded as a backup (see source_backup). The backups whose
state is ``applied`` form a stack; the top one's ``state_id_after`` is the current patch state.
Restoring to a backup means returning to the state it was taken in (its ``state_id_before``):
applied backups are undone newest first until that state is reached. Reaching a recorded source
state (a known-good snapshot's file set, ``reach``) is a transaction of its own like an apply: the
files that differ from that state are backed up, then given the recorded content, so undoing it
returns to where the sources were.

Safety rules:
- Inputs are parsed and every path is checked before anything changes; every hunk of every file is
  applied in memory first, so a patch that does not apply changes nothing.
- The backup and its ``pending`` manifest are on disk before the first package file changes.
- An interrupted apply or restore (a ``pending`` or ``restoring`` manifest) is rolled back to its
  originals at the start of the next apply or restore, and reported in ``recovered``. Rolling back
  needs nothing but the backup itself, so it works whatever the next run asks for.
- Originals are checked against the manifest's sha256 before any file is restored.
- In check mode nothing is written; an overlay holds the would-be contents, so ``changed`` and the
  diff are computed exactly as a real run would.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import sha256_bytes
from ansible_collections.llmops.inference.plugins.module_utils.patchset import (
    HunkError,
    apply_file_patch,
    parse_patch,
    render_diff,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import verify_record
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
    validate_name,
)

COMPILE_FAIL, COMPILE_WARN = "fail", "warn"
INTERRUPTED_STATE = "interrupted"
MODIFIED_STATE = "modified"
NEW_FILE_MODE = 0o644


class SourcePatchError(Exception):
    """A request that cannot be carried out; the message says why and what would be accepted."""


class PatchSetInput:
    """A named patch set: unified diffs applied in order, then whole-file replacements."""

    def __init__(self, name: str, patches: list, replacements: list = ()):
        self.name = validate_name(name)
        self.patches = list(patches)  # [(label, bytes)]
        self.replacements = list(replacements)  # [(dest, label, bytes)]
        if not self.patches and not self.replacements:
            raise ValueError(f"patch set {name} is empty: give at least one patch or replacement")

    @property
    def checksum(self) -> str:
        canonical = {
            "patches": [sha256_bytes(patch[1]) for patch in self.patches],
            "replacements": [[dest, sha256_bytes(data)] for dest, _label, data in self.replacements],
        }
        return sha256_bytes(json.dumps(canonical, sort_keys=True).encode())

    def ref(self) -> dict:
        return {"name": self.name, "checksum": self.checksum}

    def describe(self) -> dict:
        return {
            "name": self.name,
            "checksum": self.checksum,
            "patches": [{"name": label, "sha256": sha256_bytes(data)} for label, data in self.patches],
            "replacements": [
                {"dest": dest, "source": label, "sha256": sha256_bytes(data)} for dest, label, data in self.replacements
            ],
        }


@dataclass
class SourceTarget:
    """A recorded source state to re-create: every file that differs from the wheel's RECORD in it.

    ``files``: {path: {"sha256": content or None (absent), "pristine": RECORD's sha256 or None}};
    ``content(sha256)``: the stored bytes with that sha256, checked, or None.
    """

    label: str
    name: str
    files: dict
    state_id: str | None
    applied_sets: list
    sglang_version: str
    package_dir: str
    content: object

    @property
    def digest(self) -> str:
        return sha256_bytes(json.dumps(self.files, sort_keys=True).encode())

    def final_state(self) -> tuple:
        """(patch state id, applied sets) the sources are in once the target is reached."""
        if not self.files:
            return PRISTINE, []
        if self.state_id and self.state_id not in (PRISTINE, MODIFIED_STATE, INTERRUPTED_STATE, "unknown"):
            return self.state_id, list(self.applied_sets)
        # Sources no patch set accounts for (edited by hand, say): named by their content.
        return self.digest[:16], [{"name": self.name, "checksum": self.digest}]

    def describe(self) -> dict:
        return {"name": self.name, "checksum": self.digest, "target": self.label, "files": len(self.files)}


@dataclass
class Transition:
    """Where an apply starts from and what it leads to, in patch-set terms."""

    patch_set: PatchSetInput
    exclusive: bool
    state_before: str
    sets_before: list
    sets_after: list


class SourcePatcher:
    """One run against one sglang installation; the caller holds the backup store's lock."""

    def __init__(self, install, store, tree, python, *, check_mode: bool = False, clock=time.time):
        self.install = install
        self.store = store
        self.tree = tree
        self.python = python
        self.check_mode = check_mode
        self.clock = clock
        self.recovered = []
        self.warnings = []
        self._manifests = store.manifests()
        self._overlay = {}
        self._initial = {}
        self._virtual = set()
        self._state_at_start = self._reported_state()

    # ----- actions -----

    def apply(self, patch_set: PatchSetInput, exclusive: bool = True, compile_check: str = COMPILE_FAIL) -> dict:
        plan = self._plan(patch_set)
        self._recover()
        stack = self._stack()
        self._refuse_drift(stack)
        state_before, sets_before = self._recorded_state(stack)
        ref = patch_set.ref()
        applied = [item["checksum"] for item in sets_before]
        if (applied == [ref["checksum"]]) if exclusive else (ref["checksum"] in applied):
            return self._result(bool(self.recovered), msg=f"patch set {patch_set.name} is already applied")
        move = Transition(patch_set, exclusive, state_before, sets_before, [ref] if exclusive else [*sets_before, ref])
        try:
            final = self._dry_run(plan, self._pristine(stack) if exclusive else {})
        except HunkError as exc:
            originals = None if stack else self._reverse_dry_run(plan)
            if originals is None:
                note = f"{self._stack_note(stack)}{self._recovery_note()}"
                raise SourcePatchError(f"{exc}; nothing was changed{note}") from exc
            return self._adopt(move, originals)
        changes = {rel: data for rel, data in final.items() if data != self._read(rel)}
        compile_errors = self._check_syntax(patch_set.name, changes, compile_check)
        manifest, originals = self._new_manifest(move, changes)
        self._commit(manifest, originals, changes)
        for rel, error in self._compile(changes).items():
            compile_errors.setdefault(rel, error)
        return self._result(
            bool(changes) or bool(self.recovered),
            backup_id=manifest.backup_id,
            compile_errors=compile_errors,
            msg=f"patch set {patch_set.name} applied ({len(changes)} files)",
        )

    def restore(self, backup_id: str | None = None, target_state_id: str | None = None) -> dict:
        target, label = self._restore_target(backup_id, target_state_id)
        if target is None:
            return self._result(False, msg=label)
        self._recover()
        undo = self._backups_to_undo(target, label)
        if not undo:
            drift = self._drift(self._stack())
            if drift:
                self.warnings.append(
                    f"at patch state {target} by the records, but these files differ: {', '.join(drift)}"
                )
            return self._result(bool(self.recovered), msg=f"already at patch state {target} ({label})")
        problems = [problem for manifest in undo for problem in self.store.problems(manifest)]
        if problems:
            raise BackupIntegrityError(
                f"refusing to restore {label}: {'; '.join(problems)}. Nothing was changed{self._recovery_note()}"
            )
        for manifest in undo:
            self._undo(manifest, f"restored on request ({label})")
        restored = {record.path: self._read(record.path) for manifest in undo for record in manifest.files}
        undone = [manifest.backup_id for manifest in undo]
        return self._result(
            True,
            restored=undone,
            compile_errors=self._compile(restored),
            backup_id=undone[-1],
            msg=f"restored {label}: undid {', '.join(undone)}",
        )

    def reach(self, target: SourceTarget, scan) -> dict:
        """Make the sources exactly ``target``'s file set; every other file as the wheel has it.

        ``scan()`` returns the installed files that differ from RECORD (sglang_install.source_differences).
        The content of every file to write is found and checked before anything changes; what cannot be
        found is named and nothing changes. The files that change are backed up first (a backup like an
        apply's, so restoring it returns to the state before), stale bytecode is purged, the result is checked
        against the target's checksums and compiled.
        """
        if not belongs_to(target, self.install.package_dir, self.install.version):
            raise SourcePatchError(
                f"{target.label} records sglang {target.sglang_version} at {target.package_dir}, but "
                f"{self.install.python} has sglang {self.install.version} at {self.install.package_dir}; install "
                f"sglang {target.sglang_version} there first; nothing was changed"
            )
        self._recover()
        stack = self._stack()
        now = scan()
        expected = expected_files(stack)
        plan, records, missing = {}, {}, []
        for rel in sorted(set(now) | set(target.files) | set(expected)):
            current = self._read(rel)
            pristine = now[rel]["pristine"] if rel in now else _sha(self.tree.read(rel))
            want = target.files[rel]["sha256"] if rel in target.files else pristine
            if _sha(current) == want:
                if rel in expected and expected[rel] != want:
                    records[rel] = current  # right content, wrong record: the backup says what it is now
                continue
            data = None if want is None else self._content(target, want)
            if want is not None and data is None:
                whose = "its content" if rel in target.files else "the wheel's original"
                missing.append(f"{rel} ({whose}, sha256 {want})")
                continue
            plan[rel] = data
        if missing:
            raise SourcePatchError(
                f"cannot re-create {target.label}: no stored copy matches {'; '.join(missing)} (not in the "
                f"snapshot's objects nor in any backup in {self.store.root}); nothing was changed"
                f"{self._recovery_note()}"
            )
        final_state, final_sets = target.final_state()
        if not plan and not records:
            return self._result(bool(self.recovered), msg=f"the sources already are {target.label}")
        state_before, sets_before = self._recorded_state(stack)
        if self._drift(stack):
            state_before = MODIFIED_STATE
        move = Transition(target, True, state_before, sets_before, final_sets)
        manifest, originals = self._new_manifest(move, {**records, **plan}, state_after=final_state)
        self._commit(manifest, originals, plan)
        wrong = [rel for rel, data in plan.items() if self._read(rel) != data]
        if wrong:
            raise SourcePatchError(
                self._roll_back_failed_apply(manifest, ValueError(f"{', '.join(wrong)} did not take the content"))
            )
        if not self.check_mode:
            removed = [rel for rel, data in plan.items() if data is None]
            self.tree.remove_empty_dirs(sorted({d for rel in removed for d in _parents(rel)}))
        return self._result(
            True,
            backup_id=manifest.backup_id,
            compile_errors=self._compile(plan),
            msg=f"re-created {target.label}: {len(plan)} files changed (backup {manifest.backup_id})",
        )

    def _content(self, target: SourceTarget, sha256: str) -> bytes | None:
        """Bytes with this sha256: from the target's store, else any backup's originals."""
        data = target.content(sha256)
        if data is None:
            data = self.store.find_original(sha256)
        return data

    def verify(self) -> dict:
        interrupted = [m.backup_id for m in self._manifests if m.state in INTERRUPTED and self._mine(m)]
        if interrupted:
            self.warnings.append(
                f"backups {', '.join(interrupted)} record an interrupted run; the next apply or restore rolls them back"
            )
        drift = self._drift(self._stack())
        if drift:
            self.warnings.append(f"files differ from the last recorded patch state: {', '.join(drift)}")
        record = verify_record(self.install)
        counts = (record["checked"], len(record["modified"]), len(record["missing"]), len(record["unrecorded"]))
        return self._result(
            False,
            verify=record,
            interrupted=interrupted,
            drift=drift,
            msg="{} files checked against RECORD: {} modified, {} missing, {} not in RECORD".format(*counts),
        )

    def diff(self) -> str:
        """Unified diff of every file this run changed (or, in check mode, would change)."""
        return "".join(
            render_diff(rel, before, self._read(rel))
            for rel, before in sorted(self._initial.items())
            if before != self._read(rel)
        )

    # ----- planning (nothing changes) -----

    def _plan(self, patch_set: PatchSetInput) -> dict:
        """Parse every patch and check every path before anything else happens."""
        file_patches = []
        for label, data in patch_set.patches:
            for file_patch in parse_patch(data, label):
                file_patches.append((self.tree.check(file_patch.target), file_patch))
        replacements = [(self.tree.check(dest), data) for dest, _label, data in patch_set.replacements]
        return {"file_patches": file_patches, "replacements": replacements}

    def _dry_run(self, plan: dict, base: dict) -> dict:
        """The content of every file the plan ends with (None: removed), applied in memory."""
        final = dict(base)
        for rel, file_patch in plan["file_patches"]:
            final[rel] = apply_file_patch(file_patch, final[rel] if rel in final else self._read(rel))
        for rel, data in plan["replacements"]:
            final[rel] = data
        return final

    def _reverse_dry_run(self, plan: dict) -> dict | None:
        """The originals if the plan's patches are already in the files (applied without a record)."""
        if plan["replacements"]:
            return None
        originals = {}
        for rel, file_patch in reversed(plan["file_patches"]):
            current = originals[rel] if rel in originals else self._read(rel)
            try:
                originals[rel] = apply_file_patch(file_patch.reversed(), current)
            except HunkError:
                return None
        return originals

    def _pristine(self, stack: list) -> dict:
        """Each file touched by an applied backup as it was before the oldest of them."""
        pristine = {}
        for manifest in reversed(stack):
            for record in manifest.files:
                pristine[record.path] = self.store.original(manifest, record)
        return pristine

    def _check_syntax(self, name: str, changes: dict, compile_check: str) -> dict:
        sources = {rel: data for rel, data in changes.items() if rel.endswith(".py") and data is not None}
        errors = self.python.syntax_errors(sources)
        listing = "; ".join(f"{rel}: {error}" for rel, error in sorted(errors.items()))
        if errors and compile_check == COMPILE_FAIL:
            raise SourcePatchError(
                f"patch set {name} leaves modules that do not compile: {listing}. Nothing was changed"
                f"{self._recovery_note()}; fix the patch, or set compile_check=warn to install it anyway"
            )
        if errors:
            self.warnings.append(f"patch set {name} installs modules that do not compile: {listing}")
        return errors

    def _backups_to_undo(self, target: str, label: str) -> list:
        stack = self._stack()
        current = self._recorded_state(stack)[0]
        undo = []
        while stack and current != target:
            undo.append(stack.pop())
            current = undo[-1].state_id_before
        if current != target:
            raise SourcePatchError(
                f"{label} (patch state {target}) cannot be reached by restoring the backups of sglang "
                f"{self.install.version} at {self.install.package_dir}; states reachable now: "
                f"{', '.join(self._reachable_states())}; nothing was changed{self._recovery_note()}"
            )
        return undo

    def _new_manifest(self, move: Transition, changes: dict, state_after: str | None = None) -> tuple:
        records, originals, created_dirs = [], {}, []
        for rel in sorted(changes):
            before, after = self._read(rel), changes[rel]
            mode = self.tree.mode(rel) if before is not None else None
            records.append(FileRecord(rel, before is not None, _sha(before), mode, after is not None, _sha(after)))
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
            record.sha256_before = _sha(originals[record.path])
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
            actual = _sha(self._read(record.path))
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
        return sorted(rel for rel, sha in expected_files(stack).items() if _sha(self._read(rel)) != sha)

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


def _sha(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


def _parents(rel: str) -> list:
    """The directories above ``rel`` inside its package, deepest first: sglang/a/b/c.py -> sglang/a/b, sglang/a."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:depth]) for depth in range(len(parts), 1, -1)]
