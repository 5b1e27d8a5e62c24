"""Known-good snapshots: save rotates current to previous, restore puts files back byte for byte."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from sglang_fixture import (
    ALGOS_PATCH,
    NEW_MODULE_PATCH,
    SERVER_PATCH,
    SYNTHETIC_FILES,
    make_patcher,
    patch_set,
    run_command,
)

from ansible_collections.llmops.inference.plugins.module_utils import known_good_request
from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore, SnapshotError

SERVER_TO_30002 = SERVER_PATCH.replace(b"+PORT = 30001", b"+PORT = 30002")


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


def test_each_group_restart_is_a_snapshot_of_its_own_even_with_the_same_files(tmp_path, unit):
    """A rank whose files did not change must still rotate with the others: its previous snapshot is then the state
    of the same group restart as every other rank's, and a rollback returns the whole engine to one state."""
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))
    store.save(files, dropins, {"patch_state_id": "pristine", "node_group_restart": "r1"})

    again = store.save(files, dropins, {"patch_state_id": "pristine", "node_group_restart": "r1"})
    assert again["rotated"] is False and again["msg"] == "current snapshot re-verified"
    later = store.save(files, dropins, {"patch_state_id": "pristine", "node_group_restart": "r2"})
    assert later["rotated"] is True
    assert (store.read("previous")["node_group_restart"], store.read("current")["node_group_restart"]) == ("r1", "r2")


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


def test_a_rollback_removes_the_adaptive_config_and_drop_in_the_previous_snapshot_lacks(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))
    store.save(files, dropins, {})
    adaptive = str(tmp_path / "sglang-adaptive.json")
    with open(adaptive, "w") as handle:
        handle.write('{"1": {"candidate_steps": [3, 4]}}\n')
    dropin = os.path.join(dropins, "40-adaptive.conf")
    with open(dropin, "w") as handle:
        handle.write("[Service]\n")
    store.save(dict(files, adaptive_config=adaptive), dropins, {})

    preview = store.restore("previous", dropins, check_mode=True)
    assert sorted(preview["removed"]) == sorted([adaptive, dropin]) and os.path.exists(adaptive)

    answer = store.restore("previous", dropins)

    assert not os.path.exists(adaptive) and not os.path.exists(dropin)
    assert sorted(answer["removed"]) == sorted([adaptive, dropin])
    back = store.restore("current", dropins)  # and forth: the current snapshot brings both back
    assert os.path.exists(adaptive) and os.path.exists(dropin) and back["changed"]


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


# ----- the sources: a synthetic sglang in a bare venv, patched through the source patcher -----


@pytest.fixture
def host(fake_venv, tmp_path, unit):
    """A unit and a synthetic sglang; ``host.save()`` records both, ``host.apply(...)`` patches the sources."""
    fake_venv.clear()
    fake_venv.install(SYNTHETIC_FILES)
    files, dropins = unit

    class Host:
        site = fake_venv.site
        python = fake_venv.python
        backups = tmp_path / "backups"
        root = tmp_path / "kg"
        store = KnownGoodStore(str(tmp_path / "kg"), run_command, str(tmp_path / "backups"))

        def save(self, meta=None, **kwargs):
            return self.store.save(
                files, dropins, meta or {"patch_state_id": "x"}, sources={"python": self.python}, **kwargs
            )

        def apply(self, name, *patches):
            return make_patcher(self.python, self.backups).apply(patch_set(name, *patches))

        def objects(self):
            return sorted(os.listdir(self.root / "objects")) if (self.root / "objects").exists() else []

    return Host()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_snapshot_records_each_changed_file_with_its_content_and_the_wheels_original(host):
    applied = host.apply("demo", ALGOS_PATCH, NEW_MODULE_PATCH)
    patched = (host.site / "sglang" / "srt" / "algos.py").read_bytes()

    sources = host.save({"patch_state_id": applied["state_id"]})["manifest"]["sources"]

    pristine = sha(SYNTHETIC_FILES["sglang/srt/algos.py"])
    created = sha((host.site / "sglang" / "srt" / "extra" / "demo.py").read_bytes())
    assert sources["files"] == {
        "sglang/srt/algos.py": {"sha256": sha(patched), "pristine": pristine},
        "sglang/srt/extra/demo.py": {"sha256": created, "pristine": None},
    }
    assert sources["state_id"] == applied["state_id"] and sources["applied_sets"] == applied["applied_sets"]
    assert sources["sglang_version"] == "0.0.1" and sources["python"] == host.python
    assert sources["pristine_unavailable"] == []
    # The wheel's original came from the sglang_patch backup; every object is its content's sha256.
    assert host.objects() == sorted([sha(patched), pristine, created])
    for name in host.objects():
        assert sha((host.root / "objects" / name).read_bytes()) == name
        assert oct(os.stat(host.root / "objects" / name).st_mode & 0o777) == "0o600"


