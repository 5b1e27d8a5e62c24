"""The deploy record: one read of a host's state, a write, and the verdicts the fleet playbooks take from them."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.deploy_record import (
    DeployRecordStore,
    RecordError,
    after_deploy,
    handle,
    read_state,
    require_snapshot,
    verdicts,
    way_back,
)
from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import BackupStore


@pytest.fixture
def host(tmp_path):
    """A unit with an environment file, a snapshot store with one snapshot, and the module's parameters."""
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\n")
    env = tmp_path / "sglang.env"
    env.write_text("A=1\n")
    dropins = tmp_path / "sglang.service.d"
    dropins.mkdir()
    known_good = KnownGoodStore(str(tmp_path / "kg"))
    known_good.save({"unit": str(unit), "environment": str(env)}, str(dropins), {"patch_state_id": "pristine"})
    params = {
        "state": "read",
        "name": "sglang",
        "root": str(tmp_path / "deploy"),
        "unit_path": str(unit),
        "env_path": str(env),
        "known_good_root": str(tmp_path / "kg"),
        "backup_root": str(tmp_path / "backups"),
        "fingerprint": "f1",
        "serving": True,
        "snapshot": "current",
        "require_snapshot": False,
        "way_back": None,
        "backup_id": "",
        "before": {},
        "patch_state": "pristine",
        "sglang_version": "0.5.23",
    }
    return params


def written(params, **changes):
    return handle({**params, "state": "written", **changes}, check_mode=False)


def test_a_host_is_up_to_date_only_after_a_recorded_deploy_with_the_same_inputs(host):
    first = handle(host, check_mode=False)
    assert first["record"] is None and first["up_to_date"] is False and first["sources_as_deployed"] is False

    answer = written(host)
    assert answer["changed"] is True and answer["record"]["fingerprint"] == "f1"
    assert oct(os.stat(os.path.join(host["root"], "sglang.json")).st_mode & 0o777) == "0o600"

    read = handle(host, check_mode=False)
    assert read["up_to_date"] is True and read["sources_as_deployed"] is True
    assert handle({**host, "fingerprint": "f2"}, check_mode=False)["up_to_date"] is False
    assert handle({**host, "fingerprint": None}, check_mode=False)["up_to_date"] is False
    assert handle({**host, "serving": False}, check_mode=False)["up_to_date"] is False


def test_any_change_on_the_host_since_the_record_makes_it_not_up_to_date(host, tmp_path):
    written(host)
    with open(host["unit_path"], "a") as handle_:
        handle_.write("# by hand\n")
    assert handle(host, check_mode=False)["up_to_date"] is False

    written(host)
    (tmp_path / "backups" / "20260101T000000Z-demo").mkdir(parents=True)
    (tmp_path / "backups" / "20260101T000000Z-demo" / "manifest.json").write_text("{}")
    read = handle(host, check_mode=False)
    assert read["sources_as_deployed"] is False and read["up_to_date"] is False


def test_a_new_snapshot_since_the_record_means_the_sources_are_not_as_deployed(host, tmp_path):
    written(host)
    store = KnownGoodStore(host["known_good_root"])
    store.save({"unit": host["unit_path"]}, str(tmp_path / "sglang.service.d"), {"patch_state_id": "abc"})
    assert handle(host, check_mode=False)["sources_as_deployed"] is False


def test_writing_in_check_mode_or_twice_changes_nothing(host):
    assert handle({**host, "state": "written"}, check_mode=True)["changed"] is True
    assert not os.path.exists(os.path.join(host["root"], "sglang.json"))
    written(host)
    again = written(host)
    assert again["changed"] is False and again["diff"]["before"] == again["diff"]["after"]


def test_an_unreadable_record_reads_as_none(host):
    os.makedirs(host["root"])
    with open(os.path.join(host["root"], "sglang.json"), "w") as out:
        out.write("{half")
    assert handle(host, check_mode=False)["record"] is None


def test_a_name_that_is_not_a_unit_name_is_refused(host):
    with pytest.raises(RecordError, match=r"name '\.\./x' is not a unit name"):
        handle({**host, "name": "../x"}, check_mode=False)


def test_a_missing_snapshot_is_named_with_the_ones_there_are(host):
    with pytest.raises(RecordError, match=r"has no previous known-good snapshot under .*\(it has: current\)"):
        handle({**host, "require_snapshot": True, "snapshot": "previous"}, check_mode=False)


def test_a_damaged_snapshot_is_refused_naming_the_copy(host):
    copy = os.path.join(host["known_good_root"], "current", "files", "unit")
    with open(copy, "w") as out:
        out.write("tampered\n")
    with pytest.raises(RecordError, match=r"cannot be restored: the copy of .*sglang.service .*does not match"):
        require_snapshot(KnownGoodStore(host["known_good_root"]), "current")


def test_the_state_holds_checksums_summaries_and_the_backups_digest(host, tmp_path):
    state = read_state(
        DeployRecordStore(host["root"], "sglang"),
        host["unit_path"],
        str(tmp_path / "absent.env"),
        KnownGoodStore(host["known_good_root"]),
        BackupStore(host["backup_root"]),
    )
    assert state["env_sha256"] is None and len(state["unit_sha256"]) == 64
    assert state["known_good"]["previous"] is None
    current = state["known_good"]["current"]
    assert current["patch_state_id"] == "pristine" and current["sources_recorded"] is False
    assert set(current["files"]) == {"unit", "environment"}
    assert state["backups_digest"] == BackupStore(host["backup_root"]).digest()


def summary(saved_at, sources=True, patch_state="abc"):
    return {"saved_at": saved_at, "patch_state_id": patch_state, "sources_recorded": sources, "sources_in_place": True}


