# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gate after a start: wait (polling) until the unit is ready, then the probe's tiers and the stability window.

The window starts when the server first answered /health and overlaps the tiers; what is left of it is polled,
failing at once when MainPID, NRestarts or ActiveState move. A unit that is not ready and holds no model on its GPUs
fails on the ``gpu`` tier (worth a fresh start); every other failure names its tier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import TIER_NAMES
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import POLL_S, probe_settings
from ansible_collections.llmops.inference.plugins.module_utils.restart.runners import HostRunners
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangError
from ansible_collections.llmops.inference.plugins.module_utils.unit_verdicts import (
    DEAD_STATES,
    unit_not_active_reason,
    unit_restart_reason,
)

GATE_TIERS = TIER_NAMES
# A rank >= 1 of a multi-node engine serves no API: SGLang runs its schedulers and a dummy health server there
# (srt/entrypoints/engine.py `_launch_subprocesses`, srt/utils/common.py `launch_dummy_health_check_server`), so its
# gate is the unit, its GPUs holding the model, and /health; rank 0's gate proves that the engine generates.
RANK_TIERS = ("unit", "gpu", "health")
# How long systemd may take to begin the start job the chain queued (it is usually immediate).
START_PICKUP_S = 30.0
CLD_EXITED = "1"


def dead_reason(state, since_ready: float | None = None) -> str:
    """Why a started unit no longer runs its server; a main process that exited with status 0 is named as such."""
    if not state.main_pid and state.exec_main_status == 0 and state.properties.get("ExecMainCode") == CLD_EXITED:
        when = f" {since_ready:.1f} s after the server first answered /health" if since_ready is not None else ""
        return (
            f"unit {state.name} is {state.active_state} (exited 0): its main process exited with status 0{when}, "
            "and Restart=on-failure does not restart a clean exit"
        )
    return unit_not_active_reason(state)


def tier_list(failed: str, reason: str, elapsed: float = 0.0, passed: list | None = None) -> list:
    """A tier list for a gate decided outside the probe: ``failed`` failed, the others skipped (or as passed)."""
    earlier = {tier["name"]: tier for tier in passed or []}
    tiers = []
    for name in GATE_TIERS:
        if name == failed:
            tiers.append({"name": name, "status": "failed", "reason": reason, "elapsed_s": round(elapsed, 3)})
        elif name in earlier:
            tiers.append(earlier[name])
        else:
            tiers.append({"name": name, "status": "skipped", "reason": "earlier tier failed", "elapsed_s": 0.0})
    return tiers


def failed_gate(tier: str, reason: str, state, passed: list | None = None) -> dict:
    return {
        "healthy": False,
        "failed_tier": tier,
        "reason": reason,
        "tiers": tier_list(tier, reason, passed=passed),
        "main_pid": state.main_pid or None,
    }


def started(state, before) -> bool:
    """Whether ``state`` is of a start after ``before`` (a new invocation, or the unit left inactive again)."""
    new_id = state.properties.get("InvocationID")
    if new_id and new_id != before.properties.get("InvocationID"):
        return True
    exit_ts = state.properties.get("InactiveExitTimestampMonotonic")
    return bool(exit_ts) and exit_ts not in ("0", before.properties.get("InactiveExitTimestampMonotonic"))


@dataclass
class Readiness:
    """What the wait for readiness has seen so far."""

    start: float
    baseline: object = None
    baseline_at: float = 0.0
    last_health: object = None


