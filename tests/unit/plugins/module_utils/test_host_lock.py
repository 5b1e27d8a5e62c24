"""The host lock: a detached holder keeps an flock until released, broken, or its run stops renewing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    record = host_lock.acquire(lock_path, {"play": "one"}, timeout=1)
    assert record["token"] and record["pid"] > 1
    assert host_lock.status(lock_path)["held"] is True
    assert host_lock.read_holder(lock_path)["owner"] == {"play": "one"}

    answer = host_lock.release(lock_path, record["token"])

    assert answer == {"released": True, "changed": True, "msg": f"released {lock_path}"}
    assert host_lock.status(lock_path)["held"] is False


def test_second_run_is_refused_and_told_who_holds_it(lock_path):
    host_lock.acquire(lock_path, {"play": "first"}, timeout=1)

    with pytest.raises(host_lock.LockBusy) as refused:
        host_lock.acquire(lock_path, {"play": "second"}, timeout=0.2)

    assert "play=first" in str(refused.value)
    assert refused.value.holder["owner"] == {"play": "first"}


def test_release_with_another_token_leaves_the_lock(lock_path):
    host_lock.acquire(lock_path, {}, timeout=1)

    answer = host_lock.release(lock_path, "not-the-token")

    assert answer["changed"] is False
    assert host_lock.status(lock_path)["held"] is True


def test_a_lock_nobody_renews_is_let_go_and_its_renewal_then_fails(lock_path):
    record = host_lock.acquire(lock_path, {}, timeout=1, period=0.2, margin=0.1)
    deadline = time.monotonic() + 30
    while host_lock.status(lock_path)["held"] and time.monotonic() < deadline:
        time.sleep(0.05)

    assert host_lock.status(lock_path)["held"] is False
    assert not os.path.exists(host_lock.alive_path(lock_path))
    assert host_lock.renew(lock_path, record["token"]) is False
    assert host_lock.acquire(lock_path, {}, timeout=0)["token"]


def test_renew_touches_the_renewal_file_of_the_token_that_holds_it(lock_path):
    record = host_lock.acquire(lock_path, {}, timeout=1)
    alive = host_lock.alive_path(lock_path)
    os.utime(alive, (1, 1))  # as if renewed long ago

    assert host_lock.renew(lock_path, record["token"]) is True
    assert os.stat(alive).st_mtime > 1
    assert host_lock.renew(lock_path, "not-the-token") is False
    host_lock.release(lock_path, record["token"])
    assert host_lock.renew(lock_path, record["token"]) is False
    assert not os.path.exists(alive)


def test_a_broken_lock_tells_its_run_at_the_next_renewal(lock_path):
    record = host_lock.acquire(lock_path, {"play": "one"}, timeout=1)
    host_lock.break_lock(lock_path)
    other = host_lock.acquire(lock_path, {"play": "two"}, timeout=1)

    assert host_lock.renew(lock_path, record["token"]) is False
    assert host_lock.held_with(lock_path, other["token"]) is True
    assert host_lock.renew(lock_path, other["token"]) is True


def test_the_lease_lasts_period_plus_margin_after_the_last_renewal_on_the_holders_clock():
    lease = host_lock.Lease("t", period=30, margin=60, now=1000.0, mtime=5.0)
    assert lease.observe(("t", 5.0), 1089.0) is None
    assert lease.observe(("t", 6.0), 1089.5) is None  # a renewal: a new mtime, whatever its value
    assert lease.observe(("t", 6.0), 1179.0) is None
    assert "did not renew it for 90 s" in lease.observe(("t", 6.0), 1180.0)


def test_the_lease_ignores_the_hosts_wall_clock():
    # An mtime far in the past or future is a renewal as any other: only a change counts, timed on the holder's clock.
    lease = host_lock.Lease("t", period=1, margin=1, now=0.0, mtime=1e9)
    assert lease.observe(("t", 1.0), 1.5) is None
    assert lease.observe(("t", 1.0), 3.0) is None
    assert lease.observe(("t", 1.0), 3.6) is not None


def test_the_lease_ends_when_the_renewal_file_is_gone_or_names_another_holder():
    lease = host_lock.Lease("t", period=30, margin=60, now=0.0, mtime=1.0)
    assert "gone" in lease.observe(None, 1.0)
    assert "another holder" in lease.observe(("u", 1.0), 1.0)


class FakeRun:
    """A clock that moves only when the keeper sleeps, a run that dies at a given time, a lock that can be lost."""

    def __init__(self, dies_at=None, lost_at=None, unreachable=()):
        self.now, self.dies_at, self.lost_at, self.unreachable = 0.0, dies_at, lost_at, unreachable
        self.renewals, self.dropped = [], []

    def alive(self):
        return self.dies_at is None or self.now < self.dies_at

    def renew(self):
        if any(start <= self.now < end for start, end in self.unreachable):
            return None
        if self.lost_at is not None and self.now >= self.lost_at:
            return False
        self.renewals.append(self.now)
        return True

    def sleep(self, seconds):
        self.now += seconds

    def drop(self):
        self.dropped.append(self.now)

    def keeper(self, period=30.0):
        return host_lock.Keeper(self, period, clock=lambda: self.now, sleep=self.sleep)


def test_the_keeper_renews_every_period_while_its_run_lives_and_drops_the_lock_when_it_is_gone():
    run = FakeRun(dies_at=100.0)
    assert run.keeper().run() == "run gone: lock dropped"
    assert run.renewals == [30.0, 60.0, 90.0]
    assert run.dropped == [100.0]


def test_the_keeper_stops_once_the_lock_is_released_or_lost():
    run = FakeRun(lost_at=45.0)
    assert run.keeper().run() == "lock released or lost"
    assert run.renewals == [30.0] and run.now == 60.0 and run.dropped == []


def test_the_keeper_retries_an_unreachable_host_every_poll_until_it_answers():
    run = FakeRun(dies_at=70.0, unreachable=[(30.0, 33.0)])
    run.keeper().run()
    assert run.renewals == [33.0, 63.0]


def test_a_run_killed_blocks_others_at_most_one_period_plus_margin():
    # The keeper's last renewal is at most one period before the run died; the holder lets go period + margin later.
    run = FakeRun(dies_at=119.0)
    run.keeper(period=30.0).run()
    lease = host_lock.Lease("t", period=30, margin=60, now=0.0, mtime=0.0)
    for renewal in run.renewals:
        assert lease.observe(("t", renewal), renewal) is None
    assert lease.observe(("t", run.renewals[-1]), run.dies_at + 30 + 60) is not None


def test_manage_renews_with_the_token_and_fails_once_the_lock_is_lost(lock_path):
    taken = host_lock.manage(lock_path, host_lock.LockRequest("present", timeout=1))
    renewed = host_lock.manage(lock_path, host_lock.LockRequest("present", token=taken["token"]))
    assert renewed["held"] is True and renewed["changed"] is False
    host_lock.break_lock(lock_path)
    with pytest.raises(host_lock.LockError, match=r"no longer held with this token.*the run lost it"):
        host_lock.manage(lock_path, host_lock.LockRequest("present", token=taken["token"]))


def test_acquire_refuses_a_period_that_cannot_be_renewed(lock_path):
    with pytest.raises(ValueError, match="renewal period"):
        host_lock.acquire(lock_path, {}, timeout=1, period=0)


def test_break_frees_a_lock_held_by_anyone(lock_path):
    host_lock.acquire(lock_path, {"play": "stuck"}, timeout=1)

    answer = host_lock.break_lock(lock_path)

    assert answer["changed"] is True and answer["broken"]["owner"] == {"play": "stuck"}
    assert host_lock.status(lock_path)["held"] is False


def test_status_of_a_missing_lock_file(tmp_path):
    assert host_lock.status(str(tmp_path / "absent.lock"))["held"] is False


def test_held_with_knows_the_token_of_the_current_holder(lock_path):
    assert host_lock.held_with(lock_path, "any") is False
    record = host_lock.acquire(lock_path, {}, timeout=1)
    assert host_lock.held_with(lock_path, record["token"]) is True
    assert host_lock.held_with(lock_path, "not-the-token") is False
    assert host_lock.held_with(lock_path, "") is False
    host_lock.release(lock_path, record["token"])
    assert host_lock.held_with(lock_path, record["token"]) is False


def test_manage_takes_and_releases_without_reporting_a_change(lock_path):
    taken = host_lock.manage(lock_path, host_lock.LockRequest("present", owner={"play": "p"}, timeout=1))
    assert taken["changed"] is False and taken["held"] is True and taken["token"]
    released = host_lock.manage(lock_path, host_lock.LockRequest("absent", token=taken["token"]))
    assert released["released"] is True and released["changed"] is False
    assert host_lock.status(lock_path)["held"] is False


def test_manage_in_check_mode_takes_nothing(lock_path):
    planned = host_lock.manage(lock_path, host_lock.LockRequest("present"), check_mode=True)
    assert planned["token"] == "" and planned["held"] is False
    assert host_lock.status(lock_path)["held"] is False


def test_manage_breaks_only_when_forced(lock_path):
    host_lock.acquire(lock_path, {"play": "stuck"}, timeout=1)
    with pytest.raises(ValueError, match="needs the token of the lock to release, or force=true"):
        host_lock.manage(lock_path, host_lock.LockRequest("absent"))
    assert host_lock.manage(lock_path, host_lock.LockRequest("absent", force=True), check_mode=True)["changed"] is True
    assert host_lock.status(lock_path)["held"] is True
    broken = host_lock.manage(lock_path, host_lock.LockRequest("absent", force=True))
    assert broken["changed"] is True and broken["broken"]["owner"] == {"play": "stuck"}
    assert host_lock.status(lock_path)["held"] is False


def test_manage_present_raises_busy_naming_the_holder(lock_path):
    host_lock.acquire(lock_path, {"play": "deploy"}, timeout=1)
    with pytest.raises(host_lock.LockBusy, match="play=deploy"):
        host_lock.manage(lock_path, host_lock.LockRequest("present", timeout=0.2))


# Two runs at once, as real processes -----------------------------------------------------------------------------

# One run of the role as the lock sees it: wait for "go" on stdin, take the lock, hold it, release it; print what
# happened. host_lock is standard library only, so the run loads it from its file, without Ansible.
RUN = """
import json, sys, time, importlib.util
spec = importlib.util.spec_from_file_location("host_lock", sys.argv[1])
host_lock = sys.modules["host_lock"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_lock)
path, name, timeout, hold = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
if len(sys.argv) > 6:
    host_lock.RELEASE_WAIT = float(sys.argv[6])
