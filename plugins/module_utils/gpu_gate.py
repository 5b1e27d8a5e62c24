# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Gates of an inference unit: GPUs free before start (ExecStartPre), server healthy after (ExecStartPost),
and the drain of its stop (ExecStop).

Private to the llmops.inference collection; not a public API. The sglang_service role installs this file
with gpu.py and procs.py on the host and runs ``main()`` with the service's Python, outside Ansible, so it
needs only the Python standard library (and pynvml where present, through gpu.py).

The drain: SGLang drains in-flight requests when its main process alone gets SIGTERM (the tokenizer
manager's sigterm_watchdog: it looks every 5 s, waits while any request it holds is unanswered, sends
ShutdownReq to the schedulers, waits up to 15 s for them to release their GPU memory and exit, then exits 0).
Its schedulers and detokenizer have no SIGTERM handler, so the SIGTERM that systemd sends to the whole group
(KillMode=control-group) kills them at once, the main process's subprocess watchdog takes that for a crash and
SIGKILLs the tree: every in-flight request is cut and the unit ends failed. ``drain`` sends SIGTERM to the
main process only and returns once it has exited, or when the drain budget is spent; only then does systemd
stop what is left of the group. The scheduler's gauges (/metrics) are only logged: they are published every
few decode steps and miss requests just admitted or still being tokenized, so they never say "idle".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from urllib.parse import urlsplit

from ansible_collections.llmops.inference.plugins.module_utils.gpu import GpuQueryError, select_gpus
from ansible_collections.llmops.inference.plugins.module_utils.gpu_query import BACKENDS, query_gpus
from ansible_collections.llmops.inference.plugins.module_utils.in_flight import InFlight, in_flight_of_text
from ansible_collections.llmops.inference.plugins.module_utils.procs import read_process, wait_for

EXIT_PASS = 0
EXIT_REFUSED = 1
EXIT_ERROR = 2
HEALTH_REQUEST_TIMEOUT = 5.0
# How often the readiness gate asks /health: the unit turns active, and the restart chain's gate passes, one poll
# after the engine is ready.
READY_POLL_INTERVAL = 0.1
# The drain looks for the main process's exit this often, and logs what the engine's gauges report this often.
DRAIN_POLL_INTERVAL = 0.1
DRAIN_LOG_INTERVAL = 2.0
METRICS_REQUEST_TIMEOUT = 2.0
ABORT_REQUEST_TIMEOUT = 5.0
# The key in SGLang's --config file (the role's sglang.yaml: `api-key: "<JSON string>"`).
_CONFIG_API_KEY = re.compile(r"^api-key:\s*(?P<value>.+?)\s*$")
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


def held_mib(gpu) -> int | None:
    """What the gate weighs on ``gpu``: memory in use beyond the driver's reservation (NVML v2's ``reserved``), or
    what its listed processes hold where that is more (the figures are read at different moments); None where the
    memory in use is unknown. A board's reservation (hundreds of MiB on an idle H100) never reads as a holder."""
    in_use = gpu.in_use_mib
    if in_use is None:
        return None
    return max(in_use, gpu.listed_mib or 0)


def busy_gpus(gpus: list, threshold_mib: int) -> list:
    """GPUs holding more than ``threshold_mib`` beyond the driver's reservation (unknown use counts as busy)."""
    return [gpu for gpu in gpus if held_mib(gpu) is None or held_mib(gpu) > threshold_mib]


def _held_text(gpu) -> str:
    held = held_mib(gpu)
    if held is None:
        return _unknown_memory(gpu)
    if gpu.reserved_mib is None:
        return f"{held} MiB"
    return f"{held} MiB beyond the driver's {gpu.reserved_mib} MiB reservation"


def _unknown_memory(gpu) -> str:
    errors = "; ".join(error["error"] for error in gpu.errors if error["field"] == "memory")
    return f"unknown memory ({errors})" if errors else "unknown memory"


