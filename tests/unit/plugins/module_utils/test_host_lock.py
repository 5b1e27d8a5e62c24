"""The host lock: a detached holder keeps an flock until released, broken, or its lease ends."""

from __future__ import annotations

import time

import pytest

from ansible_collections.llmops.inference.plugins.module_utils import host_lock


@pytest.fixture
def lock_path(tmp_path):
    path = str(tmp_path / "run" / "llmops-test.lock")
    yield path
    # A failed test must not leave a holder process behind.
    holder = host_lock.read_holder(path)
    if holder:
        host_lock.break_lock(path)


def test_acquire_holds_until_released(lock_path):
    record = host_lock.acquire(lock_path, {"play": "one"}, timeout=1, lease=60)
    assert record["token"] and record["pid"] > 1
    assert host_lock.status(lock_path)["held"] is True
    assert host_lock.read_holder(lock_path)["owner"] == {"play": "one"}

    answer = host_lock.release(lock_path, record["token"])

    assert answer == {"released": True, "changed": True, "msg": f"released {lock_path}"}
    assert host_lock.status(lock_path)["held"] is False


def test_second_run_is_refused_and_told_who_holds_it(lock_path):
    host_lock.acquire(lock_path, {"play": "first"}, timeout=1, lease=60)

    with pytest.raises(host_lock.LockBusy) as refused:
        host_lock.acquire(lock_path, {"play": "second"}, timeout=0.2, lease=60)

    assert "play=first" in str(refused.value)
    assert refused.value.holder["owner"] == {"play": "first"}


def test_release_with_another_token_leaves_the_lock(lock_path):
    host_lock.acquire(lock_path, {}, timeout=1, lease=60)

    answer = host_lock.release(lock_path, "not-the-token")

    assert answer["changed"] is False
    assert host_lock.status(lock_path)["held"] is True


def test_lease_ends_the_hold(lock_path):
    host_lock.acquire(lock_path, {}, timeout=1, lease=0.3)
    deadline = time.monotonic() + 5
    while host_lock.status(lock_path)["held"] and time.monotonic() < deadline:
        time.sleep(0.05)

    assert host_lock.status(lock_path)["held"] is False
    assert host_lock.acquire(lock_path, {}, timeout=0, lease=60)["token"]


def test_break_frees_a_lock_held_by_anyone(lock_path):
    host_lock.acquire(lock_path, {"play": "stuck"}, timeout=1, lease=60)

    answer = host_lock.break_lock(lock_path)

    assert answer["changed"] is True and answer["broken"]["owner"] == {"play": "stuck"}
    assert host_lock.status(lock_path)["held"] is False


def test_status_of_a_missing_lock_file(tmp_path):
    assert host_lock.status(str(tmp_path / "absent.lock"))["held"] is False


def test_held_with_knows_the_token_of_the_current_holder(lock_path):
    assert host_lock.held_with(lock_path, "any") is False
    record = host_lock.acquire(lock_path, {}, timeout=1, lease=60)
    assert host_lock.held_with(lock_path, record["token"]) is True
    assert host_lock.held_with(lock_path, "not-the-token") is False
    assert host_lock.held_with(lock_path, "") is False
    host_lock.release(lock_path, record["token"])
    assert host_lock.held_with(lock_path, record["token"]) is False


def test_manage_takes_and_releases_without_reporting_a_change(lock_path):
    taken = host_lock.manage(lock_path, "present", owner={"play": "p"}, timeout=1, lease=60)
    assert taken["changed"] is False and taken["held"] is True and taken["token"]
    released = host_lock.manage(lock_path, "absent", token=taken["token"])
    assert released["released"] is True and released["changed"] is False
    assert host_lock.status(lock_path)["held"] is False


def test_manage_in_check_mode_takes_nothing(lock_path):
    planned = host_lock.manage(lock_path, "present", check_mode=True)
    assert planned["token"] == "" and planned["held"] is False
    assert host_lock.status(lock_path)["held"] is False


def test_manage_breaks_only_when_forced(lock_path):
    host_lock.acquire(lock_path, {"play": "stuck"}, timeout=1, lease=60)
    with pytest.raises(ValueError, match="needs the token of the lock to release, or force=true"):
        host_lock.manage(lock_path, "absent")
    assert host_lock.manage(lock_path, "absent", force=True, check_mode=True)["changed"] is True
    assert host_lock.status(lock_path)["held"] is True
    broken = host_lock.manage(lock_path, "absent", force=True)
    assert broken["changed"] is True and broken["broken"]["owner"] == {"play": "stuck"}
    assert host_lock.status(lock_path)["held"] is False


def test_manage_present_raises_busy_naming_the_holder(lock_path):
    host_lock.acquire(lock_path, {"play": "deploy"}, timeout=1, lease=60)
    with pytest.raises(host_lock.LockBusy, match="play=deploy"):
        host_lock.manage(lock_path, "present", timeout=0.2)
