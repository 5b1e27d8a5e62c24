# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Per-host lock of an SGLang unit: an flock held by a detached holder process for as long as its run renews it.

Private to the llmops.inference collection; not a public API. Standard library only.

``acquire`` forks a holder that takes an exclusive flock on the lock file, writes who holds it (owner,
token, holder pid, when, how it is renewed) into the file, writes its token into the renewal file beside it
(``PATH.alive``), reports back and then keeps the flock until ``release`` signals it, or until its run stops
renewing it: each ``renew`` (touching the renewal file) keeps it for ``period + margin`` more seconds. The holder
judges renewals by its own monotonic clock (a changed mtime is a renewal), so a clock step on the host neither
ends nor extends a lease. The kernel drops the flock when the holder exits, however it exits, so a lock outlives
the run that renewed it by at most one period plus the margin, and never a reboot (/run is tmpfs).

Who renews: the run that owns the lock (see ``Keeper``: the host_lock action plugin runs one on the controller for
as long as the ansible-playbook process lives; the restart chain, when it takes the lock itself, renews it from a
thread for as long as the module runs). ``renew`` answers False once the lock is no longer held with the token:
a run that finds its lock lost must stop changing the host.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import signal
import time
from dataclasses import dataclass

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
RELEASE_WAIT = 10.0
# How often the holder looks at its renewal file, and the keeper at its run (seconds).
HOLDER_POLL = 1.0
KEEPER_POLL = 1.0
DEFAULT_PERIOD = 30.0
DEFAULT_MARGIN = 60.0
ALIVE_SUFFIX = ".alive"


class LockError(Exception):
    """The lock could not be taken or released for a reason other than another holder."""


class LockBusy(LockError):
    """Another run holds the lock; ``holder`` is what the lock file says about it."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Timeout


def read_holder(path: str) -> dict:
    """What the lock file says about its holder; {} when it is empty, absent or being rewritten."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read().strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}


def describe(holder: dict) -> str:
    if not holder:
        return "an unknown holder (no owner recorded yet)"
    owner = holder.get("owner") or {}
    who = ", ".join(f"{key}={value}" for key, value in sorted(owner.items())) or "owner not given"
    return (
        f"{who}; since {holder.get('acquired_at', '?')}, renewed every {holder.get('renew_period', '?')} s "
        f"by its run (let go {holder.get('renew_margin', '?')} s after a missed renewal), holder pid "
        f"{holder.get('pid', '?')}"
    )


def alive_path(path: str) -> str:
    """The renewal file of the lock at ``path``: the holder's token, touched by each renewal."""
    return path + ALIVE_SUFFIX


def _alive(path: str):
    """(token, mtime) of the renewal file, or None when there is none."""
    try:
        with open(alive_path(path), encoding="ascii") as handle:
            token = handle.read().strip()
            return token, os.fstat(handle.fileno()).st_mtime
    except (OSError, ValueError):
        return None


class Lease:
    """The holder's view of its lease, on its own monotonic clock: held while the renewal file carries its token
    and was renewed (its mtime changed) less than ``period + margin`` seconds ago."""

    def __init__(self, token: str, period: float, margin: float, now: float, mtime: float | None):
        self.token, self.limit = token, period + margin
        self.renewed, self.mtime = now, mtime

    def observe(self, alive, now: float) -> str | None:
        """Given what the renewal file says now (``(token, mtime)`` or None), None while held, else why it ends."""
        if alive is None:
            return "its renewal file is gone (released or broken)"
        token, mtime = alive
        if token != self.token:
            return "its renewal file names another holder"
        if mtime != self.mtime:
            self.mtime, self.renewed = mtime, now
        if now - self.renewed > self.limit:
            return f"its run did not renew it for {self.limit:g} s (period plus margin)"
        return None


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _flock(fd: int, timeout: float) -> bool:
    """Block on the flock for at most ``timeout`` seconds (an interval timer interrupts the wait)."""
    if timeout <= 0:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except _Timeout:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _write_holder(fd: int, record: dict) -> None:
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _hold(path: str, owner: dict, timeout: float, terms: tuple, report_fd: int) -> None:
    """The holder process: take the flock, report, keep it until signalled or its run stops renewing it
    (``terms``: the renewal period and margin)."""
    period, margin = terms
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    started = time.time()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if not _flock(fd, timeout):
        answer = {"acquired": False, "holder": read_holder(path), "waited_s": round(time.time() - started, 1)}
        os.write(report_fd, json.dumps(answer).encode())
        return
    now = time.time()
    record = {
        "owner": owner,
        "token": secrets.token_hex(16),
        "pid": os.getpid(),
        "pid_start": start_time(os.getpid()),
        "acquired_at": _iso(now),
        "renew_period": period,
        "renew_margin": margin,
    }
    _write_holder(fd, record)
    _write_alive(path, record["token"])
    answer = dict(record, acquired=True, waited_s=round(now - started, 1))
    try:
        os.write(report_fd, json.dumps(answer).encode())
        os.close(report_fd)
    except BrokenPipeError:
        # Whoever asked is gone (its run was killed while waiting): nobody would ever release this.
        _let_go(path, fd, record["token"])
        return
    alive = _alive(path)
    lease = Lease(record["token"], period, margin, time.monotonic(), alive[1] if alive else None)
    while lease.observe(_alive(path), time.monotonic()) is None:
        if signal.sigtimedwait(STOP_SIGNALS, min(HOLDER_POLL, period)) is not None:
            break
    _let_go(path, fd, record["token"])


