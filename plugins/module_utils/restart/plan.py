# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How the chain stops a unit, and what a check-mode run would do (read only; nothing is changed)."""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.gateway import UNREACHABLE_FAIL
from ansible_collections.llmops.inference.plugins.module_utils.reaper import ReapError, ReapInputError
from ansible_collections.llmops.inference.plugins.module_utils.restart.gate import GATE_TIERS, RANK_TIERS
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    PHASE_GATE,
    PHASE_START,
    PHASE_STOP,
    ChainOptions,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.result import ChainResult, holder
from ansible_collections.llmops.inference.plugins.module_utils.restart.runners import HostRunners, reap_params
from ansible_collections.llmops.inference.plugins.module_utils.systemd import RUNNING_STATES


def stop_mode(state, engine_ready=None) -> tuple:
    """``(mode, why)``: ``kill`` a unit caught in a restart loop, ``drain`` a running one, ``none`` otherwise.

    ``engine_ready`` (called only for an active unit that systemd has restarted) returns None when the engine is
    ready, else why not: such a unit is in its loop's running phase, serving nothing.
    """
    described = f"ActiveState={state.active_state}, SubState={state.sub_state}, NRestarts={state.n_restarts}"
    looping = state.sub_state == "auto-restart" or (
        state.active_state in ("activating", "deactivating") and state.n_restarts > 0
    )
    if looping:
        return "kill", f"in a restart loop ({described}): killed with SIGKILL, not drained"
    if state.active_state in RUNNING_STATES:
        not_ready = engine_ready() if engine_ready and state.n_restarts > 0 else None
        if not_ready:
            return "kill", f"in a restart loop ({described}; {not_ready}): killed with SIGKILL, not drained"
        how = "its ExecStop drain" if state.properties.get("ExecStop") else "SIGTERM to the whole unit (no ExecStop)"
        return "drain", f"{state.active_state} ({state.sub_state}): stopped through {how}"
    return "none", f"{state.active_state} ({state.sub_state or '-'}): nothing to stop"


def check_mode_plan(runners: HostRunners, result: ChainResult, before, drain) -> dict:
    """What the chain would do, from what it reads: the stop, the reap, the start, the gate, the gateways."""
    options = runners.options
    phase = options.phase
    plan, mode = {}, None
    if phase not in (PHASE_START, PHASE_GATE):
        mode, why = stop_mode(before, runners.serving_check())
        if mode == "drain" and options.node_rank:
            mode, why = "kill", f"{why}; node_rank {options.node_rank} serves no request: killed, not drained"
        plan["stop"] = {"mode": mode, "why": why}
        plan["reap"] = _reap_plan(runners, result, before)
    if phase not in (PHASE_STOP, PHASE_GATE):
        plan["daemon_reload"] = before.properties.get("NeedDaemonReload") == "yes"
        plan["start"] = f"systemctl start --no-block {options.unit}"
    if phase not in (PHASE_STOP, PHASE_START):
        plan["gate"] = _gate_plan(options)
        if options.reference["mode"] != "off":
            plan["reference"] = _reference_plan(options)
        plan["snapshot"] = options.known_good.root
    if drain:
        plan["gateway"] = _gateway_plan(options, drain)
    result.plan, result.stop_mode, result.changed, result.healthy = plan, mode, True, None
    return plan


def _reap_plan(runners: HostRunners, result: ChainResult, before) -> dict:
    plan = {}
    leftovers, orphans = reap_params(runners.options)
    scopes = [("orphans", orphans)]
    if before.is_running:
        plan["unit"] = "the unit runs now; its leftovers, if any, are reaped after the stop"
    else:
        scopes.insert(0, ("unit", leftovers))
    for name, params in scopes:
        try:
            answer = runners.reap(params, True)
        except (ReapError, ReapInputError) as exc:
            plan[name] = f"cannot tell: {exc}"
            continue
        plan[name] = [holder(entry) for entry in answer.get("reaped") or []]
        if answer.get("unreapable"):
            result.unreapable.extend(answer["unreapable"])
            plan["unreapable"] = "GPU memory nobody can free: the chain would stop before the start"
    return plan


def _gate_plan(options: ChainOptions) -> str:
    tiers = RANK_TIERS if options.node_rank else GATE_TIERS
    return (
        f"wait up to {options.ready_timeout:g} s for the server to be ready, then probe "
        f"{', '.join(tiers)} with a stability window of {options.stability_window:g} s"
        + (f" and a soak of {options.soak} generations if the reap finds holders" if options.soak else "")
    )


def _reference_plan(options: ChainOptions) -> str:
    settings = options.reference
    if options.node_rank:
        return f"none: node_rank {options.node_rank} serves no API"
    if settings["accept"]:
        return "record the reference anew after a passing gate (reference.accept)"
    when = "on every restart" if settings["mode"] == "always" else "when the engine inputs changed since the known-good"
    return (
        f"{when}: score the golden outputs (logprob tolerance {settings['logprob_tolerance']:g}) and measure the "
        f"fingerprint (speed tolerance {settings['speed_tolerance']:.0%}); record one if there is none"
    )


def _gateway_plan(options: ChainOptions, drain) -> dict:
    gateway = options.gateway
    return {
        "remove": drain.state["detail"],
        "drain": f"wait up to {gateway.drain_timeout:g} s while the engine's /metrics shows requests running "
        "or queued; the stop then waits for SGLang's own drain",
        "add": f"after a passing gate, add {gateway.worker_url} to {', '.join(gateway.urls)} and wait until each "
        "reports it healthy; a failed gate leaves it out; a gateway that cannot be reached then "
        + ("fails the host" if gateway.unreachable == UNREACHABLE_FAIL else "is a warning")
        + " (gateway_unreachable)",
    }