def refusal_message(unit: str, busy: list, threshold_mib: int, proc_root: str = "/proc") -> str:
    lines = [f"refusing to start {unit}: {len(busy)} GPU(s) hold more than {threshold_mib} MiB"]
    for gpu in busy:
        lines.append(f"{gpu.display} ({gpu.uuid}) uses {_held_text(gpu)}: {describe_holders(gpu, proc_root)}")
    return "\n".join(lines)


def check_gpus_free(
    selectors, threshold_mib: int, wait_seconds: float = 0.0, *, unit: str = "the service", host: GateHost | None = None
) -> tuple:
    """Return ``(passed, message)``; waits up to ``wait_seconds`` for memory still being released.

    Raises GpuQueryError when no backend lists the GPUs and ValueError for an unknown GPU selector.
    """
    host = host or GateHost()
    query = host.query or query_gpus
    seen = {}

    def free() -> bool:
        _backend, gpus = query(backend=host.backend)
        seen["gpus"] = select_gpus(gpus, selectors)
        seen["busy"] = busy_gpus(seen["gpus"], threshold_mib)
        return not seen["busy"]

    if wait_for(free, wait_seconds, interval=0.2, clock=host.clock, sleep=host.sleep):
        used = ", ".join(f"{gpu.display} {_held_text(gpu)}" for gpu in seen["gpus"])
        return True, f"GPUs free for {unit} (at most {threshold_mib} MiB held each): {used}"
    return False, refusal_message(unit, seen["busy"], threshold_mib, host.proc_root)


def http_get(url: str, timeout: float = HEALTH_REQUEST_TIMEOUT) -> tuple:
    """``(status, body)`` of a GET of ``url`` (standard library only: this runs outside Ansible, on the host)."""
    parts = urlsplit(url)
    connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path or "/")
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def http_status(url: str, timeout: float = HEALTH_REQUEST_TIMEOUT) -> int:
    return http_get(url, timeout)[0]


def health_status(url: str, getter=http_status) -> str | None:
    """None when ``url`` answers 2xx, else a short reason (status code or connection error)."""
    try:
        status = getter(url)
    except (OSError, HTTPException) as exc:
        return str(exc) or type(exc).__name__
    return None if 200 <= status < 300 else f"HTTP {status}"


def wait_ready(url: str, timeout: float, main_pid: int | None = None, *, host: GateHost | None = None) -> tuple:
    """Poll ``url`` until it answers 2xx; stop early when ``main_pid`` exits. Return ``(ready, message)``."""
    host = host or GateHost()
    getter, proc_root, clock = host.getter, host.proc_root, host.clock
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

    done = wait_for(ready, timeout, interval=READY_POLL_INTERVAL, clock=clock, sleep=host.sleep)
    waited = clock() - started
    if last["exited"]:
        return False, f"main process {main_pid} exited before {url} answered (after {waited:.1f} s)"
    if done:
        return True, f"{url} healthy after {waited:.1f} s"
    return False, f"{url} not healthy within {timeout:g} s (last answer: {last['reason']})"


def scrape_in_flight(url: str, getter=http_get) -> InFlight | None:
    """What ``url``/metrics says is in flight (in_flight.py); None when it cannot be read or has no such figure."""
    try:
        status, body = getter(url.rstrip("/") + "/metrics", METRICS_REQUEST_TIMEOUT)
    except (OSError, HTTPException):
        return None
    if status != 200:
        return None
    return in_flight_of_text(body.decode("utf-8", "replace"))


def abort_all(url: str, api_key: str | None, timeout: float = ABORT_REQUEST_TIMEOUT) -> str | None:
    """``POST url/abort_request {"abort_all": true}`` with the key; None when SGLang accepted it (200), else why not."""
    parts = urlsplit(url.rstrip("/") + "/abort_request")
    connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("POST", parts.path, json.dumps({"abort_all": True}), headers)
        status = connection.getresponse().status
    except (OSError, HTTPException) as exc:
        return str(exc) or type(exc).__name__
    finally:
        connection.close()
    return None if status == 200 else f"HTTP {status}"