def test_a_file_changed_by_hand_has_no_original_to_keep(host):
    (host.site / "sglang" / "srt" / "server.py").write_bytes(b"PORT = 1\n")

    sources = host.save()["manifest"]["sources"]

    assert sources["pristine_unavailable"] == ["sglang/srt/server.py"] and sources["state_id"] is None
    assert host.objects() == [sha(b"PORT = 1\n")]


def test_the_same_sources_only_reverify_and_other_sources_rotate(host):
    first = host.save()
    assert first["manifest"]["sources"]["files"] == {} and first["manifest"]["sources"]["state_id"] == "pristine"
    again = host.save()
    assert again["changed"] is False and again["rotated"] is False

    host.apply("demo", ALGOS_PATCH)
    rotated = host.save()  # same unit files and patch_state_id meta: the sources alone make a new state

    assert rotated["changed"] is True and rotated["rotated"] is True
    assert host.store.read("previous")["sources"]["files"] == {}


def test_a_snapshot_saved_without_sources_gains_them_in_place(host, unit):
    files, dropins = unit
    host.apply("demo", ALGOS_PATCH)
    old = host.store.save(files, dropins, {"patch_state_id": "x"})["manifest"]
    assert "sources" not in old

    answer = host.save()

    assert answer["changed"] is True and answer["rotated"] is False and "records its sources now" in answer["msg"]
    current = host.store.read("current")
    assert current["saved_at"] == old["saved_at"] and list(current["sources"]["files"]) == ["sglang/srt/algos.py"]
    assert host.store.read("previous") is None and len(host.objects()) == 2


def test_retention_keeps_what_current_and_previous_need_and_prunes_the_rest(host):
    host.apply("a", ALGOS_PATCH)
    host.save()
    a_patched = sha((host.site / "sglang" / "srt" / "algos.py").read_bytes())
    a_objects = set(host.objects())
    host.apply("b", SERVER_PATCH)
    host.save()
    b_objects = set(host.objects()) - a_objects
    (host.root / "objects" / ("0" * 64)).write_bytes(b"stray")
    (host.root / ".new.leftover").mkdir()

    host.store.prune()
    assert set(host.objects()) == a_objects | b_objects and not (host.root / ".new.leftover").exists()

    host.apply("c", SERVER_TO_30002)
    answer = host.save()

    # a's snapshot is gone: its patched algos.py is no longer needed; b's (now previous) and c's objects stay.
    kept = set(host.objects())
    assert answer["pruned"] and all(name.startswith("objects/") for name in answer["pruned"])
    assert b_objects <= kept and a_patched not in kept
    named = set()
    for which in ("current", "previous"):
        for entry in host.store.read(which)["sources"]["files"].values():
            named |= {value for value in entry.values() if value}
    assert kept == named


def test_a_reverification_puts_back_a_lost_object_from_the_live_files(host):
    host.apply("demo", ALGOS_PATCH)
    host.save()
    patched = sha((host.site / "sglang" / "srt" / "algos.py").read_bytes())
    os.unlink(host.root / "objects" / patched)
    assert host.store.source_problems("current")

    assert host.save()["changed"] is False
    assert host.store.source_problems("current") == []


