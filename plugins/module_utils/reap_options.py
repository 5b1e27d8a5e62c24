# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options of a reap (nvidia_reap, the restart chain's reap step), checked before anything is signalled, and
the host a reap works on (every effect injectable, for tests).

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.device_holders import device_holders
from ansible_collections.llmops.inference.plugins.module_utils.gpu_query import BACKENDS, query_gpus
from ansible_collections.llmops.inference.plugins.module_utils.module_support import PrefixedOptionError, refused_as
from ansible_collections.llmops.inference.plugins.module_utils.procs import send_signal, signal_number
from ansible_collections.llmops.inference.plugins.module_utils.systemd import systemd_booted

DEFAULT_KILL_TIMEOUT = 10.0
DEFAULT_UNACCOUNTED_THRESHOLD_MIB = 1024


class ReapInputError(PrefixedOptionError):
    """An option is invalid; nothing was signalled. The message starts with the option's name."""


class ReapError(Exception):
    """Reaping could not finish; ``result`` holds what was done so far."""

    def __init__(self, message: str, result: dict | None = None):
        self.result = result or {}
        super().__init__(message)


@dataclass
class ReapOptions:
    unit: str | None = None
    allow_active: bool = False
    match: re.Pattern | None = None
    orphans_only: bool = False
    pids: tuple = ()
    gpus: tuple = ()
    include_device_holders: bool = False
    backend: str = "auto"
    signal: int = signal.SIGTERM
    grace: float = 10.0
    wait_released: bool = True
    released_below_mib: int | None = None
    timeout: float = 60.0
    kill_timeout: float = DEFAULT_KILL_TIMEOUT
    unaccounted_threshold_mib: int = DEFAULT_UNACCOUNTED_THRESHOLD_MIB
    fail_on_unreapable: bool = True


def _non_negative(params: dict, option: str, default: float) -> float:
    value = params.get(option)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ReapInputError(option, f"must be a number of seconds >= 0, got {value!r}") from None
    if number < 0:
        raise ReapInputError(option, f"must be >= 0 seconds, got {value!r}")
    return number


def _mib_option(params: dict, option: str, default: int) -> int:
    value = params.get(option)
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ReapInputError(option, f"must be a whole number of MiB >= 0, got {value!r}") from None
    if isinstance(value, bool) or number < 0:
        raise ReapInputError(option, f"must be a whole number of MiB >= 0, got {value!r}")
    return number


def _pids(value) -> tuple:
    pids = []
    for item in value or ():
        try:
            pid = int(str(item).strip())
        except ValueError:
            raise ReapInputError("pids", f"{item!r} is not a process ID; give positive integers") from None
        if pid <= 0:
            raise ReapInputError("pids", f"{pid} is not a process ID; give positive integers")
        if pid == 1:
            raise ReapInputError("pids", "PID 1 (the init system) is never reaped; remove it from the list")
        if pid not in pids:
            pids.append(pid)
    return tuple(pids)


def parse_options(params: dict) -> ReapOptions:
    """Validate the options that need no look at the host; raise ReapInputError naming the option."""
    pids = _pids(params.get("pids"))
    unit = (params.get("unit") or "").strip() or None
    pattern = params.get("match")
    match = None
    if pattern not in (None, ""):
        try:
            match = re.compile(pattern)
        except re.error as exc:
            raise ReapInputError("match", f"{pattern!r} is not a valid regular expression: {exc}") from None
    orphans_only = bool(params.get("orphans_only"))
    if not (unit or match or orphans_only or pids):
        raise ReapInputError(
            "unit",
            "no scope selector given; set at least one of unit, match, orphans_only (true) or pids",
        )
    backend = params.get("backend") or "auto"
    if backend not in BACKENDS:
        raise ReapInputError("backend", f"{backend!r} is not one of {', '.join(BACKENDS)}")
    with refused_as("signal", ReapInputError):
        signum = signal_number(params.get("signal") or "SIGTERM")
    below = params.get("released_below_mib")
    if below is not None and int(below) < 0:
        raise ReapInputError("released_below_mib", f"must be >= 0 MiB, got {below!r}")
    kill_timeout = _non_negative(params, "kill_timeout", DEFAULT_KILL_TIMEOUT)
    if kill_timeout <= 0:
        raise ReapInputError("kill_timeout", f"must be > 0 seconds, got {params.get('kill_timeout')!r}")
    unaccounted = _mib_option(params, "unaccounted_threshold_mib", DEFAULT_UNACCOUNTED_THRESHOLD_MIB)
    return ReapOptions(
        unit=unit,
        allow_active=bool(params.get("allow_active")),
        match=match,
        orphans_only=orphans_only,
        pids=pids,
        gpus=tuple(params.get("gpus") or ()),
        include_device_holders=bool(params.get("include_device_holders")),
        backend=backend,
        signal=signum,
        grace=_non_negative(params, "grace", 10.0),
        wait_released=params.get("wait_released", True) is not False,
        released_below_mib=None if below is None else int(below),
        timeout=_non_negative(params, "timeout", 60.0),
        kill_timeout=kill_timeout,
        unaccounted_threshold_mib=unaccounted,
        fail_on_unreapable=params.get("fail_on_unreapable", True) is not False,
    )


@dataclass
class ReapHost:
    """What a reap reads and acts through: commands, /proc, signals, the clock, the GPU query, the /dev/nvidia*
    holders and whether systemd runs the host."""

    run_command: object = None
    proc_root: str = "/proc"
    own_pid: int = field(default_factory=os.getpid)
    kill: object = send_signal
    clock: object = time.monotonic
    sleep: object = time.sleep
    query: object = query_gpus
    holders: object = device_holders
    booted: object = systemd_booted
