# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The processes that hold a /dev/nvidia* file open.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

import os

NVIDIA_DEVICE_PREFIX = "/dev/nvidia"


def device_holders(proc_root: str = "/proc") -> dict:
    """{pid: [paths]} of processes with a /dev/nvidia* file open; unreadable fd tables are skipped."""
    holders = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return holders
    for name in names:
        if not name.isdigit():
            continue
        fd_dir = os.path.join(proc_root, name, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        paths = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(NVIDIA_DEVICE_PREFIX):
                paths.add(target)
        if paths:
            holders[int(name)] = sorted(paths)
    return holders
