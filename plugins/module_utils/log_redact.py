# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The engine's stdout and stderr through a filter that masks its API key before the journal gets them.

Private to the llmops.inference collection; not a public API. The sglang_service role installs this file with
redact.py on the host and runs ``main()`` with the engine's Python as the unit's ExecStart, outside Ansible, so it
needs only the Python standard library::

    python llmops_log_filter.py --secrets-file /etc/llmops/sglang.yaml -- /opt/sglang/venv/bin/sglang serve ...

SGLang logs ``server_args={...}`` with ``api_key`` in clear at every start, at info level, to stderr; under systemd
that is the journal, and whatever ships it. ``main()`` reads the secrets (the ``api-key``/``admin-api-key`` of the
config file SGLang gets with ``--config``, and any given on the command line), makes a pipe for stdout and one for
stderr, and starts the filter as a grandchild that is no descendant of the engine (SGLang kills its own process
tree on the way out, and the filter must outlive it to pass on its last lines). Then it points its stdout and
stderr at the pipes and execs the engine: the engine keeps the PID systemd started, so MainPID, the stop's
drain and the probe see the engine itself. Every process the engine starts writes into the same pipes.

The filter masks each secret (and the API-key forms redact.py knows) line by line, writes to the descriptors the
unit gave it, ignores SIGTERM, SIGINT and SIGHUP, and exits when every writer has closed its end: the stop of the
unit (KillMode=control-group) ends it with the rest, after the engine's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import sys
import time

from ansible_collections.llmops.inference.plugins.module_utils.redact import Redactor

PROG = "llmops-log-filter"
# The process name the filter shows in ps and /proc/PID/comm (at most 15 bytes).
FILTER_COMM = b"llmops-logfilt"
# Config keys that hold secrets, as SGLang's --config file spells them (the flag without its dashes).
SECRET_KEYS = ("api-key", "admin-api-key")
SECRET_FLAGS = tuple(f"--{key}" for key in SECRET_KEYS)
# A line still unfinished after this long, or longer than MAX_PENDING, is passed on as far as it goes (the journal
# joins it with the rest). OVERLAP bytes are kept back so that a secret is never split between two writes.
IDLE_FLUSH_S = 0.5
MAX_PENDING = 1 << 20
OVERLAP = 4096
READ_SIZE = 65536
EXIT_USAGE = 2
EXIT_EXEC_FAILED = 127


class SecretsFileError(Exception):
    pass


def _yaml_scalar(text: str) -> str:
    """A YAML scalar as the role writes it (JSON-quoted), or single-quoted, or plain."""
    text = text.strip()
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    return text.split(" #", 1)[0].strip()


def secrets_from_config(text: str) -> list:
    """The values of the secret keys of a flat ``key: value`` YAML config file (SGLang's ``--config``)."""
    found = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or line[:1].isspace() or line.lstrip().startswith("#"):
            continue
        if key.strip().strip("'\"").replace("_", "-") in SECRET_KEYS:
            try:
                secret = _yaml_scalar(value)
            except ValueError:
                continue
            if secret:
                found.append(secret)
    return found