def _write_alive(path: str, token: str) -> None:
    fd = os.open(alive_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, token.encode("ascii") + b"\n")
    finally:
        os.close(fd)


def _let_go(path: str, fd: int, token: str) -> None:
    """Remove this holder's renewal file and record (the next holder must not read them as its own); the exit
    that follows drops the flock."""
    alive = _alive(path)
    if alive and alive[0] == token:
        try:
            os.unlink(alive_path(path))
        except FileNotFoundError:
            pass
    os.ftruncate(fd, 0)
    os.close(fd)


def _detach() -> None:
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def acquire(
    path: str, owner: dict, timeout: float, period: float = DEFAULT_PERIOD, margin: float = DEFAULT_MARGIN
) -> dict:
    """Wait at most ``timeout`` s for the lock and hold it in a detached process for as long as it is renewed: at
    least every ``period`` s, and it lets go ``period + margin`` s after the last renewal.

    Returns the holder record (``token``, ``pid``, ``acquired_at``, ``renew_period``, ``renew_margin``,
    ``waited_s``, ``msg``); raises LockBusy when another run still holds it after the wait.
    """
    if period <= 0 or margin < 0:
        raise ValueError(f"the renewal period ({period}) must be above 0 and the margin ({margin}) at least 0")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked holder
        os.close(read_end)
        _detach()
        if os.fork() != 0:
            os._exit(0)  # the holder is re-parented away from the run that started it
        try:
            _hold(path, owner, timeout, (period, margin), write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    data = _read_all(read_end)
    os.close(read_end)
    if not data:
        raise LockError(f"the lock holder for {path} exited without answering")
    answer = json.loads(data)
    if not answer["acquired"]:
        raise LockBusy(
            f"{path} is held by {describe(answer['holder'])}; gave up after waiting {answer['waited_s']} s. "
            "A holder left by a killed run lets go one renewal period plus margin after its run's last renewal; "
            "to break it now, run the "
            "llmops.inference.host_lock module with state=absent and force=true",
            answer["holder"],
        )
    answer.pop("acquired")
    answer["msg"] = f"acquired {path} after {answer['waited_s']} s"
    return answer


def start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks after boot, from /proc/PID/stat); None when no live process has it (none, or
    a zombie: a process that has exited and closed its files, the flock's included)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the fields after the command name, from field 3 (state) on
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return fields[19]  # field 22, starttime


def _holder_running(holder: dict) -> bool:
    """Whether the process the record names still runs (and is that process, where the record says when it started)."""
    pid = int(holder.get("pid") or 0)
    if pid <= 1:
        return False
    started = start_time(pid)
    return started is not None and holder.get("pid_start") in (None, started)


def _signal_holder(holder: dict) -> bool:
    """Tell the holder to let go and wait until it has exited: its exit is what drops the flock. A waiting run takes
    the lock at once, so the lock itself says nothing about whether this holder let go."""
    if not _holder_running(holder):
        return True
    try:
        os.kill(int(holder["pid"]), signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + RELEASE_WAIT
    while _holder_running(holder):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def release(path: str, token: str) -> dict:
    """Let go of a lock this run holds with ``token``; a lock held with another token is left alone."""
    holder = read_holder(path)
    if not holder or holder.get("token") != token:
        return {"released": False, "changed": False, "msg": f"{path} is not held with this token"}
    if not _signal_holder(holder):
        raise LockError(
            f"{path} is still held {RELEASE_WAIT:g} s after its holder pid {holder.get('pid')} was told to let go"
        )
    return {"released": True, "changed": True, "msg": f"released {path}"}


def status(path: str) -> dict:
    """Whether the flock is taken right now (a record left by a killed holder does not count)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return {"held": False, "holder": {}, "msg": f"{path} does not exist"}
    try:
        held = not _flock(fd, 0)
    finally:
        os.close(fd)
    holder = read_holder(path) if held else {}
    return {"held": held, "holder": holder, "msg": describe(holder) if held else f"{path} is free"}


def renew(path: str, token: str) -> bool:
    """Renew the lock held with ``token`` (the holder keeps it ``period + margin`` s more); False when it is no
    longer held with that token (released, broken, or let go after missed renewals): its run has lost it."""
    alive = _alive(path)
    if not token or alive is None or alive[0] != token or not held_with(path, token):
        return False
    try:
        os.utime(alive_path(path))
    except FileNotFoundError:
        return False
    return True


def held_with(path: str, token: str) -> bool:
    """Whether the lock is taken right now by the holder that handed out ``token``."""
    return bool(token) and read_holder(path).get("token") == token and status(path)["held"]


def break_lock(path: str) -> dict:
    """Make the current holder let go, whoever it is."""
    holder = read_holder(path)
    if not holder:
        return {"released": False, "changed": False, "msg": f"{path} has no recorded holder"}
    if not _signal_holder(holder):
        raise LockError(
            f"{path} is still held {RELEASE_WAIT:g} s after its holder pid {holder.get('pid')} was told to let go"
        )
    return {"released": True, "changed": True, "broken": holder, "msg": f"broke {path}, held by {describe(holder)}"}


class Keeper:
    """The renewer a run keeps for its lock: renews it every ``period`` s while ``run.alive()`` says the run lives;
    stops when the run is gone (then ``run.drop()`` lets the lock go at once) or when ``run.renew()`` says the lock
    is no longer held with the run's token. ``renew`` answers True (renewed), False (lost) or None (could not ask:
    tried again after ``KEEPER_POLL`` s; the holder lets go by itself if that lasts longer than the margin).

    Every effect and the clock are given, so the loop is tested without time passing."""

    def __init__(self, run, period: float, clock=time.monotonic, sleep=time.sleep):
        self.target, self.period, self.clock, self.sleep = run, period, clock, sleep
        self.poll = min(KEEPER_POLL, period)

    def run(self) -> str:
        """Keep the lock; return why the keeper stopped."""
        due = self.clock() + self.period
        while True:
            if not self.target.alive():
                self.target.drop()
                return "run gone: lock dropped"
            if self.clock() >= due:
                answer = self.target.renew()
                if answer is False:
                    return "lock released or lost"
                if answer is True:
                    due = self.clock() + self.period
            self.sleep(self.poll)


@dataclass
class LockRequest:
    """What the host_lock module asks: take the lock (``present``) for ``owner``, waiting up to ``timeout``, held
    while renewed every ``period`` s (let go ``period + margin`` s after the last renewal); renew it (``present``
    with ``token``); release it with ``token``, or break it with ``force`` (``absent``)."""

    state: str = "present"
    owner: dict | None = None
    timeout: float = 600.0
    period: float = DEFAULT_PERIOD
    margin: float = DEFAULT_MARGIN
    token: str | None = None
    force: bool = False


def _renew_request(path: str, token: str, check_mode: bool) -> dict:
    if check_mode:
        return {"held": held_with(path, token), "token": token, "changed": False, "msg": f"would renew {path}"}
    if not renew(path, token):
        raise LockError(f"{path} is no longer held with this token (now: {status(path)['msg']}): the run lost it")
    return {"held": True, "token": token, "changed": False, "msg": f"renewed {path}"}


def manage(path: str, request: LockRequest, check_mode: bool = False) -> dict:
    """What the host_lock module does: take (``present``), renew (``present`` with ``token``), release (``absent``
    with ``token``) or break (``absent`` with ``force``) the lock. Taking, renewing and releasing change nothing that
    outlasts the run, so only a broken lock reports ``changed``. Raises LockBusy, LockError, or ValueError for a
    request that makes no sense."""
    state, token = request.state, request.token
    if state == "present" and token:
        return _renew_request(path, token, check_mode)
    if state == "present":
        if check_mode:
            now = status(path)
            return dict(now, token="", changed=False, msg=f"check mode: would take {path}; now: {now['msg']}")
        record = acquire(path, request.owner or {}, request.timeout, request.period, request.margin)
        return dict(record, held=True, changed=False)
    if token:
        answer = release(path, token) if not check_mode else {"released": False, "msg": f"would release {path}"}
        return dict(answer, changed=False)
    if not request.force:
        raise ValueError("state=absent needs the token of the lock to release, or force=true to break it")
    if check_mode:
        now = status(path)
        return dict(now, changed=bool(now["held"]), msg=f"check mode: would break {path}; now: {now['msg']}")
    return break_lock(path)
