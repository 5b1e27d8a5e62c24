"""One source_patch request from parameters to result: inputs read first, the backup lock, the known-good target."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sglang_fixture import algos_request, run_command, snapshot

from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_inputs import SourcePatchError
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_request import (
    read_patch_set,
    run,
)


@pytest.fixture
def params(fake_venv, tmp_path):
    """Every parameter the module passes, as its argument spec fills them in."""
    return {
        **algos_request(fake_venv, tmp_path),
        "state": "applied",
        "replacements": [],
        "exclusive": True,
        "backup_id": None,
        "target_state_id": None,
        "known_good_snapshot": None,
        "known_good_root": None,
        "compile_check": "fail",
        "lock_timeout": 5,
    }


def test_the_patch_set_is_read_from_the_hosts_files(tmp_path):
    (tmp_path / "a.diff").write_bytes(b"diff a")
    (tmp_path / "new.py").write_bytes(b"x = 1\n")
    patch_set = read_patch_set(
        "demo", [str(tmp_path / "a.diff")], [{"src": str(tmp_path / "new.py"), "dest": "sglang/new.py"}]
    )
    assert (patch_set.name, patch_set.patches) == ("demo", [("a.diff", b"diff a")])
    assert patch_set.replacements == [("sglang/new.py", "new.py", b"x = 1\n")]


def test_a_missing_input_or_name_is_refused_naming_it(tmp_path):
    with pytest.raises(SourcePatchError, match="name is required with state=applied"):
        read_patch_set("", [], [])
    with pytest.raises(SourcePatchError, match=f"patch file {re.escape(str(tmp_path))} does not exist on the host"):
        read_patch_set("demo", [str(tmp_path)], [])  # a directory is not a regular file
    with pytest.raises(SourcePatchError, match=r"replacement source /nonexistent/y\.py does not exist"):
        read_patch_set("demo", [], [{"src": "/nonexistent/y.py", "dest": "sglang/y.py"}])


def test_a_missing_patch_file_is_refused_before_sglang_is_even_located(params):
    calls = []

    def recording_runner(args, data=None):
        calls.append(args)
        return run_command(args, data)

    with pytest.raises(SourcePatchError, match=r"patch file /nonexistent/x\.diff"):
        run(dict(params, patches=["/nonexistent/x.diff"]), recording_runner, check_mode=False)
    assert calls == []


def test_reads_and_check_mode_create_no_backup_directory_and_apply_does(params, fake_venv):
    before = snapshot(fake_venv.site)
    result, diff, _warnings = run(params, run_command, check_mode=True)
    assert result["changed"] is True and "+    LLMOPS_DEMO = auto()" in diff
    verified, _diff, _warnings = run(dict(params, state="verified"), run_command, check_mode=False)
    assert verified["changed"] is False and verified["verify"]["modified"] == []
    assert not Path(params["backup_root"]).exists() and snapshot(fake_venv.site) == before

    applied, _diff, _warnings = run(params, run_command, check_mode=False)
    assert applied["changed"] is True and applied["files"] == ["sglang/srt/algos.py"]
    assert Path(params["backup_root"]).is_dir() and snapshot(fake_venv.site) != before


def test_a_known_good_snapshot_without_sources_or_patch_state_is_refused(params, fake_venv, tmp_path):
    unit = tmp_path / "unit.service"
    unit.write_text("[Service]\n")
    (tmp_path / "unit.d").mkdir()
    root = tmp_path / "kg"
    KnownGoodStore(str(root), backup_root=params["backup_root"]).save(
        {"unit": str(unit)}, str(tmp_path / "unit.d"), {"patch_state_id": "unknown"}
    )
    before = snapshot(fake_venv.site)
    restore = dict(params, state="restored", known_good_snapshot="current", known_good_root=str(root))
    with pytest.raises(SourcePatchError, match="records neither its SGLang sources nor their patch state"):
        run(restore, run_command, check_mode=False)
    assert snapshot(fake_venv.site) == before
