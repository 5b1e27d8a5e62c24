# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Engine settings that SGLang 0.5.23's graceful shutdown does not serve, refused while the stop relies on it.

Private to the llmops.inference collection; not a public API (the ``drain`` check of the sglang_info module).

The unit's stop relies on SGLang's own drain: the main process answers what it holds, sends ShutdownReq, and the
schedulers leave their loop and release their GPU memory before it exits 0. Three settings break that:

- ``--pp-size`` > 1: pipeline-parallel schedulers run ``event_loop_pp`` (``srt/managers/scheduler_pp_mixin.py``),
  which never checks for ShutdownReq; every stop waits 15 s, then kills them "before they released"
  (``srt/managers/tokenizer_manager.py``);
- ``--tokenizer-worker-num`` > 1 and ``SGLANG_RUST_SERVER``: the API server then has no stop hook
  (``srt/entrypoints/http_server.py`` ``launch_server``), so SIGTERM never reaches the drain.

Each is refused unless the operator accepts it (the reaper then cleans up what the killed schedulers leave).
"""

from __future__ import annotations

ACCEPT_OPTION = "sglang_service_accept_undrained"
PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")
TOKENIZER_FLAGS = ("--tokenizer-worker-num",)
RUST_SERVER = "SGLANG_RUST_SERVER"
ENV_TRUE = ("true", "1", "yes", "y")  # srt/environ.py EnvBool


def _values(args: list, flags: tuple) -> list:
    """The values ``args`` gives any of ``flags`` (``--flag V`` or ``--flag=V``), in order."""
    found = []
    for index, arg in enumerate(args):
        name, sep, value = str(arg).partition("=")
        if name not in flags:
            continue
        if sep:
            found.append((name, value))
        elif index + 1 < len(args):
            found.append((name, str(args[index + 1])))
    return found


def _above_one(value: str) -> bool:
    try:
        return int(value) > 1
    except ValueError:
        return False


def undrained_settings(extra_args, environment) -> list:
    """One line per setting of ``extra_args`` (list) and ``environment`` (dict) that SGLang's drain does not serve."""
    args = list(extra_args or [])
    found = []
    for name, value in _values(args, PP_FLAGS):
        if _above_one(value):
            found.append(
                f"sglang_service_extra_args sets {name} {value}: pipeline-parallel schedulers never read ShutdownReq "
                "(event_loop_pp), so every stop waits 15 s and then kills them before they released their GPU memory"
            )
    for name, value in _values(args, TOKENIZER_FLAGS):
        if _above_one(value):
            found.append(
                f"sglang_service_extra_args sets {name} {value}: with several tokenizer workers SGLang's API server "
                "has no stop hook, so a SIGTERM never reaches its drain and the schedulers are killed unreleased"
            )
    raw = (environment or {}).get(RUST_SERVER)
    if raw is not None and str(raw).strip().lower() in ENV_TRUE:
        found.append(
            f"sglang_service_environment sets {RUST_SERVER}={raw}: SGLang's Rust API server has no stop hook, so a "
            "SIGTERM never reaches its drain and the schedulers are killed unreleased"
        )
    return found


def refusals(extra_args, environment, accepted: bool) -> list:
    """The preflight refusals: each undrained setting, with what to do; none when ``accepted``."""
    if accepted:
        return []
    return [
        f"{line}. The unit's stop relies on SGLang's graceful drain, which cannot serve this setting: drop it, or set "
        f"{ACCEPT_OPTION}: true to accept that every stop kills the schedulers before they release (the restart's "
        "reaper then frees their GPU memory) and that requests in flight are cut"
        for line in undrained_settings(extra_args, environment)
    ]
