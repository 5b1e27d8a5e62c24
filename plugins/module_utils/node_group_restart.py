# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A multi-node engine restarts as one: whether its group restarts, and the group's verdict after each step.

Private to the llmops.inference collection; not a public API (the ``node_group_restart`` filter).

Ansible fires a handler on each host that was notified, and only there; but a rank of a multi-node engine cannot
restart alone (a rank that leaves takes the others down, and a rank that comes back alone waits for ranks that will
never join). So the sglang_service role asks each member whether it needs a restart, and every member reads the
answers of all (:func:`decide`): any member asked, every member restarts. The steps then run on every member
together, and after each one every member judges all the members' results the same way (:func:`judge`): one
failure fails the whole group, and names the rank and the host.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.node_group import NodeGroupError

# The steps of a group restart, in order: which ranks run each, and the sglang_restart phase it is.
STEPS = {
    "stop_rank0": ("stop", "rank 0"),
    "stop_ranks": ("stop", "ranks >= 1"),
    "start": ("start", "every rank"),
    "gate_ranks": ("gate", "ranks >= 1"),
    "gate_rank0": ("gate", "rank 0"),
    "cleanup": ("stop", "every rank"),
}
RANK0_STEPS = ("stop_rank0", "gate_rank0")
OTHER_RANKS_STEPS = ("stop_ranks", "gate_ranks")
# Steps of the stop phase that fail before the engine is touched.
UNTOUCHED_STEPS = ("lock", "unit", "gateway_drain")


def _order(ranks: dict) -> list:
    return [host for host, _rank in sorted(ranks.items(), key=lambda item: int(item[1]))]


def _shown(ranks: dict) -> str:
    return ", ".join(f"rank {int(rank)} {host}" for host, rank in sorted(ranks.items(), key=lambda item: int(item[1])))


def _absent(ranks: dict, play_hosts) -> list:
    present = set(play_hosts or ())
    return [host for host in _order(ranks) if host not in present]


def decide(asked: dict, host: str, ranks: dict, play_hosts, force: bool = False) -> dict:
    """Whether the group of ``host`` restarts: ``asked`` maps each member to whether it needs a restart; ``force``
    restarts it anyway (a restart asked for the group, such as the role's ``tasks_from: restart``).

    ``ranks`` maps each member to its rank (sglang_info ``node_group``'s ``ranks``). Raises NodeGroupError naming
    each member that is not in the play any more (it failed or could not be reached): the group cannot restart.
    """
    if host not in ranks:
        raise NodeGroupError([f"{host} is not a member of its node group ({_shown(ranks)})"])
    absent = _absent(ranks, play_hosts)
    if absent:
        raise NodeGroupError(
            [
                f"the node group ({_shown(ranks)}) cannot restart: rank {int(ranks[member])} {member} is not in the "
                "play any more (it failed or could not be reached); its members restart together or not at all"
                for member in absent
            ]
        )
    wanting = [member for member in _order(ranks) if _truthy(asked.get(member))]
    if wanting:
        why = "needed by " + ", ".join(f"rank {int(ranks[member])} {member}" for member in wanting)
    else:
        why = "asked for the whole group" if force else "no member needs a restart"
    return {
        "restart": bool(wanting) or bool(force),
        "why": why,
        "rank": int(ranks[host]),
        "order": _order(ranks),
        "members": _shown(ranks),
    }


def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def judge(results: dict, step: str, ranks: dict, play_hosts, previous: dict | None = None) -> dict:
    """The group's verdict after ``step`` (a key of STEPS), from each member's sglang_restart result.

    ``previous`` is the verdict of the step before: once the group failed it stays failed (later steps did not run).
    Returns ``ok``, ``touched`` (whether any engine of the group was stopped: a failure then stops every member),
    ``failed`` (one entry per failed member: ``rank``, ``host``, ``step``, ``reason``) and ``msg``. With ``cleanup``
    (the stop of every member after a failure, ``previous`` the failed verdict), ``msg`` is the group's final word:
    the failure and whether every member is stopped now (``stopped``); ``failed`` then lists the members whose stop
    failed.
    """
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    if step == "cleanup":
        return _cleanup(results, ranks, play_hosts, previous or {})
    verdict = dict(previous) if previous else {"ok": True, "touched": False, "failed": [], "msg": ""}
    if not verdict["ok"]:
        return verdict
    failed = _failures(results, step, ranks, play_hosts, verdict)
    if failed:
        verdict["ok"] = False
        verdict["failed"] = failed
        verdict["msg"] = _message(failed, ranks) + (
            " Every member of the group is stopped next (a rank cannot serve without the others)."
            if verdict["touched"]
            else " No engine of the group was stopped: it still runs what it ran before."
        )
    else:
        verdict["msg"] = f"{step} of the node group ({_shown(ranks)}) done on {STEPS[step][1]}"
    return verdict


def _failures(results: dict, step: str, ranks: dict, play_hosts, verdict: dict) -> list:
    phase = STEPS[step][0]
    present = set(play_hosts or ())
    failed = []
    for host in _order(ranks):
        rank = int(ranks[host])
        if (step in RANK0_STEPS and rank != 0) or (step in OTHER_RANKS_STEPS and rank == 0):
            continue
        reason = _member_failure(results.get(host), phase, host in present, verdict)
        if reason:
            failed.append({"rank": rank, "host": host, "step": step, "reason": reason})
    return failed


def _cleanup(results: dict, ranks: dict, play_hosts, failure: dict) -> dict:
    """The stop of every member after the group failed; ``msg`` names the failure and what the stop left."""
    stopped = _failures(results, "cleanup", ranks, play_hosts, {"touched": True})
    head = _message(failure["failed"], ranks) if failure.get("failed") else "the node group failed its restart."
    if stopped:
        named = "; ".join(f"rank {entry['rank']} ({entry['host']}) {entry['reason']}" for entry in stopped)
        after = f" Stopping every member failed too, so these may still run: {named}."
    else:
        after = (
            " Every member of the group is stopped and reaped (a rank cannot serve without the others): roll the "
            "group back or fix the failed rank, then restart the whole group."
        )
    # The group failed whatever the stop did: ``ok`` stays false; ``stopped`` says whether every member is.
    return {"ok": False, "touched": True, "stopped": not stopped, "failed": stopped, "msg": head + after}


def _member_failure(result, phase: str, present: bool, verdict: dict) -> str | None:
    """Why one member failed its step, or None; ``verdict["touched"]`` turns true once its engine was stopped."""
    if not present:
        return "left the play (it failed or could not be reached)"
    if not isinstance(result, dict) or result.get("phase") != phase:
        return f"did not run the {phase} phase"
    gate = result.get("gate") or {}
    if phase != "stop" or gate.get("failed_step") not in UNTOUCHED_STEPS:
        verdict["touched"] = True
    if gate.get("failed_step"):
        return f"failed at {gate['failed_step']}: {_first_line(gate.get('reason'))}"
    if result.get("healthy") is False:
        return f"failed its gate: {gate.get('failed_tier')} tier: {_first_line(gate.get('reason'))}"
    return None


def _first_line(text) -> str:
    return str(text or "?").strip().splitlines()[0] if str(text or "").strip() else "?"


def _message(failed: list, ranks: dict) -> str:
    named = "; ".join(f"rank {entry['rank']} ({entry['host']}) {entry['reason']}" for entry in failed)
    return f"the node group ({_shown(ranks)}) failed its restart at {failed[0]['step']}: {named}."