def read_secrets_file(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as handle:
            return secrets_from_config(handle.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretsFileError(f"cannot read the secrets file {path}: {exc}") from None


def secrets_from_argv(argv: list) -> list:
    """The values of ``--api-key X``, ``--api-key=X`` and their admin forms in a command line."""
    found = []
    for index, arg in enumerate(argv):
        flag, sep, value = arg.partition("=")
        if flag in SECRET_FLAGS:
            if not sep:
                value = argv[index + 1] if index + 1 < len(argv) else ""
            if value:
                found.append(value)
    return found


class LineFilter:
    """Masks secrets in a byte stream; whole lines go through at once, an unfinished one when flushed."""

    def __init__(self, redactor: Redactor):
        self.redactor = redactor
        self.pending = b""
        self.since = None  # when the pending bytes arrived

    def _mask(self, data: bytes) -> bytes:
        text = data.decode("utf-8", "surrogateescape")
        return self.redactor.text(text).encode("utf-8", "surrogateescape")

    def feed(self, data: bytes, now: float) -> bytes:
        """The masked complete lines ``data`` finishes; keeps the rest."""
        if not self.pending:
            self.since = now
        self.pending += data
        cut = self.pending.rfind(b"\n") + 1
        out = b""
        if cut:
            out, self.pending = self._mask(self.pending[:cut]), self.pending[cut:]
            self.since = now
        if len(self.pending) > MAX_PENDING:
            out += self.flush(keep=OVERLAP)
        return out

    def due(self, now: float) -> bool:
        return bool(self.pending) and now - self.since >= IDLE_FLUSH_S

    def flush(self, keep: int = 0) -> bytes:
        """The pending bytes masked, all but the last ``keep``."""
        if len(self.pending) <= keep:
            return b""
        cut = len(self.pending) - keep
        out, self.pending = self._mask(self.pending[:cut]), self.pending[cut:]
        return out


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False once the reader is gone (the lines are then dropped, never the engine's writes)."""
    while data:
        try:
            written = os.write(fd, data)
        except OSError:
            return False
        data = data[written:]
    return True


def pump(streams: dict, redactor: Redactor, clock=time.monotonic) -> None:
    """Copy each read descriptor of ``streams`` ({read fd: write fd}) to its writer, masked, until all end."""
    selector = selectors.DefaultSelector()
    filters = {}
    alive = {}
    for source in streams:
        selector.register(source, selectors.EVENT_READ)
        filters[source] = LineFilter(redactor)
        alive[source] = True
    open_sources = set(streams)
    while open_sources:
        for key, _events in selector.select(timeout=IDLE_FLUSH_S / 2):
            source = key.fd
            try:
                data = os.read(source, READ_SIZE)
            except OSError:
                data = b""
            sink = streams[source]
            if data:
                out = filters[source].feed(data, clock())
            else:
                out = filters[source].flush()
                selector.unregister(source)
                os.close(source)
                open_sources.discard(source)
            if out and alive[source]:
                alive[source] = _write_all(sink, out)
        now = clock()
        for source in open_sources:
            if filters[source].due(now) and alive[source]:
                alive[source] = _write_all(streams[source], filters[source].flush())
    selector.close()


def _name_process(name: bytes) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _run_filter(streams: dict, redactor: Redactor) -> None:
    """The filter's process: never returns."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    _name_process(FILTER_COMM)
    status = 0
    try:
        pump(streams, redactor)
    except BaseException:  # the filter ends without a traceback, which could hold a line
        status = 1
    os._exit(status)


def start_filter(redactor: Redactor) -> tuple:
    """Pipes for stdout and stderr and the filter reading them, detached from this process.

    Returns the write ends (stdout's, stderr's). The filter is a grandchild: its parent exits at once, so it is
    reparented (to systemd) and never a descendant of the process that execs the engine.
    """
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    streams = {out_read: os.dup(1), err_read: os.dup(2)}
    child = os.fork()
    if child == 0:
        try:
            os.close(out_write)
            os.close(err_write)
            if os.fork() == 0:
                _run_filter(streams, redactor)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    for fd in (out_read, err_read, *streams.values()):
        os.close(fd)
    return out_write, err_write


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run a command with its stdout and stderr passed through a filter that masks its secrets.",
    )
    parser.add_argument(
        "--secrets-file",
        action="append",
        default=[],
        metavar="PATH",
        help="a flat YAML config file (SGLang's --config) whose api-key and admin-api-key are masked; repeatable",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]: what to run (exec'd)")
    return parser


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _say(f"{PROG}: no command to run: give it after --")
        return EXIT_USAGE
    secrets = secrets_from_argv(command)
    warnings = []
    for path in args.secrets_file:
        try:
            secrets += read_secrets_file(path)
        except SecretsFileError as exc:
            # The engine reads the same file and fails on it with its own message; the API-key forms are masked still.
            warnings.append(f"{PROG}: {exc}; masking the API-key forms only")
    redactor = Redactor(secrets)
    try:
        out_write, err_write = start_filter(redactor)
    except OSError as exc:
        _say(f"{PROG}: cannot start the log filter ({exc}); not starting {command[0]} unfiltered")
        return 1
    os.dup2(out_write, 1)
    os.dup2(err_write, 2)
    os.close(out_write)
    os.close(err_write)
    for warning in warnings:
        _say(warning)
    # What subprocess restores before an exec: Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays
    # ignored across exec.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        _say(f"{PROG}: cannot run {command[0]}: {exc}")
        return EXIT_EXEC_FAILED
    return EXIT_EXEC_FAILED  # not reached: execvp returns only by raising