sys.stdin.readline()
answer = {"name": name, "took": False, "released": None, "busy": None, "error": None}
try:
    record = host_lock.acquire(path, {"run": name}, timeout=timeout)
    answer["took"] = True
    answer["owner_seen"] = host_lock.read_holder(path).get("owner")
    time.sleep(hold)
    answer["releasing"] = time.monotonic()
    answer["released"] = host_lock.release(path, record["token"])["released"]
except host_lock.LockBusy as exc:
    answer["busy"] = str(exc)
except host_lock.LockError as exc:
    answer["error"] = str(exc)
answer["done"] = time.monotonic()
print(json.dumps(answer), flush=True)
"""


def start_run(lock_path, name, timeout, hold, *release_wait):
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUN,
            host_lock.__file__,
            lock_path,
            name,
            str(timeout),
            str(hold),
            *map(str, release_wait),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def race(lock_path, runs, gap=0.02):
    """Start the runs ``(name, timeout, hold[, release_wait])`` together, ``gap`` s apart; their answers by name."""
    procs = [start_run(lock_path, *run) for run in runs]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(gap)
    answers = {}
    for proc in procs:
        out, _err = proc.communicate(timeout=60)
        answer = json.loads(out)
        answers[answer["name"]] = answer
    return answers


@pytest.mark.parametrize("order", [("one", "two"), ("two", "one")])
def test_two_runs_started_together_both_take_the_lock_and_both_release_it(lock_path, order):
    for _attempt in range(10):
        answers = race(lock_path, [(name, 10, 0.3) for name in order])
        for name, answer in answers.items():
            assert answer["error"] is None and answer["busy"] is None, answer
            assert answer["took"] is True and answer["released"] is True, answer
            assert answer["owner_seen"] == {"run": name}
        # The waiter takes the lock the moment the first holder exits: the first release must not wait for it.
        first, second = sorted(answers.values(), key=lambda answer: answer["releasing"])
        assert first["done"] < second["releasing"], (first, second)
        assert host_lock.status(lock_path)["held"] is False


@pytest.mark.parametrize("order", [("one", "two"), ("two", "one")])
def test_a_release_succeeds_while_the_next_run_holds_the_lock_longer_than_the_release_waits(lock_path, order):
    answers = race(lock_path, [(name, 10, 1.0, 0.5) for name in order])
    for answer in answers.values():
        assert answer["error"] is None and answer["took"] is True and answer["released"] is True, answer


@pytest.mark.parametrize("order", [("patient", "impatient"), ("impatient", "patient")])
def test_a_waiter_that_gives_up_says_so_and_the_holder_still_releases(lock_path, order):
    timeouts = {"patient": 10, "impatient": 0.1}
    for _attempt in range(10):
        answers = race(lock_path, [(name, timeouts[name], 0.3) for name in order], gap=0.05)
        assert answers["patient"]["took"] is True, answers
        for answer in answers.values():
            assert answer["error"] is None, answer
            if answer["took"]:
                assert answer["released"] is True, answer
            else:
                assert answer["name"] == "impatient", answer
                assert "is held by run=patient" in answer["busy"] and "gave up after waiting" in answer["busy"]
        assert host_lock.status(lock_path)["held"] is False


def wait_queued(path: str, timeout: float = 30) -> None:
    """Until a process waits for the flock on ``path`` (a blocked entry, ``->``, in /proc/locks)."""
    inode = f":{os.stat(path).st_ino} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/locks", encoding="ascii") as handle:
            if any("->" in line and inode in line for line in handle):
                return
        time.sleep(0.02)
    raise AssertionError(f"nobody queued for {path} in {timeout} s")


def test_break_with_a_run_waiting_frees_the_lock_for_that_run(lock_path):
    host_lock.acquire(lock_path, {"play": "stuck"}, timeout=1)
    waiter = start_run(lock_path, "waiter", 10, 0)
    waiter.stdin.write("go\n")
    waiter.stdin.flush()
    wait_queued(lock_path)

    answer = host_lock.break_lock(lock_path)

    assert answer["changed"] is True and answer["broken"]["owner"] == {"play": "stuck"}
    out, _err = waiter.communicate(timeout=30)
    answer = json.loads(out)
    assert (answer["took"], answer["released"], answer["error"]) == (True, True, None), answer
    assert answer["owner_seen"] == {"run": "waiter"}


def write_record(lock_path, **record):
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "w", encoding="utf-8") as handle:
        json.dump(record, handle)


@pytest.fixture
def stubborn():
    """A process that ignores SIGTERM (a holder that does not let go)."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    code += "print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"  # SIGTERM is ignored from here on
    yield proc
    proc.kill()
    proc.wait()


def test_a_holder_that_does_not_exit_fails_the_release_naming_it(lock_path, stubborn, monkeypatch):
    monkeypatch.setattr(host_lock, "RELEASE_WAIT", 0.3)
    write_record(lock_path, token="t", pid=stubborn.pid)

    with pytest.raises(host_lock.LockError, match=rf"is still held 0.3 s after its holder pid {stubborn.pid} was told"):
        host_lock.release(lock_path, "t")
    os.unlink(lock_path)


def test_a_record_whose_pid_now_names_another_process_signals_nobody(lock_path, stubborn):
    # The holder was killed and its pid reused: the record's start time no longer matches the process.
    write_record(lock_path, token="t", pid=stubborn.pid, pid_start="1")

    assert host_lock.release(lock_path, "t")["released"] is True
    assert stubborn.poll() is None
    os.unlink(lock_path)


def test_the_record_names_when_its_holder_started(lock_path):
    record = host_lock.acquire(lock_path, {}, timeout=1)
    with open(f"/proc/{record['pid']}/stat", encoding="ascii") as handle:
        started = handle.read().rsplit(")", 1)[1].split()[19]
    assert record["pid_start"] == started == host_lock.read_holder(lock_path)["pid_start"]
