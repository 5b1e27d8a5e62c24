# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet probe's report: a headline, one line per host, and one line per multi-node engine.

A multi-node engine (one SGLang engine whose ranks run on several hosts) serves only when every rank does: its line
takes the most urgent state of its ranks and names each rank that does not serve, or that was not probed.

Private to the llmops.inference collection; not a public API. Pure functions, standard library only.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.probe_report import (
    HUNG,
    NEEDS_GPU_RESET,
    NOT_SERVING,
    SERVING,
)

LABELS = {SERVING: "SERVING", NOT_SERVING: "NOT SERVING", HUNG: "HUNG", NEEDS_GPU_RESET: "NEEDS GPU RESET"}
URGENCY = (NEEDS_GPU_RESET, HUNG, NOT_SERVING, SERVING)
RESET_RUNBOOK = "docs/runbooks/gpu_needs_reset.md"


def state_of(probe: dict) -> str:
    """The probe's state; a result without one (an older probe, a failed task) from whether it was healthy."""
    state = (probe or {}).get("state")
    if state in LABELS:
        return state
    return SERVING if (probe or {}).get("healthy") else NOT_SERVING


def _why(probe: dict, state: str) -> str:
    if state == SERVING:
        return ""
    if state == NEEDS_GPU_RESET:
        return f" ({probe.get('reset_message') or ''})"
    return f" ({probe.get('failed_tier')}: {probe.get('reason')})"


def host_line(host: str, probe: dict, rank: int) -> str:
    """HOST: STATE (why) | pid P, restarts N | GPU i: MiB, ... | tok/s; a rank >= 1 says which tiers it is probed on."""
    probe = probe or {}
    state = state_of(probe)
    name = f"{host} (rank {rank} of a multi-node engine: unit, GPU and health tiers)" if rank > 0 else host
    gpus = ", ".join(f"{index}: {mib} MiB" for index, mib in (probe.get("gpu_memory_mib") or {}).items()) or "-"
    tokens = (probe.get("generation") or {}).get("tokens_per_s")
    restarts = probe.get("n_restarts")
    return (
        f"{name}: {LABELS[state]}{_why(probe, state)} | pid {probe.get('main_pid') or '-'}, restarts "
        f"{restarts if restarts is not None else '-'} | GPU {gpus} | "
        + (f"{round(float(tokens), 1)} tok/s" if tokens is not None else "no generation")
    )


def engine_line(members: list, probes: dict, ranks: dict) -> str:
    """One multi-node engine: the most urgent state of its ranks, and each rank that does not serve."""
    order = sorted(members, key=lambda member: int(ranks.get(member, 0)))
    unprobed = [member for member in order if member not in probes]
    states = {member: state_of(probes[member]) for member in order if member in probes}
    worst = min(states.values(), key=URGENCY.index, default=NOT_SERVING)
    notes = [
        f"rank {int(ranks.get(member, 0))} {member}: {LABELS[state]}"
        for member, state in states.items()
        if state != SERVING
    ] + [f"rank {int(ranks.get(member, 0))} {member}: not probed" for member in unprobed]
    label = LABELS[worst] if not unprobed or worst != SERVING else "NOT KNOWN"
    return f"multi-node engine {', '.join(order)}: {label}" + (f" ({'; '.join(notes)})" if notes else "")


def fleet_report(hosts: list, probes: dict, ranks: dict, node_groups: dict) -> dict:
    """``lines``: the headline, a line per host in ``hosts`` order, then a line per multi-node engine among them;
    ``counts``: hosts per state."""
    states = [state_of(probes.get(host) or {}) for host in hosts]
    counts = {state: states.count(state) for state in URGENCY}
    headline = (
        f"fleet probe: {counts[SERVING]} of {len(hosts)} host(s) serve, {counts[HUNG]} hung, "
        f"{counts[NEEDS_GPU_RESET]} need a GPU reset"
        + (f" (runbook: {RESET_RUNBOOK})" if counts[NEEDS_GPU_RESET] else "")
    )
    lines = [headline] + [host_line(host, probes.get(host) or {}, int(ranks.get(host) or 0)) for host in hosts]
    seen = set()
    for host in hosts:
        members = list(node_groups.get(host) or [])
        if not members or host in seen:
            continue
        seen.update(members)
        lines.append(engine_line(members, {member: probes[member] for member in members if member in probes}, ranks))
    return {"lines": lines, "counts": counts}