def config_api_key(path: str | None) -> str | None:
    """The ``api-key`` of SGLang's --config file at ``path`` (None without one). Raises ValueError when the file
    cannot be read or its key is not a JSON string: the stop would not be able to abort."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ValueError(f"--config {path}: {exc.strerror or exc}") from None
    for line in lines:
        match = _CONFIG_API_KEY.match(line)
        if match:
            try:
                value = json.loads(match.group("value"))
            except ValueError:
                value = None
            if not isinstance(value, str):
                raise ValueError(f"--config {path}: api-key is not a quoted string")
            return value or None
    return None


@dataclass
class GateHost:
    """What the gate reads and acts through (injectable, for tests): the GPU query and its backend (``query`` None:
    query_gpus), /proc, the clock, the HTTP status of a URL, the in-flight requests of a server, signals."""

    backend: str = "auto"
    query: object = None
    proc_root: str = "/proc"
    clock: object = time.monotonic
    sleep: object = time.sleep
    getter: object = http_status
    scrape: object = scrape_in_flight
    kill: object = os.kill
    abort: object = abort_all
    api_key: str | None = None


def _alive(pid: int, proc_root: str) -> bool:
    proc = read_process(pid, proc_root)
    return proc is not None and proc.is_alive


@dataclass(frozen=True)
class StopBudget:
    """The ExecStop's wait: ``drain`` seconds for SGLang's own drain, then ``tail`` more for its shutdown after the
    last request (its next 5 s drain check, the schedulers' exit after ShutdownReq, the watchdog join, the reaping
    of the tree and uvicorn's shutdown); the tail also follows an abort at the end of the drain budget."""

    drain: float
    tail: float = 0.0


def drain(
    pid: int,
    url: str | None,
    budget,
    *,
    host: GateHost | None = None,
    log=None,
) -> tuple:
    """SIGTERM the main process ``pid`` alone and wait until it exits; return ``(drained, message)``.

    ``budget``: a :class:`StopBudget` (a number: a drain budget with no tail). Drained: the process exited. Every
    DRAIN_LOG_INTERVAL seconds ``log(text)`` is told what ``url``/metrics reports in flight when that changed
    (naming the figure read); the figures never end the wait. When ``budget.drain`` seconds pass with the process
    alive and requests left (or none known), every request is aborted through ``url`` and the wait goes on for
    ``budget.tail`` seconds; when the abort is refused or unanswered, or there is no ``url``, the wait ends there.
    An engine that read no HTTP request left gets the tail without an abort. The abort sends ``host.api_key``.
    """
    host = host or GateHost()
    budget = budget if isinstance(budget, StopBudget) else StopBudget(float(budget))
    clock = host.clock
    log = log or (lambda text: None)
    started = clock()
    if pid <= 0 or not _alive(pid, host.proc_root):
        return True, "no main process to drain"
    try:
        host.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True, f"main process {pid} already gone"
    watch = _DrainWatch(pid, url, host, log, started)
    if watch.wait_exit(started + budget.drain):
        return True, f"main process {pid} exited after {clock() - started:.1f} s"
    seen = f" (last seen: {watch.last})" if watch.last else ""
    spent = f"main process {pid} still draining after the budget of {budget.drain:g} s{seen}"
    aborted, refused = _abort_what_is_left(url, host, spent, budget.tail, log)
    if refused is not None:
        return False, refused
    if watch.wait_exit(clock() + budget.tail):
        return True, f"main process {pid} exited after {clock() - started:.1f} s{aborted}"
    return False, (
        f"main process {pid} still running {clock() - started:.1f} s after the SIGTERM{aborted}; systemd stops the "
        "rest of the unit"
    )


def _abort_what_is_left(url: str | None, host: GateHost, spent: str, tail: float, log) -> tuple:
    """At the end of the drain budget: ``(aborted, refused)``; ``aborted`` the words for the final message when
    every request was aborted, ``refused`` the final message when the wait ends here (no URL, abort not accepted)."""
    reading = host.scrape(url) if url else None
    if reading is not None and reading.live and reading.idle:
        log(f"{spent}; no HTTP request left: waiting up to {tail:g} s for SGLang's shutdown")
        return "", None
    if not url:
        return "", f"{spent}; systemd stops the rest of the unit"
    failed = host.abort(url, host.api_key)
    if failed is not None:
        return "", (
            f"{spent}; POST /abort_request failed ({failed}): the engine is not answering, systemd stops the rest "
            "of the unit"
        )
    log(
        f"{spent}; aborted every request (POST /abort_request abort_all): waiting up to {tail:g} s for SGLang's "
        "shutdown"
    )
    return ", its requests aborted at the end of the drain budget", None


class _DrainWatch:
    """Polls the main process for its exit and logs what /metrics reports in flight when that changes."""

    def __init__(self, pid: int, url: str | None, host: GateHost, log, started: float):
        self.pid, self.url, self.host, self.log = pid, url, host, log
        self.last = None
        self.next_log = started

    def wait_exit(self, deadline: float) -> bool:
        host = self.host
        while True:
            if not _alive(self.pid, host.proc_root):
                return True
            now = host.clock()
            if self.url and now >= self.next_log:
                reading = host.scrape(self.url)
                shown = "no in-flight figure on /metrics" if reading is None else reading.describe()
                if shown != self.last:
                    self.log(f"draining main process {self.pid}: {shown}")
                    self.last = shown
                self.next_log = now + DRAIN_LOG_INTERVAL
            if now >= deadline:
                return False
            host.sleep(min(DRAIN_POLL_INTERVAL, deadline - now))


def _pid(text: str) -> int:
    """``--pid ${MAINPID}``: systemd passes an empty word when the unit has no main process."""
    return int(text) if text.strip() else 0


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
    stop = modes.add_parser("drain", help="SIGTERM the main process alone, wait until it exited (ExecStop)")
    stop.add_argument("--pid", type=_pid, required=True, help="the main process (${MAINPID})")
    stop.add_argument(
        "--url",
        default=None,
        help="the server's base URL: its /metrics is logged while it drains, and requests left at the end of the "
        "drain budget are aborted there",
    )
    stop.add_argument("--timeout", type=float, required=True, help="the drain budget, in seconds")
    stop.add_argument(
        "--tail", type=float, default=0.0, help="seconds more for SGLang's shutdown after its last request or an abort"
    )
    stop.add_argument("--config", default=None, help="SGLang's --config file, whose api-key the abort sends")
    return parser


def main(argv=None, stdout=sys.stdout, stderr=sys.stderr) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.mode == "gpu-free":
            passed, message = check_gpus_free(
                args.gpus, args.threshold_mib, args.wait, unit=args.unit, host=GateHost(backend=args.backend)
            )
        elif args.mode == "drain":
            # A spent budget is not an error of the stop: systemd goes on to stop the rest of the group.
            _drained, message = drain(
                args.pid,
                args.url,
                StopBudget(args.timeout, args.tail),
                host=GateHost(api_key=config_api_key(args.config)),
                log=lambda text: _say(stdout, text),
            )
            stdout.write(f"{PROG} drain: {message}\n")
            return EXIT_PASS
        else:
            passed, message = wait_ready(args.url, args.timeout, args.main_pid or None)
    except (GpuQueryError, ValueError) as exc:
        stderr.write(f"{PROG} {args.mode}: {exc}\n")
        return EXIT_ERROR
    (stdout if passed else stderr).write(f"{PROG} {args.mode}: {message}\n")
    return EXIT_PASS if passed else EXIT_REFUSED


def _say(stream, text: str) -> None:
    stream.write(f"{PROG} drain: {text}\n")
    stream.flush()
