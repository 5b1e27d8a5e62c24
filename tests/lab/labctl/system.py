"""Small wrappers around the commands the lab runs on the machine that hosts it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence


class LabError(Exception):
    """A failure with a message meant for the person running the lab."""


REQUIRED_TOOLS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "gcc": "gcc",
    "make": "make",
    "ssh-keygen": "openssh-client",
}


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (it mounts overlays, creates veth links and boots containers); run it as root"
        )


def require_tools(tools: Sequence[str] = tuple(REQUIRED_TOOLS)) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        packages = sorted({REQUIRED_TOOLS[tool] for tool in missing})
        raise LabError(
            f"missing tools: {', '.join(missing)}; install them with: apt-get install -y {' '.join(packages)}"
            " (`make lab-deps` does this)"
        )


def run(args: Sequence[str], check: bool = True, capture: bool = True, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=capture, text=True, check=False, **kwargs)
    if check and proc.returncode != 0:
        detail = "\n".join(part.strip() for part in (proc.stdout, proc.stderr) if part and part.strip())
        raise LabError(f"command failed ({proc.returncode}): {' '.join(args)}\n{detail}")
    return proc


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` (created with its directory): labs started side by side share
    the machine's caches and build directories, and each must see them whole."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
