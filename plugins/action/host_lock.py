# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin of llmops.inference.host_lock: run the module, and when it took the lock, start the keeper that
renews it from the controller for as long as the run lives (module_utils/host_lock.py, ``Keeper``).

The run is the controller process that started this task's worker (ansible-playbook, or ansible): the worker is
its child, so the keeper records the worker's parent, with its start time where /proc tells it. The keeper is a
detached grandchild of the worker (it outlives the task) that renews the lock with a small command over the
task's own connection (become included), every renew_period seconds; when the run's process is gone it removes
the lock's renewal file, which makes the holder let go at once; when a renewal finds the lock released or lost it
exits.
"""

from __future__ import annotations

import os
import shlex
from types import SimpleNamespace

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.llmops.inference.plugins.module_utils.host_lock import Keeper, alive_path, start_time

display = Display()


def process_alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` still runs (a zombie does not: a run killed with SIGKILL stays one until its parent reaps it)
    and, where /proc gave its start time, is still the same process."""
    if started is not None:
        return start_time(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def renew_command(path: str, token: str) -> str:
    """Touch the renewal file when it still names ``token``; exit 3 when it does not (the lock is lost)."""
    alive = shlex.quote(alive_path(path))
    return f'[ "$(cat {alive} 2>/dev/null)" = {shlex.quote(token)} ] && touch -c {alive} || exit 3'


def drop_command(path: str, token: str) -> str:
    """Remove the renewal file when it still names ``token``: its holder lets go at its next look."""
    alive = shlex.quote(alive_path(path))
    return f'[ "$(cat {alive} 2>/dev/null)" = {shlex.quote(token)} ] && rm -f {alive}; exit 0'


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(self._execute_module(module_args=self._task.args, task_vars=task_vars))
        args = self._task.args
        taken = (
            not result.get("failed")
            and not self._task.check_mode
            and args.get("state", "present") == "present"
            and not args.get("token")
            and boolean(args.get("keep", True))
            and result.get("token")
        )
        if taken:
            period = float(result.get("renew_period") or args.get("renew_period") or 30)
            result["keeper"] = self._start_keeper(str(args["path"]), result["token"], period)
        return result

    def _start_keeper(self, path: str, token: str, period: float) -> int:
        run_pid = os.getppid()
        run_started = start_time(run_pid)
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the forked keeper
            try:
                os.close(read_end)
                os.setsid()
                keeper = os.fork()
                if keeper:
                    os.write(write_end, str(keeper).encode())
                    os._exit(0)
                self._keep(path, token, period, run_pid, run_started)
            finally:
                os._exit(0)
        os.close(write_end)
        os.waitpid(child, 0)
        with os.fdopen(read_end, "rb") as answer:
            keeper_pid = int(answer.read() or 0)
        display.vvv(f"host_lock: keeper pid {keeper_pid} renews {path} every {period:g} s while pid {run_pid} lives")
        return keeper_pid

    def _keep(self, path, token, period, run_pid, run_started):  # pragma: no cover - the forked keeper
        # Detached from the worker: no stdio, no pipes of the run (a run waiting on its output must not wait for
        # this), and no display queue to the run's process (the worker's queue ends with the worker).
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 65536)
        display._final_q = None

        def execute(command):
            try:
                return self._low_level_execute_command(command, sudoable=True)["rc"]
            except Exception:  # a connection that fails now is retried; the holder's margin covers a short outage
                return None

        run = SimpleNamespace(
            alive=lambda: process_alive(run_pid, run_started),
            # True: renewed; False: the renewal file no longer names this token (lost); None: not asked (retried).
            renew=lambda: {0: True, 3: False}.get(execute(renew_command(path, token))),
            drop=lambda: execute(drop_command(path, token)),
        )
        Keeper(run, period).run()
