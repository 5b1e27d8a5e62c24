"""Known-good snapshots: save rotates current to previous, restore puts files back byte for byte."""

from __future__ import annotations

import os

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore, SnapshotError


@pytest.fixture
def unit(tmp_path):
    files = {"unit": tmp_path / "sglang.service", "environment": tmp_path / "sglang.env"}
    files["unit"].write_text("[Service]\nExecStart=/bin/true\n")
    files["environment"].write_text("A=1\n")
    os.chmod(files["environment"], 0o600)
    dropins = tmp_path / "sglang.service.d"
    dropins.mkdir()
    return {key: str(path) for key, path in files.items()}, str(dropins)


def test_save_then_same_files_only_reverify(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))

    first = store.save(files, dropins, {"patch_state_id": "pristine"})
    again = store.save(files, dropins, {"patch_state_id": "pristine"})

    assert first["changed"] is True and first["rotated"] is False
    assert again["changed"] is False and again["msg"] == "current snapshot re-verified"
    assert store.info()["previous"] is None


def test_a_new_state_rotates_current_to_previous(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))
    store.save(files, dropins, {"patch_state_id": "pristine"})
    with open(os.path.join(dropins, "50-speculative.conf"), "w") as handle:
        handle.write("[Service]\n")

    answer = store.save(files, dropins, {"patch_state_id": "pristine"})

    assert answer["rotated"] is True
    assert "dropins/50-speculative.conf" in store.read("current")["files"]
    assert "dropins/50-speculative.conf" not in store.read("previous")["files"]


def test_check_mode_saves_nothing(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))

    answer = store.save(files, dropins, {}, check_mode=True)

    assert answer["changed"] is True and store.read("current") is None


def test_restore_puts_back_files_and_removes_new_dropins(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))
    store.save(files, dropins, {})
    with open(files["unit"], "w") as handle:
        handle.write("[Service]\nExecStart=/bin/false\n")
    extra = os.path.join(dropins, "90-extra.conf")
    with open(extra, "w") as handle:
        handle.write("[Service]\n")

    preview = store.restore("current", dropins, check_mode=True)
    assert preview["restored"] == [files["unit"]] and preview["removed"] == [extra]
    assert open(files["unit"]).read().endswith("/bin/false\n")

    answer = store.restore("current", dropins)

    assert answer["changed"] is True
    assert open(files["unit"]).read() == "[Service]\nExecStart=/bin/true\n"
    assert not os.path.exists(extra)
    assert oct(os.stat(files["environment"]).st_mode & 0o777) == "0o600"
    assert store.restore("current", dropins)["changed"] is False


def test_restore_refuses_a_copy_that_does_not_match_its_checksum(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))
    store.save(files, dropins, {})
    with open(tmp_path / "kg" / "current" / "files" / "unit", "w") as handle:
        handle.write("tampered\n")
    with open(files["unit"], "w") as handle:
        handle.write("changed\n")

    with pytest.raises(SnapshotError, match="does not match its checksum"):
        store.restore("current", dropins)
    assert open(files["unit"]).read() == "changed\n"


def test_restore_of_a_missing_snapshot_names_what_exists(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))
    store.save(files, dropins, {})

    with pytest.raises(SnapshotError, match="available: current"):
        store.restore("previous", dropins)


def test_saving_a_missing_file_fails(tmp_path, unit):
    files, dropins = unit
    os.unlink(files["environment"])

    with pytest.raises(SnapshotError, match="does not exist"):
        KnownGoodStore(str(tmp_path / "kg")).save(files, dropins, {})
