"""The deploy_record module end to end: a read, a write, the way back, and bad input."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore
from ansible_collections.llmops.inference.plugins.modules import deploy_record


def run_module(capsys, args: dict) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        deploy_record.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def args(tmp_path):
    (tmp_path / "sglang.service").write_text("[Service]\n")
    return {
        "name": "sglang",
        "root": str(tmp_path / "deploy"),
        "unit_path": str(tmp_path / "sglang.service"),
        "env_path": str(tmp_path / "sglang.env"),
        "known_good_root": str(tmp_path / "kg"),
        "backup_root": str(tmp_path / "backups"),
        "fingerprint": "f1",
    }


def test_write_then_read_up_to_date_with_check_and_diff(capsys, args, tmp_path):
    (tmp_path / "sglang.service.d").mkdir()
    KnownGoodStore(args["known_good_root"]).save(
        {"unit": args["unit_path"]}, str(tmp_path / "sglang.service.d"), {"patch_state_id": "pristine"}
    )
    written = {**args, "state": "written", "patch_state": "pristine", "sglang_version": "0.5.23"}
    checked = run_module(capsys, {**written, "_ansible_check_mode": True, "_ansible_diff": True})
    assert checked["changed"] is True and checked["diff"]["after"]["fingerprint"] == "f1"
    assert run_module(capsys, {**args, "serving": True})["record"] is None

    assert run_module(capsys, written)["changed"] is True
    assert run_module(capsys, written)["changed"] is False
    read = run_module(capsys, {**args, "serving": True, "way_back": "deploy"})
    assert read["up_to_date"] is True and read["env_sha256"] is None and read["changed"] is False
    assert read["way_back"]["sources_target"] == {"known_good_snapshot": "current"}


def test_require_snapshot_names_what_is_missing(capsys, args):
    result = run_module(capsys, {**args, "require_snapshot": True, "snapshot": "previous"})
    assert result["failed"] is True and "has no previous known-good snapshot" in result["msg"]
    wrong = run_module(capsys, {**args, "way_back": "sideways"})
    assert wrong["failed"] is True and "way_back" in wrong["msg"]
