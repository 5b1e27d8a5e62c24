"""The known_good module end to end: arguments, results, check and diff mode, errors."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.modules import known_good


def run_module(capsys, args: dict) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        known_good.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def unit(tmp_path):
    (tmp_path / "sglang.service").write_text("[Service]\nExecStart=/bin/true\n")
    (tmp_path / "sglang.env").write_text("SGLANG_API_KEY=sk-live-4f1e\n")
    (tmp_path / "sglang.service.d").mkdir()
    return {
        "root": str(tmp_path / "kg"),
        "dropin_dir": str(tmp_path / "sglang.service.d"),
        "files": {"unit": str(tmp_path / "sglang.service"), "environment": str(tmp_path / "sglang.env")},
    }


def test_save_info_and_restore_with_check_and_diff(capsys, unit, tmp_path):
    saved = run_module(capsys, {**unit, "state": "saved", "meta": {"patch_state_id": "pristine"}})
    assert saved["changed"] is True and saved["rotated"] is False
    assert run_module(capsys, {**unit, "state": "saved", "meta": {"patch_state_id": "pristine"}})["changed"] is False

    info = run_module(capsys, {"root": unit["root"]})
    assert info["current"]["patch_state_id"] == "pristine" and info["previous"] is None

    (tmp_path / "sglang.service").write_text("[Service]\nExecStart=/bin/false\n")
    (tmp_path / "sglang.service.d" / "90-extra.conf").write_text("[Service]\n")
    restore = {"root": unit["root"], "dropin_dir": unit["dropin_dir"], "state": "restored"}
    checked = run_module(capsys, {**restore, "_ansible_check_mode": True, "_ansible_diff": True})
    assert checked["changed"] is True and checked["removed"] == [str(tmp_path / "sglang.service.d" / "90-extra.conf")]
    assert "ExecStart=/bin/false" in json.dumps(checked["diff"])
    assert (tmp_path / "sglang.service").read_text().endswith("/bin/false\n")

    done = run_module(capsys, restore)
    assert done["changed"] is True and (tmp_path / "sglang.service").read_text().endswith("/bin/true\n")
    assert done["sources"]["recorded"] is False and "diff" not in done
    assert run_module(capsys, restore)["changed"] is False


def test_bad_input_names_itself_and_changes_nothing(capsys, unit):
    missing = run_module(capsys, {"root": unit["root"], "state": "restored", "dropin_dir": unit["dropin_dir"]})
    assert missing["failed"] is True and "no known-good snapshot 'current'" in missing["msg"]
    no_dir = run_module(capsys, {"root": unit["root"], "state": "restored"})
    assert no_dir["failed"] is True and "dropin_dir" in no_dir["msg"]
    no_files = run_module(capsys, {"root": unit["root"], "state": "saved", "dropin_dir": unit["dropin_dir"]})
    assert no_files["failed"] is True and "files must name the files to record" in no_files["msg"]
    wrong = run_module(capsys, {"root": unit["root"], "state": "restored", "snapshot": "oldest"})
    assert wrong["failed"] is True and "snapshot" in wrong["msg"]
