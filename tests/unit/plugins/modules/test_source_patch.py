"""The module end to end on a synthetic sglang in a bare venv: arguments, results, check and diff mode, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore
from ansible_collections.llmops.inference.plugins.modules import source_patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "module_utils"))
from sglang_fixture import algos_request, snapshot


def run_module(capsys, args: dict) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        source_patch.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def base_args(fake_venv, tmp_path):
    return algos_request(fake_venv, tmp_path)


def test_check_mode_with_diff_then_apply_then_not_changed(capsys, base_args, fake_venv):
    before = snapshot(fake_venv.site)
    checked = run_module(capsys, {**base_args, "_ansible_check_mode": True, "_ansible_diff": True})
    assert checked["changed"] is True and checked["backup_id"] is None
    assert "+    LLMOPS_DEMO = auto()" in checked["diff"]["prepared"]
    assert snapshot(fake_venv.site) == before

    applied = run_module(capsys, base_args)
    assert applied["changed"] is True and applied["backup_id"].endswith("-demo")
    assert applied["sglang"]["version"] == "0.0.1" and applied["files"] == ["sglang/srt/algos.py"]
    assert "diff" not in applied

    again = run_module(capsys, base_args)
    assert again["changed"] is False and again["state_id"] == applied["state_id"]

    verified = run_module(
        capsys, {"python": base_args["python"], "state": "verified", "backup_root": base_args["backup_root"]}
    )
    assert verified["verify"]["modified"] == ["sglang/srt/algos.py"] and verified["changed"] is False

    restored = run_module(
        capsys, {"python": base_args["python"], "state": "restored", "backup_root": base_args["backup_root"]}
    )
    assert restored["changed"] is True and restored["state_id"] == "pristine"
    assert snapshot(fake_venv.site) == before


def test_state_applied_without_name_is_refused(capsys, base_args):
    args = {key: value for key, value in base_args.items() if key != "name"}
    result = run_module(capsys, {**args, "state": "applied"})
    assert result["failed"] is True and "missing: name" in result["msg"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"patches": ["/nonexistent/x.diff"]}, "patch file /nonexistent/x.diff does not exist on the host"),
        (
            {"replacements": [{"src": "/nonexistent/y.py", "dest": "sglang/y.py"}]},
            "replacement source /nonexistent/y.py does not exist on the host",
        ),
        ({"python": "/usr/bin/does-not-exist"}, "python /usr/bin/does-not-exist is not an executable file"),
        ({"name": None}, "name is required with state=applied"),
        ({"name": "bad name"}, "patch set name 'bad name' is not accepted"),
        ({"state": "restored", "backup_id": "x", "target_state_id": "pristine"}, "mutually exclusive"),
        ({"state": "restored", "backup_id": "20990101T000000Z-none"}, "'20990101T000000Z-none' not found"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_it(capsys, base_args, fake_venv, override, message):
    before = snapshot(fake_venv.site)
    result = run_module(capsys, {**base_args, **override})
    assert result["failed"] is True and not result.get("changed")
    assert message in result["msg"]
    assert snapshot(fake_venv.site) == before


def save_snapshot(root: Path, site: Path, python: str, backup_root: str) -> None:
    unit = root.parent / "unit.service"
    unit.write_text("[Service]\n")
    dropins = root.parent / "unit.d"
    dropins.mkdir(exist_ok=True)
    KnownGoodStore(str(root), backup_root=backup_root).save(
        {"unit": str(unit)}, str(dropins), {"patch_state_id": "x"}, sources={"python": python}
    )


def test_restored_with_a_known_good_snapshot_recreates_its_sources(capsys, base_args, fake_venv, tmp_path):
    applied = run_module(capsys, base_args)
    patched = snapshot(fake_venv.site)
    root = tmp_path / "kg"
    save_snapshot(root, fake_venv.site, base_args["python"], base_args["backup_root"])
    common = {"python": base_args["python"], "state": "restored", "backup_root": base_args["backup_root"]}
    run_module(capsys, {**common, "target_state_id": "pristine"})
    assert snapshot(fake_venv.site) != patched

    kg = {**common, "known_good_root": str(root), "known_good_snapshot": "current"}
    checked = run_module(capsys, {**kg, "_ansible_check_mode": True, "_ansible_diff": True})
    assert checked["changed"] is True and "+    LLMOPS_DEMO = auto()" in checked["diff"]["prepared"]
    assert snapshot(fake_venv.site) != patched

    restored = run_module(capsys, kg)
    assert restored["changed"] is True and restored["state_id"] == applied["state_id"]
    assert snapshot(fake_venv.site) == patched
    assert run_module(capsys, kg)["changed"] is False


def test_a_snapshot_whose_content_is_gone_is_refused_naming_it(capsys, base_args, fake_venv, tmp_path):
    run_module(capsys, base_args)
    root = tmp_path / "kg"
    save_snapshot(root, fake_venv.site, base_args["python"], base_args["backup_root"])
    common = {"python": base_args["python"], "state": "restored", "backup_root": base_args["backup_root"]}
    run_module(capsys, {**common, "target_state_id": "pristine"})
    before = snapshot(fake_venv.site)
    content = KnownGoodStore(str(root)).read("current")["sources"]["files"]["sglang/srt/algos.py"]["sha256"]
    (root / "objects" / content).write_bytes(b"damaged")

    result = run_module(capsys, {**common, "known_good_root": str(root), "known_good_snapshot": "current"})

    assert result["failed"] is True and not result.get("changed")
    assert (
        "the stored content of sglang/srt/algos.py" in result["msg"] and "does not match its checksum" in result["msg"]
    )
    assert snapshot(fake_venv.site) == before


def test_known_good_snapshot_needs_its_root_and_excludes_the_other_targets(capsys, base_args):
    common = {"python": base_args["python"], "state": "restored"}
    missing = run_module(capsys, {**common, "known_good_snapshot": "current"})
    assert missing["failed"] is True and "known_good_root" in missing["msg"]
    both = run_module(
        capsys, {**common, "known_good_snapshot": "current", "known_good_root": "/x", "target_state_id": "pristine"}
    )
    assert both["failed"] is True and "mutually exclusive" in both["msg"]
