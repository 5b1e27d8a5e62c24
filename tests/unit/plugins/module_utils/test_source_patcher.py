from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

import pytest
from sglang_fixture import (
    ALGOS_PATCH,
    BROKEN_SYNTAX_PATCH,
    NEW_MODULE_PATCH,
    SERVER_PATCH,
    SYNTHETIC_FILES,
    make_patcher,
    patch_set,
    snapshot,
)

from ansible_collections.llmops.inference.plugins.module_utils.patchset import PatchParseError
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import source_differences
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import (
    BackupStore,
    UnknownBackupError,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_inputs import SourcePatchError, SourceTarget
from ansible_collections.llmops.inference.plugins.module_utils.source_tree import PathSafetyError

SERVER_TO_30002 = SERVER_PATCH.replace(b"+PORT = 30001", b"+PORT = 30002")


@pytest.fixture
def env(fake_venv, tmp_path):
    """A fresh synthetic sglang; ``env.patcher()`` is a new run against it, ``env.before`` its pristine files."""
    fake_venv.clear()
    fake_venv.install(SYNTHETIC_FILES)

    class Env:
        site = fake_venv.site
        python = fake_venv.python
        root = tmp_path / "backups"
        before = snapshot(fake_venv.site)

        def patcher(self, check_mode=False):
            return make_patcher(self.python, self.root, check_mode)

        def files(self):
            return snapshot(self.site)

        def backups(self):
            return BackupStore(str(self.root)).manifests()

        def algo_names(self):
            code = "from sglang.srt.algos import names; print(','.join(names()))"
            return subprocess.run([self.python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    return Env()


def test_check_mode_reports_the_change_and_writes_nothing(env):
    run = env.patcher(check_mode=True)
    result = run.apply(patch_set("demo", ALGOS_PATCH))
    assert result["changed"] is True and result["backup_id"] is None
    assert result["files"] == ["sglang/srt/algos.py"] and result["state_id"] != "pristine"
    assert "+    LLMOPS_DEMO = auto()\n" in run.diff() and run.diff().startswith("--- a/sglang/srt/algos.py\n")
    assert env.files() == env.before
    assert not env.root.exists()


def test_apply_is_idempotent_in_real_and_check_mode(env):
    first = env.patcher().apply(patch_set("demo", ALGOS_PATCH))
    assert first["changed"] is True and first["state_id_before"] == "pristine"
    for check_mode in (False, True):
        again = env.patcher(check_mode).apply(patch_set("demo", ALGOS_PATCH))
        assert again["changed"] is False and again["files"] == []
        assert again["state_id"] == first["state_id"]
    assert len(env.backups()) == 1


def test_a_hunk_that_fails_in_any_patch_changes_nothing(env):
    stale = SERVER_PATCH.replace(b"-PORT = 30000", b"-PORT = 29999")
    with pytest.raises(SourcePatchError) as caught:
        env.patcher().apply(patch_set("demo", ALGOS_PATCH, stale))
    message = str(caught.value)
    assert "0002-demo.diff" in message and "sglang/srt/server.py" in message and "hunk #1" in message
    assert "nothing was changed" in message
    assert env.files() == env.before and env.backups() == []


@pytest.mark.parametrize(
    ("target", "reason"),
    [("sglang/../evil.py", "'..'"), ("/etc/evil.py", "absolute"), ("evil.py", "outside the package")],
)
def test_path_escapes_are_refused_before_anything_changes(env, target, reason):
    escape = NEW_MODULE_PATCH.replace(b"b/sglang/srt/extra/demo.py", b"b/" + target.encode())
    if target.startswith("/"):
        escape = NEW_MODULE_PATCH.replace(b"+++ b/sglang/srt/extra/demo.py", b"+++ " + target.encode())
    with pytest.raises(PathSafetyError, match=re.escape(reason)):
        env.patcher().apply(patch_set("demo", ALGOS_PATCH, escape))
    assert env.files() == env.before and not env.root.exists()


def test_symlink_escape_and_replacement_escape_are_refused(env, tmp_path):
    os.symlink(tmp_path, env.site / "sglang" / "srt" / "outside")
    escape = NEW_MODULE_PATCH.replace(b"sglang/srt/extra/demo.py", b"sglang/srt/outside/demo.py")
    with pytest.raises(PathSafetyError, match="symlink escape"):
        env.patcher().apply(patch_set("demo", escape))
    with pytest.raises(PathSafetyError, match=r"'\.\.'"):
        env.patcher().apply(patch_set("demo", replacements=[("sglang/../../x.py", b"x")]))
    assert not (tmp_path / "demo.py").exists() and not env.root.exists()


def test_bytecode_is_purged_so_the_new_code_runs_and_old_code_returns(env):
    assert env.algo_names() == "EAGLE,NGRAM,NONE"
    cache = env.site / "sglang" / "srt" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "algos.cpython-39.pyc").write_bytes(b"stale bytecode of another interpreter")
    env.patcher().apply(patch_set("demo", ALGOS_PATCH))
    assert not (cache / "algos.cpython-39.pyc").exists()
    assert env.algo_names() == "EAGLE,NGRAM,NONE,LLMOPS_DEMO"
    env.patcher().restore()
    assert env.algo_names() == "EAGLE,NGRAM,NONE"


def test_new_files_and_their_directories_go_away_on_restore(env):
    result = env.patcher().apply(patch_set("demo", NEW_MODULE_PATCH, replacements=[("sglang/srt/conf.txt", b"x=1\n")]))
    assert result["files"] == ["sglang/srt/conf.txt", "sglang/srt/extra/demo.py"]
    (manifest,) = env.backups()
    assert manifest.created_dirs == ["sglang/srt/extra"]
    assert [r.existed_before for r in manifest.files] == [False, False]
    env.patcher().restore()
    assert env.files() == env.before
    assert not (env.site / "sglang" / "srt" / "extra").exists()


def test_a_module_that_does_not_compile_is_refused_by_default(env):
    with pytest.raises(
        SourcePatchError,
        match=r"do not compile: sglang/srt/server.py: SyntaxError at line 1: .*'PORT = = 30000'.*compile_check=warn",
    ):
        env.patcher().apply(patch_set("broken", BROKEN_SYNTAX_PATCH))
    assert env.files() == env.before and env.backups() == []


def test_compile_check_warn_installs_it_and_reports_the_error(env):
    run = env.patcher()
    result = run.apply(patch_set("broken", BROKEN_SYNTAX_PATCH), compile_check="warn")
    assert result["changed"] is True
    assert "SyntaxError" in result["compile_errors"]["sglang/srt/server.py"]
    assert any("do not compile" in warning for warning in run.warnings)
    env.patcher().restore()
    assert env.files() == env.before


def test_exclusive_apply_replaces_the_previous_patch_set_in_one_restorable_step(env):
    first = env.patcher().apply(patch_set("one", ALGOS_PATCH, SERVER_PATCH))
    after_one = env.files()
    second = env.patcher().apply(patch_set("two", SERVER_TO_30002))
    assert second["applied_sets"] == [{"name": "two", "checksum": patch_set("two", SERVER_TO_30002).checksum}]
    files = env.files()
    assert files["sglang/srt/algos.py"] == env.before["sglang/srt/algos.py"]
    assert files["sglang/srt/server.py"].startswith(b"PORT = 30002\n")
    assert env.patcher().restore()["state_id"] == first["state_id"]
    assert env.files() == after_one
    assert env.patcher().restore(target_state_id="pristine")["state_id"] == "pristine"
    assert env.files() == env.before


def test_stacked_patch_sets_restore_to_any_earlier_state(env):
    one = env.patcher().apply(patch_set("one", ALGOS_PATCH))
    two = env.patcher().apply(patch_set("two", SERVER_PATCH), exclusive=False)
    assert [s["name"] for s in two["applied_sets"]] == ["one", "two"]
    assert b"LLMOPS_DEMO" in env.files()["sglang/srt/algos.py"]
    assert env.patcher().apply(patch_set("one", ALGOS_PATCH), exclusive=False)["changed"] is False
    back = env.patcher().restore(target_state_id=one["state_id"])
    assert back["restored"] == [env.backups()[1].backup_id] and back["state_id"] == one["state_id"]
    assert env.patcher().restore(target_state_id=one["state_id"])["changed"] is False
    with pytest.raises(SourcePatchError, match=r"cannot be reached.*reachable now: .*pristine"):
        env.patcher().restore(target_state_id=two["state_id"])


def test_restoring_an_older_backup_undoes_the_newer_ones_first(env):
    env.patcher().apply(patch_set("one", ALGOS_PATCH))
    env.patcher().apply(patch_set("two", SERVER_PATCH), exclusive=False)
    oldest = env.backups()[0].backup_id
    result = env.patcher().restore(backup_id=oldest)
    assert result["restored"] == [env.backups()[1].backup_id, oldest]
    assert env.files() == env.before


def test_check_mode_restore_changes_nothing(env):
    env.patcher().apply(patch_set("one", ALGOS_PATCH))
    patched = env.files()
    run = env.patcher(check_mode=True)
    result = run.restore()
    assert result["changed"] is True and result["state_id"] == "pristine"
    assert "-    LLMOPS_DEMO = auto()" in run.diff()
    assert env.files() == patched and env.backups()[0].state == "applied"


def test_unknown_backup_id_is_refused_with_the_available_ids(env):
    env.patcher().apply(patch_set("one", ALGOS_PATCH))
    with pytest.raises(UnknownBackupError, match=rf"'20990101T000000Z-x' not found.*{env.backups()[0].backup_id}"):
        env.patcher().restore(backup_id="20990101T000000Z-x")


def test_restore_without_backups_is_a_no_op(env):
    result = env.patcher().restore()
    assert result["changed"] is False and "nothing to restore" in result["msg"]


def test_backup_of_another_sglang_version_is_not_restored(env):
    env.patcher().apply(patch_set("one", ALGOS_PATCH))
    (manifest,) = env.backups()
    path = env.root / manifest.backup_id / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps(dict(data, sglang_version="0.0.0")))
    with pytest.raises(SourcePatchError, match="would mix versions"):
        env.patcher().restore(backup_id=manifest.backup_id)


def test_already_applied_without_a_record_is_adopted_and_restorable(env):
    env.patcher().apply(patch_set("one", ALGOS_PATCH, NEW_MODULE_PATCH))
    patched = env.files()
    for entry in env.root.iterdir():
        if entry.is_dir():
            for path in sorted(entry.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            entry.rmdir()
    run = env.patcher()
    result = run.apply(patch_set("one", ALGOS_PATCH, NEW_MODULE_PATCH))
    assert result["changed"] is False and result["adopted"] is True
    assert "without a backup record" in run.warnings[0]
    assert env.files() == patched
    env.patcher().restore()
    assert env.files() == env.before


def test_files_changed_behind_its_back_block_apply_and_show_in_verify(env):
    env.patcher().apply(patch_set("one", ALGOS_PATCH))
    (env.site / "sglang" / "srt" / "algos.py").write_bytes(b"# edited by hand\n")
    with pytest.raises(SourcePatchError, match=r"changed outside this module.*sglang/srt/algos.py"):
        env.patcher().apply(patch_set("two", SERVER_PATCH), exclusive=False)
    verified = env.patcher().verify()
    assert verified["state_id"] == "modified" and verified["drift"] == ["sglang/srt/algos.py"]
    assert verified["verify"]["modified"] == ["sglang/srt/algos.py"]
    env.patcher().restore()
    assert env.files() == env.before


def test_malformed_patch_is_refused_before_anything_changes(env):
    with pytest.raises(PatchParseError, match=r"0002-demo\.diff"):
        env.patcher().apply(patch_set("demo", ALGOS_PATCH, b"not a diff\n"))
    assert env.files() == env.before and not env.root.exists()


def test_empty_or_badly_named_patch_sets_are_refused():
    with pytest.raises(ValueError, match="is empty"):
        patch_set("demo")
    with pytest.raises(ValueError, match=r"name '\.\./x' is not accepted"):
        patch_set("../x", ALGOS_PATCH)


# ----- reaching a recorded source state (a known-good snapshot's file set) -----


def record_of(env) -> dict:
    """The env's sources as a snapshot records them: {path: {sha256, pristine}} plus their contents by sha256."""
    install = env.patcher().install
    files = source_differences(install)
    contents = {}
    for rel, entry in files.items():
        if entry["sha256"]:
            contents[entry["sha256"]] = (env.site / rel).read_bytes()
    return files, contents


def target_of(env, files, contents, state_id=None, applied_sets=(), version="0.0.1"):
    install = env.patcher().install
    return SourceTarget(
        label="the test snapshot",
        name="known-good-test",
        files=files,
        state_id=state_id,
        applied_sets=list(applied_sets),
        sglang_version=version,
        package_dir=install.package_dir,
        content=contents.get,
    )


def reach(env, target, check_mode=False):
    run = env.patcher(check_mode)
    return run.reach(target, lambda: source_differences(run.install)), run


def test_reach_makes_the_files_exactly_the_targets_from_another_patch_state(env):
    a = env.patcher().apply(patch_set("a", ALGOS_PATCH, NEW_MODULE_PATCH))
    a_files = env.files()
    files, contents = record_of(env)
    env.patcher().apply(patch_set("b", SERVER_PATCH))
    assert env.files() != a_files

    result, _run = reach(env, target_of(env, files, contents, a["state_id"], a["applied_sets"]))

    assert env.files() == a_files
    assert result["changed"] is True and result["state_id"] == a["state_id"]
    assert result["applied_sets"] == a["applied_sets"] and result["backup_id"].endswith("-known-good-test")
    assert sorted(result["files"]) == ["sglang/srt/algos.py", "sglang/srt/extra/demo.py", "sglang/srt/server.py"]
    # The same patch set is already applied now, and the transaction is a backup like any other.
    assert env.patcher().apply(patch_set("a", ALGOS_PATCH, NEW_MODULE_PATCH))["changed"] is False
    env.patcher().restore(backup_id=result["backup_id"])
    assert env.files()["sglang/srt/server.py"] != env.before["sglang/srt/server.py"]
    env.patcher().restore(target_state_id="pristine")
    assert env.files() == env.before


def test_reach_from_sources_reinstalled_behind_the_records_back(env, fake_venv):
    b = env.patcher().apply(patch_set("b", SERVER_PATCH, NEW_MODULE_PATCH))
    b_files = env.files()
    files, contents = record_of(env)
    fake_venv.clear()
    fake_venv.install(SYNTHETIC_FILES)  # the wheel again, as pip install --force-reinstall leaves it
    assert env.patcher().verify()["state_id"] == "modified"

    result, _run = reach(env, target_of(env, files, contents, b["state_id"], b["applied_sets"]))

    assert env.files() == b_files and result["state_id"] == b["state_id"]
    verified = env.patcher().verify()
    assert verified["state_id"] == b["state_id"] and verified["drift"] == []


def test_reach_returns_other_files_to_the_wheel_and_removes_added_ones(env):
    files, contents = record_of(env)  # the wheel's state: nothing differs
    env.patcher().apply(patch_set("a", ALGOS_PATCH, NEW_MODULE_PATCH))
    (env.site / "sglang" / "srt" / "server.py").unlink()  # partly broken by hand as well

    with pytest.raises(SourcePatchError, match=r"no stored copy matches sglang/srt/server.py \(the wheel's original"):
        reach(env, target_of(env, files, contents, "pristine"))
    assert not (env.site / "sglang" / "srt" / "server.py").exists()  # nothing changed

    contents[hashlib.sha256(SYNTHETIC_FILES["sglang/srt/server.py"]).hexdigest()] = SYNTHETIC_FILES[
        "sglang/srt/server.py"
    ]
    result, _run = reach(env, target_of(env, files, contents, "pristine"))

    assert env.files() == env.before and result["state_id"] == "pristine"
    assert not (env.site / "sglang" / "srt" / "extra").exists()


def test_reach_in_check_mode_reports_and_writes_nothing(env):
    files, contents = record_of(env)
    env.patcher().apply(patch_set("a", ALGOS_PATCH))
    patched = env.files()
    backups = len(env.backups())

    result, run = reach(env, target_of(env, files, contents, "pristine"), check_mode=True)

    assert result["changed"] is True and result["files"] == ["sglang/srt/algos.py"] and result["backup_id"] is None
    assert "-    LLMOPS_DEMO = auto()" in run.diff()
    assert env.files() == patched and len(env.backups()) == backups


def test_reach_of_the_state_the_sources_are_in_changes_nothing(env):
    a = env.patcher().apply(patch_set("a", ALGOS_PATCH))
    files, contents = record_of(env)
    backups = len(env.backups())

    result, _run = reach(env, target_of(env, files, contents, a["state_id"], a["applied_sets"]))

    assert result["changed"] is False and "already are the test snapshot" in result["msg"]
    assert len(env.backups()) == backups


def test_reach_refuses_a_target_of_another_sglang_version(env):
    files, contents = record_of(env)
    with pytest.raises(
        SourcePatchError, match=r"records sglang 0\.0\.2 at .* has sglang 0\.0\.1 .*nothing was changed"
    ):
        reach(env, target_of(env, files, contents, version="0.0.2"))


def test_reach_names_the_targets_own_content_when_it_is_missing(env):
    env.patcher().apply(patch_set("a", ALGOS_PATCH))
    files, _contents = record_of(env)
    env.patcher().restore(target_state_id="pristine")

    with pytest.raises(SourcePatchError, match=r"sglang/srt/algos.py \(its content, sha256 [0-9a-f]{64}\)"):
        reach(env, target_of(env, files, {}))
    assert env.files() == env.before