def test_check_mode_writes_no_snapshot_object_or_cache(host):
    host.apply("demo", ALGOS_PATCH)
    answer = host.save(check_mode=True)
    assert answer["changed"] is True and answer["manifest"]["sources"]["files"]
    assert not host.root.exists()


def test_a_python_without_sglang_saves_the_unit_files_and_says_why(host, fake_venv):
    fake_venv.clear()
    answer = host.save()
    assert answer["changed"] is True and "sources" not in answer["manifest"]
    assert (
        "does not record the SGLang sources" in answer["warnings"][0]
        and "cannot import 'sglang'" in answer["warnings"][0]
    )


def test_a_missing_or_damaged_object_is_named_and_the_restore_changes_nothing(host, unit):
    files, dropins = unit
    host.apply("demo", ALGOS_PATCH)
    host.save()
    content = host.store.read("current")["sources"]["files"]["sglang/srt/algos.py"]["sha256"]
    (host.root / "objects" / content).write_bytes(b"damaged")
    with open(files["unit"], "w") as handle:
        handle.write("changed\n")

    problems = host.store.problems("current")
    assert problems == [
        f"the stored content of sglang/srt/algos.py ({host.root}/objects/{content}) does not match its checksum"
    ]
    with pytest.raises(SnapshotError, match=r"cannot be restored: the stored content of sglang/srt/algos\.py"):
        host.store.restore("current", dropins)
    assert open(files["unit"]).read() == "changed\n"

    os.unlink(host.root / "objects" / content)
    assert "is missing" in host.store.problems("current")[0]


def test_sources_status_lists_what_differs_from_the_snapshot(host):
    host.apply("demo", ALGOS_PATCH)
    host.save()
    install = host.store.locate(host.python)
    assert host.store.sources_status("current", install) == {"recorded": True, "differ": [], "installation": None}

    make_patcher(host.python, host.backups).restore(target_state_id="pristine")
    (host.site / "sglang" / "srt" / "server.py").write_bytes(b"PORT = 1\n")
    status = host.store.sources_status("current", install)
    assert status["differ"] == ["sglang/srt/algos.py", "sglang/srt/server.py"]


def test_the_module_request_hides_the_environment_files_content_from_the_diff(host, unit):
    files, dropins = unit
    host.save()
    with open(files["unit"], "w") as handle:
        handle.write("[Service]\nExecStart=/bin/false\n")
    with open(files["environment"], "w") as handle:
        handle.write("SGLANG_API_KEY=sk-live-4f1e\n")
    params = {
        "root": str(host.root),
        "backup_root": str(host.backups),
        "state": "restored",
        "snapshot": "current",
        "dropin_dir": dropins,
        "python": host.python,
    }

    answer = known_good_request.handle(params, run_command, check_mode=True)

    assert answer["changed"] is True and sorted(answer["restored"]) == sorted(files.values())
    assert answer["sources"]["recorded"] is True and answer["sources"]["differ"] == []
    assert answer["sources"]["source_patch"] == {
        "state": "restored",
        "known_good_root": str(host.root),
        "known_good_snapshot": "current",
    }
    text = json.dumps(answer["diff"])
    assert "ExecStart=/bin/false" in text and "sk-live-4f1e" not in text and "can hold the API key" in text
    assert open(files["environment"]).read() == "SGLANG_API_KEY=sk-live-4f1e\n"

    info = known_good_request.handle({**params, "state": "read"}, run_command, check_mode=False)
    assert info["current"]["files"]["unit"]["path"] == files["unit"] and info["previous"] is None


def test_an_unreadable_manifest_is_named(tmp_path, unit):
    files, dropins = unit
    store = KnownGoodStore(str(tmp_path / "kg"))
    store.save(files, dropins, {})
    (tmp_path / "kg" / "current" / "manifest.json").write_text("{half")
    with pytest.raises(SnapshotError, match=r"the current known-good manifest .*manifest.json is unreadable"):
        store.info()
