"""The simulated main process's kill of its tree, entered again by a second SIGQUIT (tp 2: both schedulers fail)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB_DIR))
sys.path.insert(0, str(LAB_DIR / "simgpu"))

from sglang_sim import supervisor  # noqa: E402


def test_a_second_sigquit_inside_the_kill_of_the_tree_kills_it_too(monkeypatch):
    # Every failing scheduler sends SIGQUIT; the handler of the second one runs in the main thread wherever the
    # first handler is, also inside its wait for a child (which holds the children's lock). The process then hung
    # until systemd's stop timeout instead of dying.
    tree = supervisor.Supervisor()
    child = tree.spawn("scheduler_0", lambda report, control: time.sleep(60) or 0, scheduler=True)
    real_waitpid = os.waitpid
    second = []

    def waitpid(pid, options):
        if not second:
            second.append(pid)
            tree.kill_process_tree(include_parent=False)
        return real_waitpid(pid, options)

    monkeypatch.setattr(supervisor.os, "waitpid", waitpid)
    first = threading.Thread(target=tree.kill_process_tree, kwargs={"include_parent": False}, daemon=True)
    try:
        first.start()
        first.join(timeout=10)
        assert not first.is_alive(), "the second kill waited for the first one, which waits for it"
        assert second == [child.pid] and child.exit_code == -signal.SIGKILL
    finally:
        monkeypatch.undo()
        try:
            os.kill(child.pid, signal.SIGKILL)
            os.waitpid(child.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
