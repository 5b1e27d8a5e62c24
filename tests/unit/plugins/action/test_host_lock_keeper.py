"""The host_lock action plugin's keeper: how it knows its run lives, and the commands that renew and drop a lock."""

from __future__ import annotations

import os
import subprocess
import time

from ansible_collections.llmops.inference.plugins.action.host_lock import drop_command, process_alive, renew_command
from ansible_collections.llmops.inference.plugins.module_utils import host_lock


def test_a_running_process_is_alive_and_a_zombie_or_a_reused_pid_is_not():
    me = os.getpid()
    assert process_alive(me, host_lock.start_time(me)) is True
    assert process_alive(me, "1") is False  # the pid now names another process

    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 60
    while host_lock.start_time(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)  # until it has exited (a zombie: its parent has not reaped it)
    try:
        assert os.path.exists(f"/proc/{child.pid}")
        assert process_alive(child.pid, "123") is False
    finally:
        child.wait()
    assert process_alive(child.pid, None) is False


def run(command: str) -> int:
    return subprocess.run(["sh", "-c", command], check=False).returncode


def test_renewal_touches_the_file_that_names_the_token_and_says_lost_otherwise(tmp_path):
    path = str(tmp_path / "it's a lock.lock")  # quoted for the shell
    alive = host_lock.alive_path(path)
    assert run(renew_command(path, "tok")) == 3  # no renewal file: lost
    with open(alive, "w", encoding="ascii") as handle:
        handle.write("tok\n")
    os.utime(alive, (1, 1))
    assert run(renew_command(path, "tok")) == 0
    assert os.stat(alive).st_mtime > 1
    assert run(renew_command(path, "other")) == 3


def test_a_drop_removes_only_the_renewal_file_of_its_own_token(tmp_path):
    path = str(tmp_path / "x.lock")
    alive = host_lock.alive_path(path)
    with open(alive, "w", encoding="ascii") as handle:
        handle.write("next-holder\n")
    assert run(drop_command(path, "tok")) == 0
    assert os.path.exists(alive)
    assert run(drop_command(path, "next-holder")) == 0
    assert not os.path.exists(alive)
