# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Per-host lock of an SGLang unit: an flock held by a detached holder process with a lease.

Private to the llmops.inference collection; not a public API. Standard library only.

``acquire`` forks a holder that takes an exclusive flock on the lock file, writes who holds it (owner,
token, holder pid, acquired/lease-until times) into the file, reports back and then keeps the flock
until ``release`` signals it or its lease ends. The kernel drops the flock when the holder exits, however
it exits, so a lock outlives a killed Ansible run by at most its lease, and never a reboot (/run is tmpfs).
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
        f"{who}; since {holder.get('acquired_at', '?')}, lease until {holder.get('lease_until', '?')}, "
        f"holder pid {holder.get('pid', '?')}"
    )


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


def _hold(path: str, owner: dict, timeout: float, lease: float, report_fd: int) -> None:
    """The holder process: take the flock, report, keep it until signalled or the lease ends."""
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
        "pid_start": _start_time(os.getpid()),
        "acquired_at": _iso(now),
        "lease_until": _iso(now + lease),
        "lease_until_epoch": int(now + lease),
    }
    _write_holder(fd, record)
    answer = dict(record, acquired=True, waited_s=round(now - started, 1))
    try:
        os.write(report_fd, json.dumps(answer).encode())
        os.close(report_fd)
    except BrokenPipeError:
        # Whoever asked is gone (its run was killed while waiting): nobody would ever release this.
        os.ftruncate(fd, 0)
        return
    signal.sigtimedwait(STOP_SIGNALS, lease)
    os.ftruncate(fd, 0)  # the next holder must not read this one's record as its own
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


def acquire(path: str, owner: dict, timeout: float, lease: float) -> dict:
    """Wait at most ``timeout`` s for the lock and hold it for at most ``lease`` s in a detached process.

    Returns the holder record (``token``, ``pid``, ``acquired_at``, ``lease_until``, ``waited_s``, ``msg``);
    raises LockBusy when another run still holds it after the wait.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked holder
        os.close(read_end)
        _detach()
        if os.fork() != 0:
            os._exit(0)  # the holder is re-parented away from the run that started it
        try:
            _hold(path, owner, timeout, lease, write_end)
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
            "A holder left by a killed run lets go when its lease ends; to break it now, run the "
            "llmops.inference.host_lock module with state=absent and force=true",
            answer["holder"],
        )
    answer.pop("acquired")
    answer["msg"] = f"acquired {path} after {answer['waited_s']} s"
    return answer


def _start_time(pid: int) -> str | None:
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
    started = _start_time(pid)
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


@dataclass
class LockRequest:
    """What the host_lock module asks: take the lock (``present``) for ``owner``, waiting up to ``timeout`` and
    holding it at most ``lease`` seconds; or release it with ``token``, or break it with ``force`` (``absent``)."""

    state: str = "present"
    owner: dict | None = None
    timeout: float = 600.0
    lease: float = 3600.0
    token: str | None = None
    force: bool = False


def manage(path: str, request: LockRequest, check_mode: bool = False) -> dict:
    """What the host_lock module does: take (``present``), release (``absent`` with ``token``) or break
    (``absent`` with ``force``) the lock. Taking and releasing change nothing that outlasts the run, so only a
    broken lock reports ``changed``. Raises LockBusy, LockError, or ValueError for a request that makes no sense."""
    state, token = request.state, request.token
    if state == "present":
        if check_mode:
            now = status(path)
            return dict(now, token="", changed=False, msg=f"check mode: would take {path}; now: {now['msg']}")
        return dict(acquire(path, request.owner or {}, request.timeout, request.lease), held=True, changed=False)
    if token:
        answer = release(path, token) if not check_mode else {"released": False, "msg": f"would release {path}"}
        return dict(answer, changed=False)
    if not request.force:
        raise ValueError("state=absent needs the token of the lock to release, or force=true to break it")
    if check_mode:
        now = status(path)
        return dict(now, changed=bool(now["held"]), msg=f"check mode: would break {path}; now: {now['msg']}")
    return break_lock(path)
