"""The main process's children: start them, wait for the schedulers to load, watch them, stop them, kill the tree.

Follows sglang/srt/entrypoints/engine.py (`_wait_for_scheduler_ready`, `_scheduler_died_error`: a scheduler that
dies while loading is found by a 5 s poll and raises in the main process), sglang/srt/utils/watchdog.py
(`SubprocessWatchdog`: every 1.0 s, a child that exited with a non-zero code is a crash, logged as
"Subprocess NAME (pid=P) crashed with exit code C. Triggering SIGQUIT for cleanup..." before the main process
sends itself SIGQUIT) and sglang/srt/utils/common.py (`kill_process_tree`: SIGKILL every child; with
include_parent the process then SIGKILLs itself; without it, it waits up to 60 s for the children to be reaped).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from . import gpu_claims

logger = logging.getLogger("sglang_sim")
READY_POLL_S = 5.0  # _wait_for_scheduler_ready: pipe.poll(timeout=5.0)
WATCHDOG_INTERVAL_S = 1.0  # SubprocessWatchdog(interval=1.0)
REAP_TIMEOUT_S = 60.0  # kill_process_tree(wait_timeout=60)
SHUTDOWN = b"shutdown\n"


@dataclass
class Child:
    name: str
    pid: int
    report_fd: int
    control_fd: int
    scheduler: bool
    escapes_kill: bool = False
    buffer: bytes = b""
    reports: list = field(default_factory=list)
    exit_code: int | None = None


class Supervisor:
    def __init__(self) -> None:
        self.children: list[Child] = []
        self.close_in_children: list[int] = []
        self._watchdog_stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        # Re-entrant: a second SIGQUIT's handler (kill_process_tree) runs in the main thread wherever the first
        # handler is, also inside poll().
        self._lock = threading.RLock()

    # -- starting ---------------------------------------------------------------------------------------------
    def spawn(self, name: str, body: Callable[[int, int], int], scheduler: bool, escapes_kill: bool = False) -> Child:
        """Fork; the child runs body(report_fd, control_fd) with default signal handling and exits with its status.

        SGLang's children are fresh spawn-method interpreters: nothing of the parent's signal handling survives.
        """
        report_r, report_w = os.pipe()
        control_r, control_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                for signum in (signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                os.close(report_r)
                os.close(control_w)
                for fd in self.close_in_children:
                    os.close(fd)
                for other in self.children:
                    os.close(other.report_fd)
                    os.close(other.control_fd)
                status = body(report_w, control_r)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        os.close(report_w)
        os.close(control_r)
        child = Child(name, pid, report_r, control_w, scheduler, escapes_kill)
        self.children.append(child)
        return child

    @property
    def schedulers(self) -> list[Child]:
        return [c for c in self.children if c.scheduler]

    def _read_report(self, child: Child, timeout: float) -> str:
        """'report', 'eof' or 'timeout' for one child's pipe."""
        ready, _w, _x = select.select([child.report_fd], [], [], timeout)
        if not ready:
            return "timeout"
        data = os.read(child.report_fd, 65536)
        if not data:
            return "eof"
        child.buffer += data
        while b"\n" in child.buffer:
            line, child.buffer = child.buffer.split(b"\n", 1)
            child.reports.append(json.loads(line))
        return "report" if child.reports else self._read_report(child, timeout)

    def wait_ready(self) -> list[dict]:
        """Every scheduler's load report, in rank order; RuntimeError as SGLang raises when one died."""
        reports = []
        for rank, child in enumerate(self.schedulers):
            while not child.reports:
                outcome = self._read_report(child, READY_POLL_S)
                if outcome == "eof":
                    raise self._died_error(rank, child)
                if outcome == "timeout":
                    for other_rank, other in enumerate(self.schedulers):
                        if self.poll(other) is not None:
                            raise self._died_error(other_rank, other)
            reports.append(child.reports[0])
        return reports

    def _died_error(self, rank: int, child: Child) -> RuntimeError:
        deadline = time.monotonic() + 10  # proc.join(timeout=10)
        while self.poll(child) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return RuntimeError(
            f"Rank {rank} scheduler died during initialization (exit code: {child.exit_code}). "
            "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
            "Run `dmesg -T | grep -i oom` to check."
        )

    # -- watching ---------------------------------------------------------------------------------------------
    def poll(self, child: Child) -> int | None:
        """The child's exit code once it has exited (reaping it, as multiprocessing's is_alive() does)."""
        with self._lock:
            if child.exit_code is None:
                try:
                    pid, status = os.waitpid(child.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = child.pid, 0
                if pid and child.exit_code is None:  # a nested poll() may have reaped it meanwhile
                    child.exit_code = os.waitstatus_to_exitcode(status)
                    gpu_claims.mark_exiting(child.pid)
            return child.exit_code

    def start_watchdog(self) -> None:
        self._watchdog = threading.Thread(target=self._watch, name="subprocess-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._watchdog_stop.wait(WATCHDOG_INTERVAL_S):
            for child in self.children:
                code = self.poll(child)
                if code is None or code == 0:
                    continue
                logger.error(
                    "Subprocess %s (pid=%d) crashed with exit code %s. Triggering SIGQUIT for cleanup...",
                    child.name,
                    child.pid,
                    code,
                )
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    def stop_watchdog(self) -> None:
        self._watchdog_stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=WATCHDOG_INTERVAL_S * 2)

    # -- stopping ---------------------------------------------------------------------------------------------
    def send_shutdown(self) -> None:
        """ShutdownReq: the schedulers leave their event loop and exit."""
        for child in self.schedulers:
            try:
                os.write(child.control_fd, SHUTDOWN)
            except OSError:
                pass

    def live_schedulers(self) -> list[Child]:
        return [c for c in self.schedulers if self.poll(c) is None]

    def kill_process_tree(self, include_parent: bool) -> None:
        """SIGKILL every child (those that escaped the tree aside); then this process, or wait for their reaping."""
        pid = os.getpid()
        logger.info("kill_process_tree called: parent_pid=%d, include_parent=%s, pid=%d", pid, include_parent, pid)
        killed = []
        for child in self.children:
            if child.escapes_kill or self.poll(child) is not None:
                continue
            try:
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child)
            except ProcessLookupError:
                pass
        if include_parent:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while any(self.poll(c) is None for c in killed) and time.monotonic() < deadline:
            time.sleep(0.02)
