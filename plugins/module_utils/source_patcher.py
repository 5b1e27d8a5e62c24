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

from ansible_collections.llmops.inference.plugins.module_utils.patchset import (
    HunkError,
    apply_file_patch,
    parse_patch,
    render_diff,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import verify_record
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import (
    INTERRUPTED,
    BackupIntegrityError,
    belongs_to,
    expected_files,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_ledger import SourceLedger
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_inputs import (
    COMPILE_FAIL,
    MODIFIED_STATE,
    PatchSetInput,
    SourcePatchError,
    SourceTarget,
    Transition,
    sha_of,
)


class SourcePatcher(SourceLedger):
    """Apply, restore, re-create and verify on one sglang installation; the caller holds the backup store's lock."""

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
        plan, records, missing = self._reach_plan(target, scan(), expected_files(stack))
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

    def _reach_plan(self, target: SourceTarget, now: dict, expected: dict) -> tuple:
        """({path: content to write, None to remove}, {path: content whose record is wrong}, [what has no stored copy]).

        ``now`` are the installed files that differ from RECORD, ``expected`` what the applied backups say."""
        plan, records, missing = {}, {}, []
        for rel in sorted(set(now) | set(target.files) | set(expected)):
            current = self._read(rel)
            pristine = now[rel]["pristine"] if rel in now else sha_of(self.tree.read(rel))
            want = target.files[rel]["sha256"] if rel in target.files else pristine
            if sha_of(current) == want:
                if rel in expected and expected[rel] != want:
                    records[rel] = current  # right content, wrong record: the backup says what it is now
                continue
            data = None if want is None else self._content(target, want)
            if want is not None and data is None:
                whose = "its content" if rel in target.files else "the wheel's original"
                missing.append(f"{rel} ({whose}, sha256 {want})")
                continue
            plan[rel] = data
        return plan, records, missing

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


def _parents(rel: str) -> list:
    """The directories above ``rel`` inside its package, deepest first: sglang/a/b/c.py -> sglang/a/b, sglang/a."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:depth]) for depth in range(len(parts), 1, -1)]
