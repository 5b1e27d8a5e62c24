"""Process titles the way setproctitle sets them, and parent-death signals (Linux only, via ctypes).

The title overwrites the process's original argv block (its bounds are fields 48 and 49 of
/proc/self/stat), so /proc/PID/cmdline reads "TITLE\\0" as it does for SGLang's own processes; the
kernel's comm name (/proc/PID/comm, 15 characters) is set with prctl(PR_SET_NAME).
"""

from __future__ import annotations

import ctypes

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
COMM_LENGTH = 15
_ARG_START_FIELD = 48
_STATE_FIELD = 3

# The interpreter links libc, so its global symbols include prctl (no library search, no subprocess).
_libc = ctypes.CDLL(None, use_errno=True)


def _argv_block() -> tuple[int, int]:
    with open("/proc/self/stat", "rb") as handle:
        data = handle.read()
    fields = data[data.rindex(b")") + 2 :].split()
    start = int(fields[_ARG_START_FIELD - _STATE_FIELD])
    end = int(fields[_ARG_START_FIELD + 1 - _STATE_FIELD])
    return start, end


def set_title(title: str) -> None:
    encoded = title.encode()
    start, end = _argv_block()
    size = end - start
    if size >= 2:
        # A non-NUL last byte tells the kernel the block was rewritten: cmdline ends at the first NUL.
        block = (encoded[: size - 1] + b"\0").ljust(size, b" ")
        ctypes.memmove(start, block, size)
    _libc.prctl(PR_SET_NAME, ctypes.c_char_p(encoded[:COMM_LENGTH]), 0, 0, 0)


def set_parent_death_signal(signum: int) -> None:
    """Have the kernel send `signum` to this process when the thread that forked it exits."""
    _libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
