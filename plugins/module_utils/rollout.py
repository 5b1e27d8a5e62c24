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


# What a run does to a host, for the records of the hosts it held back.
WAY = {"deploy": "deployed", "rollback": "rolled back"}


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


def preflight_verdict(hosts: list, state: dict, purpose: str, require_all_reachable: bool = False) -> dict:
    """What a rolling run does after its preflight, and a record for every host it holds back.

    ``hosts``: every host the preflight targeted, in order. ``state``: per host that answered, ``passed`` (its
    preflight finished), ``refusal`` (why its preflight failed, or None) and ``node_group`` (its members, or []); a
    host missing from ``state`` (or with neither) was not reached. ``purpose``: deploy or rollback.

    A deploy is refused whole when any host failed its preflight or was not reached; so is a rollback when a host
    failed its preflight, or, with ``require_all_reachable``, was not reached. Otherwise a rollback goes on without
    the unreachable hosts and without every member of a node group that has one (a group returns whole).

    Returns ``go`` (the hosts that go on, in order), ``refused`` (bool), ``note`` (one line for the summary: what
    was held back and why; '' when nothing was) and ``records`` (``{host: {outcome, detail}}`` for each host held
    back: ``refused``, ``unreachable`` or ``skipped``)."""
    state = state or {}
    passed = [host for host in hosts if (state.get(host) or {}).get("passed")]
    refusals = {host: state[host]["refusal"] for host in hosts if (state.get(host) or {}).get("refusal")}
    unreachable = [host for host in hosts if host not in passed and host not in refusals]
    refused = bool(refusals) or (bool(unreachable) and (purpose != "rollback" or require_all_reachable))
    if refused:
        reasons = [f"{host} unreachable" for host in unreachable]
        reasons += [f"{host} failed its preflight: {why}" for host, why in refusals.items()]
        why = "; ".join(reasons)
        records = {}
        for host in hosts:
            if host in unreachable:
                records[host] = {
                    "outcome": "unreachable",
                    "detail": f"not reached at preflight; the {purpose} was refused and nothing changed",
                }
            elif host in refusals:
                records[host] = {
                    "outcome": "refused",
                    "detail": f"failed its preflight ({refusals[host]}); the {purpose} was refused and nothing changed",
                }
            else:
                records[host] = {
                    "outcome": "refused",
                    "detail": f"nothing changed: the {purpose} was refused at preflight ({why})",
                }
        return {
            "go": [],
            "refused": True,
            "note": f"REFUSED at preflight, nothing changed on any host: {why}",
            "records": records,
        }
    records = {
        host: {
            "outcome": "skipped",
            "detail": f"unreachable at preflight: not {WAY[purpose]} (see its error above); run again when it is back",
        }
        for host in unreachable
    }
    go = []
    for host in passed:
        gone = [member for member in (state[host].get("node_group") or []) if member in unreachable]
        if gone:
            records[host] = {
                "outcome": "skipped",
                "detail": f"not {WAY[purpose]}: its node group's {', '.join(gone)} "
                "unreachable, and a group returns whole",
            }
        else:
            go.append(host)
    skipped = [host for host in hosts if host in records]
    note = (
        (
            f"SKIPPED {len(skipped)} host(s), left as they were: {', '.join(skipped)} (unreachable, or in a node "
            "group with an unreachable member); the others went on"
        )
        if skipped
        else ""
    )
    return {"go": go, "refused": False, "note": note, "records": records}
