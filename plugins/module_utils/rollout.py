# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The batches of a rolling deploy when some engines span several hosts.

A multi-node engine (one SGLang engine whose ranks run on several hosts) restarts as one, so its hosts are deployed
in one batch, never split across two, and they are in the rollout together: when one member is not up to date, every
member is deployed. A batch takes whole engines in deploy order while they fit in the batch size; an engine larger
than the batch size is a batch of its own.
"""

from __future__ import annotations


class RolloutError(ValueError):
    pass


def batch_size(batch, hosts: int) -> int:
    """Hosts per batch for ``batch`` (a count, or a share such as ``25%``) as Ansible's ``serial`` reads it: a share
    of the hosts, rounded down, at least 1."""
    text = str(batch).strip()
    share = text.endswith("%")
    try:
        value = int(text[:-1] if share else text)
    except ValueError:
        value = 0
    if value < 1 or (share and value > 100):
        raise RolloutError(f"the batch must be a number >= 1 or a share from 1% to 100%, got {batch!r}")
    return max(int(value / 100.0 * hosts), 1) if share else value


def engines(hosts: list, node_groups: dict) -> list:
    """The engines of ``hosts`` in deploy order, each the list of its hosts: a multi-node engine where its first
    member comes, with its members in deploy order; every other host alone."""
    found, seen = [], set()
    for host in hosts:
        if host in seen:
            continue
        group = [member for member in node_groups.get(host) or [] if member != host]
        members = [member for member in hosts if member == host or member in group]
        seen.update(members)
        found.append(members)
    return found


def plan_rollout(hosts: list, batch, node_groups: dict, up_to_date: dict, force: bool = False) -> dict:
    """``rollout`` (the hosts to deploy, in batch order), ``sizes`` (hosts per batch, for ``serial``), ``batches``
    and ``skipped`` (the hosts left as they are: up to date, and every other member of their engine too)."""
    units = engines(hosts, node_groups)
    changing = [unit for unit in units if force or not all(up_to_date.get(host) for host in unit)]
    size = batch_size(batch, sum(len(unit) for unit in changing))
    batches = []
    for unit in changing:
        if batches and len(batches[-1]) + len(unit) <= size:
            batches[-1].extend(unit)
        else:
            batches.append(list(unit))
    rollout = [host for chunk in batches for host in chunk]
    return {
        "rollout": rollout,
        "sizes": [len(chunk) for chunk in batches],
        "batches": batches,
        "skipped": [host for host in hosts if host not in rollout],
    }