BEFORE = {"known_good": {"current": summary("t1")}, "patch_state": "abc", "sources_cannot_return": None}


def test_a_deploy_returns_to_the_current_snapshot_or_to_the_latest_backup():
    known_good = {"current": summary("t1"), "previous": None}
    assert way_back("deploy", known_good)["sources_target"] == {"known_good_snapshot": "current"}
    bare = way_back("deploy", {"current": None, "previous": None})
    assert bare["sources_target"] == {"backup_id": "latest"} and bare["snapshot"] == ""


def test_a_rollback_goes_to_its_snapshot_or_before_its_backup():
    known_good = {"current": summary("t2"), "previous": summary("t1", sources=False)}
    back = way_back("rollback", known_good, "previous")
    assert back == {
        "needed": True,
        "snapshot": "previous",
        "sources_target": {"known_good_snapshot": "previous"},
        "sources_label": "patch state abc of the previous known-good snapshot",
        "action": "restart_if_changed",
    }
    by_backup = way_back("rollback", known_good, "previous", backup_id="20261129T162130Z-eagle_lab")
    assert by_backup["snapshot"] == "" and by_backup["sources_target"] == {"backup_id": "20261129T162130Z-eagle_lab"}
    unknown = way_back("rollback", {"current": summary("t2", False, "unknown"), "previous": None}, "current")
    assert unknown["sources_target"] == {} and unknown["snapshot"] == "current"


def test_a_failed_deploy_returns_to_the_snapshot_it_started_with():
    unchanged = way_back("deploy_failed", {"current": summary("t1"), "previous": None}, before=BEFORE)
    assert unchanged["snapshot"] == "current" and unchanged["action"] == "restart"
    # Its gate passed and saved a snapshot before a later step failed: that one is not the way back.
    saved = way_back("deploy_failed", {"current": summary("t2"), "previous": summary("t1")}, before=BEFORE)
    assert saved["snapshot"] == "previous" and saved["sources_target"] == {"known_good_snapshot": "previous"}
    stuck = way_back("deploy_failed", {"current": summary("t1")}, before={**BEFORE, "sources_cannot_return": "why"})
    assert stuck["sources_target"] == {} and stuck["snapshot"] == "current"


def test_a_failed_deploy_without_a_snapshot_stops_the_host_and_puts_the_sources_back():
    before = {"known_good": {}, "patch_state": "pristine", "sources_cannot_return": None}
    back = way_back("deploy_failed", {"current": None, "previous": None}, before=before)
    assert back["action"] == "stop" and back["snapshot"] == ""
    assert back["sources_target"] == {"target_state_id": "pristine"}
    drifted = way_back("deploy_failed", {"current": None}, before={**before, "patch_state": "modified"})
    assert drifted["sources_target"] == {}


def test_a_batch_revert_is_needed_only_when_the_run_saved_a_snapshot():
    kept = way_back("batch_revert", {"current": summary("t1"), "previous": None}, before=BEFORE)
    assert kept["needed"] is False
    saved = way_back("batch_revert", {"current": summary("t2"), "previous": summary("t1")}, before=BEFORE)
    assert saved["needed"] is True and saved["snapshot"] == "previous" and saved["action"] == "restart"
    first = way_back("batch_revert", {"current": summary("t2")}, before={**BEFORE, "known_good": {}})
    assert (
        first["needed"] is True and first["action"] == "stop" and first["sources_target"] == {"target_state_id": "abc"}
    )


def test_an_unknown_way_back_is_refused():
    with pytest.raises(RecordError, match="way_back 'sideways' is not one of deploy, rollback"):
        way_back("sideways", {})


def test_the_record_after_a_deploy_names_what_the_step_left():
    state = {
        "unit_sha256": "u",
        "env_sha256": "e",
        "known_good": {"current": {"saved_at": "t3"}},
        "backups_digest": "d",
    }
    assert after_deploy(state, "f", "abc", "0.5.23") == {
        "fingerprint": "f",
        "unit_sha256": "u",
        "env_sha256": "e",
        "patch_state": "abc",
        "sglang_version": "0.5.23",
        "known_good_saved_at": "t3",
        "backups_digest": "d",
    }
    assert verdicts(
        {**state, "record": after_deploy(state, "f", "abc", "0.5.23"), "known_good": {"current": summary("t3")}},
        "current",
        "f",
        True,
    ) == {"sources_as_deployed": True, "up_to_date": True}


def test_the_record_file_is_plain_json(host):
    written(host)
    with open(os.path.join(host["root"], "sglang.json")) as handle_:
        assert json.load(handle_)["patch_state"] == "pristine"


def test_sources_reinstalled_behind_the_records_back_are_not_as_deployed(host, tmp_path):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    patched = site / "sglang" / "spec_info.py"
    patched.write_text("PATCHED = True\n")
    manifest_path = tmp_path / "kg" / "current" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["sources"] = {
        "base_dir": str(site),
        "digest": "d",
        "files": {"sglang/spec_info.py": {"sha256": hashlib.sha256(b"PATCHED = True\n").hexdigest(), "pristine": "p"}},
    }
    manifest_path.write_text(json.dumps(manifest))
    written(host)
    read = handle(host, check_mode=False)
    assert read["known_good"]["current"]["sources_in_place"] is True and read["up_to_date"] is True

    patched.write_text("PATCHED = False\n")  # the wheel's file again, as a reinstall leaves it
    read = handle(host, check_mode=False)
    assert read["known_good"]["current"]["sources_in_place"] is False
    assert read["sources_as_deployed"] is False and read["up_to_date"] is False
