# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible callback for the benchmarks: the wall-clock start and end of the playbook, each play and each task.

Enabled only by ``make bench`` (ANSIBLE_CALLBACK_PLUGINS pointing here, ANSIBLE_CALLBACKS_ENABLED=bench_timer); writes
one JSON file, named by LLMOPS_BENCH_TIMER_OUT, when the playbook ends. Times are ``time.time()`` on the controller,
the clock the lab hosts share with it.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: bench_timer
type: aggregate
short_description: Wall-clock times of the playbook, its plays and its tasks, as JSON for the benchmarks
description:
  - Writes the start and end of the playbook, the start of every play and task, and the start and end of every
    task on every host to the file named by the environment variable C(LLMOPS_BENCH_TIMER_OUT).
requirements:
  - enabled in the configuration (C(callbacks_enabled))
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._out = os.environ.get("LLMOPS_BENCH_TIMER_OUT", "")
        self._data = {"playbook": {"start": None, "end": None}, "plays": [], "task_starts": [], "tasks": []}
        self._running = {}

    def v2_playbook_on_start(self, playbook):
        self._data["playbook"]["start"] = time.time()

    def v2_playbook_on_play_start(self, play):
        self._data["plays"].append({"name": play.get_name(), "start": time.time()})

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._data["task_starts"].append({"name": task.get_name(), "path": task.get_path(), "start": time.time()})

    def v2_runner_on_start(self, host, task):
        self._running[(host.get_name(), task._uuid)] = time.time()

    def _ended(self, result, status):
        host = result._host.get_name()
        task = result._task
        self._data["tasks"].append(
            {
                "host": host,
                "name": task.get_name(),
                "path": task.get_path(),
                "action": task.action,
                "start": self._running.pop((host, task._uuid), None),
                "end": time.time(),
                "status": status,
            }
        )

    def v2_runner_on_ok(self, result):
        self._ended(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._ended(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._ended(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._ended(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        self._data["playbook"]["end"] = time.time()
        if self._out:
            with open(self._out, "w") as handle:
                json.dump(self._data, handle)
