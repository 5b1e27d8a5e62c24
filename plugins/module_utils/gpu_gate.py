# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Start gates for an inference unit: GPUs free before start (ExecStartPre), server healthy after (ExecStartPost).

Private to the llmops.inference collection; not a public API. The sglang_service role installs this file
with gpu.py and procs.py on the host and runs ``main()`` with the service's Python, outside Ansible, so it
needs only the Python standard library (and pynvml where present, through gpu.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from urllib.parse import urlsplit

from ansible_collections.llmops.inference.plugins.module_utils.gpu import (
    BACKENDS,
    GpuQueryError,
    query_gpus,
    select_gpus,
)
from ansible_collections.llmops.inference.plugins.module_utils.procs import read_process, wait_for

EXIT_PASS = 0
EXIT_REFUSED = 1
EXIT_ERROR = 2
HEALTH_REQUEST_TIMEOUT = 5.0
# How often the readiness gate asks /health: the unit turns active, and the restart chain's gate passes, one poll
# after the engine is ready.
READY_POLL_INTERVAL = 0.1
PROG = "llmops-gate"


def describe_holders(gpu, proc_root: str = "/proc") -> str:
    """``pid 123 'sglang::scheduler_TP0' 44000 MiB, ...`` for the processes NVML lists on ``gpu``.

    A holder that no longer exists or is a zombie is marked: its memory stays until a GPU reset or a reboot
    unless the driver releases it shortly.
    """
    if not gpu.processes_known:
        errors = "; ".join(error["error"] for error in gpu.errors if error["field"] == "processes")
        return f"process list unavailable ({errors or 'unknown error'})"
    parts = []
    for holder in gpu.processes:
        proc = read_process(holder.pid, proc_root)
        title = proc.title if proc is not None else "?"
        memory = f"{holder.used_mib} MiB" if holder.used_mib is not None else "unknown MiB"
        mark = ""
        if proc is None:
            mark = " (no such process: memory still held by the driver)"
        elif not proc.is_alive:
            mark = f" (zombie, parent {proc.ppid}: memory still held)"
        parts.append(f"pid {holder.pid} {title!r} {memory}{mark}")
    return ", ".join(parts) if parts else "no process listed (another container or PID namespace?)"


def busy_gpus(gpus: list, threshold_mib: int) -> list:
    """GPUs using more than ``threshold_mib`` (a GPU whose use is unknown counts as busy)."""
    return [gpu for gpu in gpus if gpu.used_mib is None or gpu.used_mib > threshold_mib]


def _unknown_memory(gpu) -> str:
    errors = "; ".join(error["error"] for error in gpu.errors if error["field"] == "memory")
    return f"unknown memory ({errors})" if errors else "unknown memory"


def refusal_message(unit: str, busy: list, threshold_mib: int, proc_root: str = "/proc") -> str:
    lines = [f"refusing to start {unit}: {len(busy)} GPU(s) hold more than {threshold_mib} MiB"]
    for gpu in busy:
        used = f"{gpu.used_mib} MiB" if gpu.used_mib is not None else _unknown_memory(gpu)
        lines.append(f"{gpu.display} ({gpu.uuid}) uses {used}: {describe_holders(gpu, proc_root)}")
    return "\n".join(lines)


def check_gpus_free(
    selectors,
    threshold_mib: int,
    wait_seconds: float = 0.0,
    *,
    unit: str = "the service",
    backend: str = "auto",
    query=None,
    proc_root: str = "/proc",
    clock=time.monotonic,
    sleep=time.sleep,
) -> tuple:
    """Return ``(passed, message)``; waits up to ``wait_seconds`` for memory still being released.

    Raises GpuQueryError when no backend lists the GPUs and ValueError for an unknown GPU selector.
    """
    query = query or query_gpus
    seen = {}

    def free() -> bool:
        _backend, gpus = query(backend=backend)
        seen["gpus"] = select_gpus(gpus, selectors)
        seen["busy"] = busy_gpus(seen["gpus"], threshold_mib)
        return not seen["busy"]

    if wait_for(free, wait_seconds, interval=0.2, clock=clock, sleep=sleep):
        used = ", ".join(f"{gpu.display} {gpu.used_mib} MiB" for gpu in seen["gpus"])
        return True, f"GPUs free for {unit} (at most {threshold_mib} MiB used each): {used}"
    return False, refusal_message(unit, seen["busy"], threshold_mib, proc_root)


def http_status(url: str, timeout: float = HEALTH_REQUEST_TIMEOUT) -> int:
    """The status of a GET of ``url`` (standard library only: this runs outside Ansible, on the host)."""
    parts = urlsplit(url)
    connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path or "/")
        return connection.getresponse().status
    finally:
        connection.close()


