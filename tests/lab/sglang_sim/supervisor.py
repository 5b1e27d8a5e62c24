"""The launcher's children: fork them, collect their reports, notice deaths, stop them, or kill the whole tree."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

logger = logging.getLogger("sglang_sim")
POLL_S = 0.1


@dataclass
class Child:
    name: str
    pid: int
    report_fd: int
    buffer: bytes = b""
    reports: list = field(default_factory=list)
    exit_code: int | None = None


class ChildFailed(Exception):
    """A child died or signalled failure (SIGQUIT) while the launcher waited for it."""


class Supervisor:
    def __init__(self) -> None:
        self.children: list[Child] = []
        self.sigquit = False
        self.close_in_children: list[int] = []

    def on_sigquit(self, signum, frame) -> None:
        self.sigquit = True

    def spawn(self, name: str, body: Callable[[int], int]) -> Child:
        """Fork; the child runs body(report_fd) and exits with its return value."""
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.close(read_fd)
                for fd in self.close_in_children + [c.report_fd for c in self.children]:
                    os.close(fd)
                status = body(write_fd)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        os.close(write_fd)
        child = Child(name, pid, read_fd)
        self.children.append(child)
        return child

    def _read_reports(self, timeout: float) -> None:
        open_fds = [c.report_fd for c in self.children if c.report_fd >= 0]
        if not open_fds:
            time.sleep(timeout)
            return
        ready, _writable, _failed = select.select(open_fds, [], [], timeout)
        for child in self.children:
            if child.report_fd not in ready:
                continue
            data = os.read(child.report_fd, 65536)
            if not data:
                os.close(child.report_fd)
                child.report_fd = -1
                continue
            child.buffer += data
            while b"\n" in child.buffer:
                line, child.buffer = child.buffer.split(b"\n", 1)
                child.reports.append(json.loads(line))

    def dead_child(self) -> Child | None:
        """The first child that exited since the last call (reaped), or None."""
        for child in self.children:
            if child.exit_code is not None:
                continue
            try:
                pid, status = os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = child.pid, 0
            if pid:
                child.exit_code = os.waitstatus_to_exitcode(status)
                return child
        return None

    def wait_reports(self) -> list[dict]:
        """Block until every child reported once; raise ChildFailed on SIGQUIT or a child's death."""
        while True:
            if self.sigquit:
                raise ChildFailed("Received sigquit from a child process. It usually means the child failed.")
            self._read_reports(POLL_S)
            if all(c.reports for c in self.children):
                return [c.reports[0] for c in self.children]
            dead = self.dead_child()
            if dead is not None and not dead.reports:
                self._read_reports(0)
                if self.sigquit:
                    continue
                raise ChildFailed(
                    f"Subprocess {dead.name} (pid={dead.pid}) crashed with exit code "
                    f"{dead.exit_code}. Triggering SIGQUIT for cleanup..."
                )

    def alive(self) -> list[Child]:
        while self.dead_child() is not None:
            pass
        return [c for c in self.children if c.exit_code is None]

    def stop(self, grace: float, kill_leftovers: bool) -> list[int]:
        """SIGTERM every child, wait up to `grace`; SIGKILL the rest if asked. Returns PIDs left running."""
        for child in self.alive():
            _signal(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        leftovers = [c.pid for c in self.alive()]
        if leftovers and kill_leftovers:
            for pid in leftovers:
                _signal(pid, signal.SIGKILL)
            while self.alive() and time.monotonic() < deadline + grace:
                time.sleep(POLL_S)
        return leftovers

    def kill_tree_and_exit(self) -> None:
        """SGLang's kill_process_tree(os.getpid()): SIGKILL the children, then this process."""
        for child in self.children:
            if child.exit_code is None:
                _signal(child.pid, signal.SIGKILL)
        for child in self.children:
            if child.exit_code is None:
                _reap(child.pid)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _reap(pid: int) -> None:
    """Wait for a killed child, so it does not linger as a zombie under an init that never reaps."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
