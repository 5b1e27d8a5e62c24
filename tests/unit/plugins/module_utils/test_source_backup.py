from __future__ import annotations

import json
import os
import stat

import pytest
from sglang_fixture import (
    ALGOS_PATCH,
    SERVER_PATCH,
    SPEC_INFO,
    SYNTHETIC_FILES,
    make_patcher,
    patch_set,
    snapshot,
    wheel_files,
)

from ansible_collections.llmops.inference.plugins.module_utils import atomic_file, source_backup
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import (
    APPLIED,
    PENDING,
    RESTORED,
    BackupError,
    BackupIntegrityError,
    BackupStore,
    FileRecord,
    Manifest,
    UnknownBackupError,
    state_id,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_inputs import SourcePatchError
from ansible_collections.llmops.inference.plugins.module_utils.source_tree import SourceTree

REPO_EXAMPLE = os.path.join(
    os.path.dirname(__file__),
    "..",
    "..",
    "..",
    "..",
    "docs",
    "patches",
    "eagle_lab",
    "0001-register-llmops-demo-algorithm.diff",
)


class SimulatedCrash(BaseException):
    """Stands in for SIGKILL: no handler in the code under test catches it."""


@pytest.fixture
def synthetic(fake_venv):
    fake_venv.clear()
    fake_venv.install(SYNTHETIC_FILES)
    return fake_venv


def manifest(backup_id="20260101T000000Z-demo", state=PENDING, files=()):
    return Manifest(
        backup_id=backup_id,
        sequence=1,
        name="demo",
        state=state,
        sglang_version="0.0.1",
        package_dir="/p/sglang",
        base_dir="/p",
        patch_set={},
        exclusive=True,
        state_id_before="pristine",
        state_id_after="abc",
        applied_sets_before=[],
        applied_sets_after=[],
        files=list(files),
    )


def record(path, data, existed=True):
    sha = atomic_file.sha256_bytes(data) if existed else None
    return FileRecord(path, existed, sha, 0o644 if existed else None, True, "after")


def test_backup_is_private_complete_and_listed(tmp_path):
    store = BackupStore(str(tmp_path / "llmops" / "backups"))
    store.create(manifest(files=[record("sglang/a.py", b"a\n")]), {"sglang/a.py": b"a\n"})
    backup = tmp_path / "llmops" / "backups" / "20260101T000000Z-demo"
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert stat.S_IMODE(backup.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in (backup / "files").rglob("*") if p.is_dir())
    assert (backup / "files" / "sglang" / "a.py").read_bytes() == b"a\n"
    data = json.loads((backup / "manifest.json").read_text())
    assert data["state"] == PENDING and data["files"][0]["sha256_before"] == atomic_file.sha256_bytes(b"a\n")
    assert data["files"][0]["mode_before"] == "0644"
    assert [m.backup_id for m in store.manifests()] == ["20260101T000000Z-demo"]
    assert store.problems(store.load("20260101T000000Z-demo")) == []


def test_crash_while_writing_the_manifest_leaves_no_backup(tmp_path, monkeypatch):
    store = BackupStore(str(tmp_path / "backups"))
    real_write = source_backup.atomic_write

    def crash_on_manifest(path, data, mode=None):
        if path.endswith("manifest.json"):
            raise SimulatedCrash()
        real_write(path, data, mode)

    monkeypatch.setattr(source_backup, "atomic_write", crash_on_manifest)
    with pytest.raises(SimulatedCrash):
        store.create(manifest(files=[record("sglang/a.py", b"a\n")]), {"sglang/a.py": b"a\n"})
    assert store.manifests() == []
    monkeypatch.setattr(source_backup, "atomic_write", real_write)
    assert store.remove_partials() == [".partial-20260101T000000Z-demo"]


def test_missing_or_damaged_originals_are_reported(tmp_path):
    store = BackupStore(str(tmp_path / "backups"))
    m = manifest(
        files=[record("sglang/a.py", b"a\n"), record("sglang/b.py", b"b\n"), record("sglang/c.py", b"", False)]
    )
    store.create(m, {"sglang/a.py": b"a\n", "sglang/b.py": b"b\n"})
    files = tmp_path / "backups" / m.backup_id / "files" / "sglang"
    (files / "a.py").write_bytes(b"tampered\n")
    (files / "b.py").unlink()
    problems = store.problems(m)
    assert len(problems) == 2
    assert "damaged: the original of sglang/a.py" in problems[0]
    assert "incomplete: the original of sglang/b.py is missing" in problems[1]
    with pytest.raises(BackupIntegrityError):
        store.original(m, m.files[0])


def test_unknown_backup_id_lists_the_available_ones(tmp_path):
    store = BackupStore(str(tmp_path / "backups"))
    store.create(manifest(), {})
    with pytest.raises(UnknownBackupError, match=r"'nope' not found .*available: 20260101T000000Z-demo"):
        store.load("nope")
    with pytest.raises(UnknownBackupError):
        store.load("../etc")


def test_ids_are_utc_timestamps_and_never_collide(tmp_path):
    store = BackupStore(str(tmp_path / "backups"), clock=lambda: 1_800_000_000)
    first = store.new_id("demo", [])
    assert first == "20270115T080000Z-demo"
    assert store.new_id("demo", [first]) == "20270115T080000Z-demo-2"


def test_a_second_run_waits_for_the_lock_then_gives_up(tmp_path):
    store = BackupStore(str(tmp_path / "backups"))
    with store.lock(1), pytest.raises(BackupError, match="another run holds the lock"), store.lock(0.3):
        pass


def test_state_id_is_stable_and_depends_on_version_and_sets():
    sets = [{"name": "a", "checksum": "1" * 64}, {"name": "b", "checksum": "2" * 64}]
    assert state_id("0.5.23", []) == "pristine"
    assert state_id("0.5.23", sets) == state_id("0.5.23", [dict(s, name="renamed") for s in sets])
    assert state_id("0.5.23", sets) != state_id("0.5.23", sets[::-1])
    assert state_id("0.5.23", sets) != state_id("0.5.24", sets)
    assert len(state_id("0.5.23", sets)) == 16


# ----- transactions on an installed package -----


def crash_on_write_number(monkeypatch, tree_class, number, error):
    """Make the ``number``-th package file write raise ``error`` (after the earlier ones succeeded)."""
    real_write = tree_class.write
    calls = {"n": 0}

    def write(self, rel, data, mode=None):
        calls["n"] += 1
        if calls["n"] == number:
            raise error
        return real_write(self, rel, data, mode)

    monkeypatch.setattr(tree_class, "write", write)


def test_manifest_is_pending_on_disk_before_the_first_file_changes(synthetic, tmp_path, monkeypatch):
    root = tmp_path / "backups"
    seen = {}
    real_write = SourceTree.write

    def spy(self, rel, data, mode=None):
        seen.setdefault("states", [m.state for m in BackupStore(str(root)).manifests()])
        return real_write(self, rel, data, mode)

    monkeypatch.setattr(SourceTree, "write", spy)
    make_patcher(synthetic.python, root).apply(patch_set("demo", ALGOS_PATCH))
    assert seen["states"] == [PENDING]
    assert [m.state for m in BackupStore(str(root)).manifests()] == [APPLIED]


def test_crash_between_files_is_rolled_back_by_the_next_run(synthetic, tmp_path, monkeypatch):
    root = tmp_path / "backups"
    before = snapshot(synthetic.site)
    crash_on_write_number(monkeypatch, SourceTree, 2, SimulatedCrash())
    with pytest.raises(SimulatedCrash):
        make_patcher(synthetic.python, root).apply(patch_set("demo", ALGOS_PATCH, SERVER_PATCH))
    monkeypatch.undo()
    half = snapshot(synthetic.site)
    assert half["sglang/srt/algos.py"] != before["sglang/srt/algos.py"]
    assert half["sglang/srt/server.py"] == before["sglang/srt/server.py"]
    (crashed,) = BackupStore(str(root)).manifests()
    assert crashed.state == PENDING

    verified = make_patcher(synthetic.python, root).verify()
    assert verified["state_id"] == "interrupted" and verified["interrupted"] == [crashed.backup_id]

    result = make_patcher(synthetic.python, root).apply(patch_set("demo", ALGOS_PATCH, SERVER_PATCH))
    assert result["changed"] is True
    assert result["recovered"] == [
        {
            "backup_id": crashed.backup_id,
            "interrupted": "apply",
            "action": "rolled back",
            "files": ["sglang/srt/algos.py", "sglang/srt/server.py"],
        }
    ]
    states = {m.backup_id: m.state for m in BackupStore(str(root)).manifests()}
    assert states[crashed.backup_id] == RESTORED
    assert b"LLMOPS_DEMO" in (synthetic.site / "sglang/srt/algos.py").read_bytes()
    make_patcher(synthetic.python, root).restore(target_state_id="pristine")
    assert snapshot(synthetic.site) == before


def test_check_mode_shows_the_recovery_without_doing_it(synthetic, tmp_path, monkeypatch):
    root = tmp_path / "backups"
    crash_on_write_number(monkeypatch, SourceTree, 2, SimulatedCrash())
    with pytest.raises(SimulatedCrash):
        make_patcher(synthetic.python, root).apply(patch_set("demo", ALGOS_PATCH, SERVER_PATCH))
    monkeypatch.undo()
    half = snapshot(synthetic.site)
    run = make_patcher(synthetic.python, root, check_mode=True)
    result = run.restore()
    assert result["changed"] is True and result["state_id"] == "pristine" and result["recovered"]
    assert "-    LLMOPS_DEMO = auto()" in run.diff()
    assert snapshot(synthetic.site) == half
    assert [m.state for m in BackupStore(str(root)).manifests()] == [PENDING]


def test_crash_during_a_restore_is_completed_by_the_next_run(synthetic, tmp_path, monkeypatch):
    root = tmp_path / "backups"
    before = snapshot(synthetic.site)
    make_patcher(synthetic.python, root).apply(patch_set("demo", ALGOS_PATCH, SERVER_PATCH))
    crash_on_write_number(monkeypatch, SourceTree, 2, SimulatedCrash())
    with pytest.raises(SimulatedCrash):
        make_patcher(synthetic.python, root).restore()
    monkeypatch.undo()
    result = make_patcher(synthetic.python, root).restore()
    assert result["recovered"][0]["interrupted"] == "restore"
    assert result["changed"] is True and result["state_id"] == "pristine"
    assert snapshot(synthetic.site) == before


def test_a_failed_write_is_rolled_back_at_once(synthetic, tmp_path, monkeypatch):
    root = tmp_path / "backups"
    before = snapshot(synthetic.site)
    crash_on_write_number(monkeypatch, SourceTree, 2, OSError(28, "No space left on device"))
    with pytest.raises(SourcePatchError, match=r"No space left on device.*restored from backup"):
        make_patcher(synthetic.python, root).apply(patch_set("demo", ALGOS_PATCH, SERVER_PATCH))
    monkeypatch.undo()
    assert snapshot(synthetic.site) == before
    assert [m.state for m in BackupStore(str(root)).manifests()] == [RESTORED]


def test_damaged_backup_is_refused_and_nothing_is_touched(synthetic, tmp_path):
    root = tmp_path / "backups"
    applied = make_patcher(synthetic.python, root).apply(patch_set("demo", ALGOS_PATCH, SERVER_PATCH))
    patched = snapshot(synthetic.site)
    original = root / applied["backup_id"] / "files" / "sglang" / "srt" / "server.py"
    original.write_bytes(b"PORT = 1\n")
    with pytest.raises(BackupIntegrityError, match=r"refusing to restore .*server.py has sha256"):
        make_patcher(synthetic.python, root).restore(backup_id=applied["backup_id"])
    original.unlink()
    with pytest.raises(BackupIntegrityError, match="incomplete"):
        make_patcher(synthetic.python, root).restore()
    assert snapshot(synthetic.site) == patched
    assert [m.state for m in BackupStore(str(root)).manifests()] == [APPLIED]


def test_restore_is_byte_identical_to_the_wheel_record(fake_venv, tmp_path):
    members = [SPEC_INFO, "sglang/srt/speculative/spec_registry.py", "sglang/version.py"]
    files, rows = wheel_files(members)
    fake_venv.clear()
    fake_venv.install(files, version="0.5.23", record_rows=rows)
    root = tmp_path / "backups"
    with open(REPO_EXAMPLE, "rb") as handle:
        example = handle.read()
    applied = make_patcher(fake_venv.python, root).apply(patch_set("eagle_lab", example))
    assert applied["changed"] and applied["files"] == [SPEC_INFO] and applied["compile_errors"] == {}
    modified = make_patcher(fake_venv.python, root).verify()["verify"]
    assert modified["modified"] == [SPEC_INFO] and not modified["pristine"]

    restored = make_patcher(fake_venv.python, root).restore(backup_id="latest")
    assert restored["changed"] and restored["state_id"] == "pristine"
    pristine = make_patcher(fake_venv.python, root).verify()["verify"]
    assert pristine == {**pristine, "checked": 3, "modified": [], "missing": [], "unrecorded": [], "pristine": True}
    assert make_patcher(fake_venv.python, root).restore(backup_id="latest")["changed"] is False


def test_find_original_returns_only_checked_content(tmp_path):
    store = BackupStore(str(tmp_path / "backups"))
    data = b"original\n"
    backup = manifest(files=[record("sglang/a.py", data), record("sglang/new.py", b"", existed=False)])
    store.create(backup, {"sglang/a.py": data})
    wanted = atomic_file.sha256_bytes(data)

    assert store.find_original(wanted) == data
    assert store.find_original(atomic_file.sha256_bytes(b"")) is None  # did not exist: nothing backed up
    with open(tmp_path / "backups" / backup.backup_id / "files" / "sglang" / "a.py", "wb") as out:
        out.write(b"damaged\n")
    assert store.find_original(wanted) is None
    assert BackupStore(str(tmp_path / "none")).find_original(wanted) is None


def test_the_digest_changes_with_every_backup_and_state_and_only_then(tmp_path):
    store = BackupStore(str(tmp_path / "backups"))
    empty = store.digest()
    assert empty == BackupStore(str(tmp_path / "absent")).digest()
    backup = manifest(state=APPLIED)
    store.create(backup, {})
    created = store.digest()
    assert created != empty and store.digest() == created

    backup.set_state(RESTORED)
    store.save(backup)
    assert store.digest() not in (empty, created)


def test_applied_stack_and_expected_files_follow_one_installation(tmp_path):
    older = manifest("20260101T000000Z-a", APPLIED, [FileRecord("sglang/a.py", True, "s0", 0o644, True, "s1")])
    newer = manifest("20260101T000001Z-b", APPLIED, [FileRecord("sglang/a.py", True, "s1", 0o644, True, "s2")])
    undone = manifest("20260101T000002Z-c", RESTORED, [FileRecord("sglang/b.py", True, "s0", 0o644, True, "s3")])
    other = manifest("20260101T000003Z-d", APPLIED)
    other.sglang_version = "0.0.2"
    stack = source_backup.applied_stack([older, newer, undone, other], "/p/sglang", "0.0.1")
    assert [m.backup_id for m in stack] == [older.backup_id, newer.backup_id]
    assert source_backup.expected_files(stack) == {"sglang/a.py": "s2"}