def health_status(url: str, getter=http_status) -> str | None:
    """None when ``url`` answers 2xx, else a short reason (status code or connection error)."""
    try:
        status = getter(url)
    except (OSError, HTTPException) as exc:
        return str(exc) or type(exc).__name__
    return None if 200 <= status < 300 else f"HTTP {status}"


def wait_ready(
    url: str,
    timeout: float,
    main_pid: int | None = None,
    *,
    getter=http_status,
    proc_root: str = "/proc",
    clock=time.monotonic,
    sleep=time.sleep,
) -> tuple:
    """Poll ``url`` until it answers 2xx; stop early when ``main_pid`` exits. Return ``(ready, message)``."""
    last = {"reason": "not polled yet", "exited": False}
    started = clock()

    def ready() -> bool:
        if main_pid:
            proc = read_process(main_pid, proc_root)
            if proc is None or not proc.is_alive:
                last["exited"] = True
                return True
        last["reason"] = health_status(url, getter)
        return last["reason"] is None

    done = wait_for(ready, timeout, interval=READY_POLL_INTERVAL, clock=clock, sleep=sleep)
    waited = clock() - started
    if last["exited"]:
        return False, f"main process {main_pid} exited before {url} answered (after {waited:.1f} s)"
    if done:
        return True, f"{url} healthy after {waited:.1f} s"
    return False, f"{url} not healthy within {timeout:g} s (last answer: {last['reason']})"


def _gpu_list(text: str) -> list:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    free = modes.add_parser("gpu-free", help="exit 0 only when the GPUs hold at most --threshold-mib each")
    free.add_argument(
        "--gpus", type=_gpu_list, required=True, help="comma-separated GPU indices, GPU- UUIDs or MIG- UUIDs"
    )
    free.add_argument("--threshold-mib", type=int, required=True)
    free.add_argument("--wait", type=float, default=0.0, help="seconds to wait for memory still being released")
    free.add_argument("--backend", choices=BACKENDS, default="auto")
    free.add_argument("--unit", default="the service", help="unit name for the messages")
    ready = modes.add_parser("ready", help="exit 0 once the URL answers 2xx")
    ready.add_argument("--url", required=True)
    ready.add_argument("--timeout", type=float, required=True)
    ready.add_argument(
        "--main-pid", type=int, default=int(os.environ.get("MAINPID") or 0), help="stop when it exits ($MAINPID)"
    )
    return parser


def main(argv=None, stdout=sys.stdout, stderr=sys.stderr) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.mode == "gpu-free":
            passed, message = check_gpus_free(
                args.gpus, args.threshold_mib, args.wait, unit=args.unit, backend=args.backend
            )
        else:
            passed, message = wait_ready(args.url, args.timeout, args.main_pid or None)
    except (GpuQueryError, ValueError) as exc:
        stderr.write(f"{PROG} {args.mode}: {exc}\n")
        return EXIT_ERROR
    (stdout if passed else stderr).write(f"{PROG} {args.mode}: {message}\n")
    return EXIT_PASS if passed else EXIT_REFUSED
