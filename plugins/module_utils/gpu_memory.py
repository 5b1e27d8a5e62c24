# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU memory that no live process holds, which only a GPU reset or a reboot frees, and how it is reported.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.gpu import Gpu


def _mib_text(value) -> str:
    return "unknown" if value is None else str(value)


def stuck_entry(gpu: Gpu, pid, mib, evidence: str, proc=None) -> dict:
    """One piece of memory nobody can free, as the modules report it (``gpu`` is the physical GPU's index)."""
    where = f" on MIG device {gpu.mig_index} ({gpu.uuid})" if gpu.is_mig else ""
    return {
        "gpu": gpu.index,
        "uuid": gpu.uuid,
        "pid": pid,
        "state": proc.state if proc is not None else None,
        "ppid": proc.ppid if proc is not None else None,
        "title": proc.title if proc is not None else None,
        "mib": mib,
        "evidence": evidence + where,
    }


def unlisted_mib(gpu: Gpu) -> int | None:
    """MiB in use on ``gpu`` beyond the driver's reservation that no listed process holds (memory being released,
    memory nobody can free); None where the process list or a figure is unknown. Where the driver does not report
    its reservation apart, the reservation is part of it."""
    listed = gpu.listed_mib
    if listed is None or gpu.in_use_mib is None:
        return None
    return gpu.in_use_mib - listed


def memory_without_live_holder(gpus: list, read_process, threshold_mib: int) -> list:
    """Memory on ``gpus`` that no live process holds, which only a GPU reset or a reboot frees once it lasts.

    ``read_process(pid)`` returns an object with ``state``, ``ppid``, ``title`` and ``is_alive``, or None when the
    PID does not exist. Reported: a listed holder that no longer exists, a listed holder that is a zombie (its
    memory stays when a thread of it is stuck in the driver), and memory in use beyond the driver's reservation that
    no listed process accounts for, more than ``threshold_mib`` (skipped where the process list or a figure is
    unknown, and on a GPU in MIG mode, whose MIG devices are checked instead). A process of another PID namespace
    looks like the first or the last.
    """
    found = []
    for gpu in gpus:
        for holder in gpu.processes:
            proc = read_process(holder.pid)
            memory = f"{_mib_text(holder.used_mib)} MiB"
            if proc is None:
                evidence = f"pid {holder.pid} no longer exists, yet the driver lists it holding {memory}"
                found.append(stuck_entry(gpu, holder.pid, holder.used_mib, evidence))
            elif not proc.is_alive:
                evidence = (
                    f"pid {holder.pid} {proc.title!r} is a zombie (state {proc.state}, parent {proc.ppid}) "
                    f"holding {memory}"
                )
                found.append(stuck_entry(gpu, holder.pid, holder.used_mib, evidence, proc))
        unaccounted = None if gpu.mig_enabled else unlisted_mib(gpu)
        if unaccounted is not None and unaccounted > threshold_mib:
            reserved = "" if gpu.reserved_mib is None else f" beyond the driver's {gpu.reserved_mib} MiB reservation"
            evidence = f"{unaccounted} MiB used{reserved} that no listed process holds (more than {threshold_mib} MiB)"
            found.append(stuck_entry(gpu, None, unaccounted, evidence))
    return found


def reset_message(entries: list) -> str:
    """``GPU 0 needs a reset or a reboot: <evidence>, <evidence>; GPU 1 needs ...`` (a host-wide clause for no GPU)."""
    by_gpu = {}
    for entry in entries:
        by_gpu.setdefault(entry["gpu"], []).append(entry["evidence"])
    clauses = []
    for index in sorted(by_gpu, key=lambda value: (value is None, value)):
        who = "the host" if index is None else f"GPU {index}"
        clauses.append(f"{who} needs a reset or a reboot: {', '.join(by_gpu[index])}")
    return "; ".join(clauses)