class Gate:
    """One attempt's gate; :meth:`run` returns the gate (``healthy``, ``failed_tier``, ``reason``, ``tiers``, ...)."""

    def __init__(self, runners: HostRunners):
        self.runners = runners
        self.options = runners.options
        self.clock = runners.clock
        self.ready_at = None
        self.ready_state = None
        self.final_state = None
        self.soak = None
        # Called at each poll of the wait for readiness (the host lock's check; it raises when the lock is lost).
        self.watch = None

    def run(self, before, soak: int) -> dict:
        gate = self._wait_ready(before)
        return gate if gate is not None else self._probe_and_hold(soak)

    # -- wait until ready -----------------------------------------------------------------------------

    def _wait_ready(self, before) -> dict | None:
        """Poll until the server is ready (None: go on with the probe, from ``ready_at``), or a failed gate."""
        seen = Readiness(start=self.clock())
        deadline = seen.start + self.options.ready_timeout
        while True:
            if self.watch is not None:
                self.watch()
            now = self.clock()
            state = self.runners.read_unit("gate")
            verdict = self._poll(state, before, now, seen)
            if verdict is not None:
                return verdict or None
            if now >= deadline:
                return self._not_ready_in_time(state, seen.last_health)
            self.runners.sleep(POLL_S)

    def _poll(self, state, before, now: float, seen: Readiness):
        """One reading: a failed gate, ``{}`` once ready, or None to keep waiting."""
        if not started(state, before):
            if now - seen.start > START_PICKUP_S:
                pickup = f"the start job of {self.options.unit} did not begin within {START_PICKUP_S:g} s"
                return failed_gate("unit", pickup, state)
            return None
        if seen.baseline is None:
            # A manual start sets NRestarts to 0: any count above it is a restart of this start.
            seen.baseline, seen.baseline_at = replace(state, n_restarts=0), now
        restart = unit_restart_reason(seen.baseline, state, now - seen.baseline_at)
        if restart:
            return failed_gate("unit", restart, state)
        if state.active_state in DEAD_STATES:
            return failed_gate("unit", dead_reason(state), state)
        if state.is_active and self._answered(state, now, seen):
            return {}
        return None

    def _answered(self, state, now: float, seen: Readiness) -> bool:
        """Whether an active unit is ready: active with a readiness gate, else once /health answers 200."""
        if self.options.ready_when_active:
            self._ready(state, now)
            return True
        try:
            seen.last_health = self.runners.health()
        except SglangError as exc:
            seen.last_health = str(exc)
        if seen.last_health == 200:
            self._ready(state, self.clock())
            return True
        return False

    def _not_ready_in_time(self, state, last_health) -> dict:
        timeout = self.options.ready_timeout
        if state.is_active:
            answer = f"HTTP {last_health}" if isinstance(last_health, int) else last_health
            unhealthy = f"/health did not answer 200 within {timeout:g} s ({answer})"
            return self._why_not_ready(state, unhealthy) or failed_gate("health", unhealthy, state)
        not_ready = (
            f"unit {state.name} not ready within {timeout:g} s: "
            f"ActiveState={state.active_state}, SubState={state.sub_state}"
        )
        return self._why_not_ready(state, not_ready) or failed_gate("unit", not_ready, state)

    def _why_not_ready(self, state, not_ready: str) -> dict | None:
        """A failed gate on the ``gpu`` tier when a unit that is not ready holds no model on its GPUs, else None.

        An engine that never loads answers /health with 503 for ever, and SGLang's readiness gate (ExecStartPost)
        keeps its unit ``activating``: neither tells a model that did not load (worth a fresh start) from a slow one.
        """
        if not state.main_pid:
            return None
        probe = self.runners.probe({**probe_settings(self.options, wait_timeout=0.0), "tiers": ["gpu"]})
        if probe.get("healthy") or probe.get("failed_tier") != "gpu":
            return None
        gate = failed_gate("gpu", f"{probe.get('reason')} ({not_ready})", state)
        gate["gpu_memory_mib"] = probe.get("gpu_memory_mib") or {}
        return gate

    def _ready(self, state, now: float) -> None:
        """The moment the server first answered /health: with a readiness gate, when the unit turned active."""
        ready_at = now
        entered = state.properties.get("ActiveEnterTimestampMonotonic") or ""
        if self.options.ready_when_active and entered.isdigit() and 0 < int(entered) / 1e6 <= now:
            ready_at = int(entered) / 1e6
        self.ready_at, self.ready_state = ready_at, state

    # -- the probe and the stability window --------------------------------------------------------------

    def _probe_and_hold(self, soak: int) -> dict:
        window_end = self.ready_at + self.options.stability_window
        # Within the window the probe may try again (a tier that was not ready yet); after it, it decides.
        wait = max(0.0, window_end - self.clock())
        self.soak = soak
        settings = probe_settings(self.options, wait_timeout=wait, soak=soak)
        if self.options.node_rank:
            settings["tiers"], self.soak = list(RANK_TIERS), None
            settings.pop("soak_requests", None)
        probe = self.runners.probe(settings)
        gate = {
            "healthy": bool(probe.get("healthy")),
            "failed_tier": probe.get("failed_tier"),
            "reason": probe.get("reason"),
            "tiers": list(probe.get("tiers") or []),
            "main_pid": probe.get("main_pid"),
        }
        for key in ("gpu_memory_mib", "model", "speculative", "generation"):
            gate[key] = probe.get(key) or {}
        if not gate["healthy"]:
            return gate
        moved = self._hold_window(window_end)
        if moved is not None:
            state, reason = moved
            gate.update(failed_gate("unit", reason, state, passed=gate["tiers"]))
        return gate

    def _hold_window(self, window_end: float):
        """Poll the unit until the window ends; ``(state, reason)`` as soon as it moved, else None."""
        while True:
            now = self.clock()
            state = self.runners.read_unit("gate")
            since = now - self.ready_at
            verdict = unit_restart_reason(self.ready_state, state, since)
            if verdict is None and not state.is_active:
                verdict = dead_reason(state, since)
            if verdict is not None:
                window = self.options.stability_window
                return state, f"{verdict} (within the stability window of {window:g} s after the first /health 200)"
            self.final_state = state
            if now >= window_end:
                return None
            self.runners.sleep(min(POLL_S, window_end - now))
