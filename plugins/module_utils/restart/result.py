# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What one run of the chain did: its steps, what it found, and the module's result, message and diff.

The result is nested (``gate``, ``service``, ``gpu``, ``gateway``, ``steps``); ``changed``, ``msg``, ``diff``,
``healthy``, ``elapsed_s`` and, in check mode, ``plan`` stay at the top. Every key the result had at the top before
it was nested is still there with the same value (FLAT_ALIASES), deprecated, until 2.0.0.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.systemd import parse_timespan

# Each group of the result: its key -> the ChainResult field it shows.
GROUPS = {
    "gate": {
        "failed_step": "failed_step",
        "failed_tier": "failed_tier",
        "reason": "reason",
        "tiers": "tiers",
        "attempts": "attempts",
        "per_attempt": "gates",
        "soak": "soak",
        "model": "model",
        "speculative": "speculative",
        "generation": "generation",
    },
    "service": {
        "name": "unit",
        "active_state": "active_state",
        "sub_state": "sub_state",
        "result": "unit_result",
        "main_pid": "main_pid",
        "n_restarts": "n_restarts",
        "start_limit": "start_limit",
        "stop_mode": "stop_mode",
        "start": "start",
        "journal": "journal",
        "lock": "lock",
        "snapshot": "snapshot",
    },
    "gpu": {"memory_mib": "gpu_memory_mib", "reaped": "reaped", "unreapable": "unreapable"},
}
# The deprecated top-level keys (removed in 2.0.0): each one's place in the nested result.
FLAT_ALIASES = {
    ("result" if name == "unit_result" else name): f"{group}.{key}"
    for group, keys in GROUPS.items()
    for key, name in keys.items()
}


def flat_view(result: dict | None) -> dict:
    """``result`` with each nested value also under its flat name (``gate.failed_tier`` as ``failed_tier``, ...), for
    readers of the chain's verdict that do not care which group a key is in."""
    view = dict(result or {})
    for flat, nested in FLAT_ALIASES.items():
        group, key = nested.split(".")
        if isinstance(view.get(group), dict) and key in view[group]:
            view[flat] = view[group][key]
    return view


class ChainFailure(Exception):
    """A step could not be done; ``step`` names it."""

    def __init__(self, step: str, reason: str, **facts):
        super().__init__(reason)
        self.step = step
        self.reason = reason
        self.facts = facts


class Steps:
    """The steps of one run, in order, each with its status, detail and time."""

    def __init__(self, clock):
        self.clock = clock
        self.items = []
        # Called with a step's name before the step begins (the host lock's check that it is still held).
        self.guard = None

    @contextmanager
    def run(self, name: str, attempt: int = 1):
        if self.guard is not None:
            self.guard(name)
        entry = {"name": name, "attempt": attempt, "status": "ok", "detail": "", "elapsed_s": 0.0}
        self.items.append(entry)
        started = self.clock()
        try:
            yield entry
        except ChainFailure as failure:
            entry["status"], entry["detail"] = "failed", failure.reason
            raise
        finally:
            entry["elapsed_s"] = round(self.clock() - started, 3)

    def note(self, name: str, status: str, detail: str, attempt: int = 1) -> None:
        self.items.append({"name": name, "attempt": attempt, "status": status, "detail": detail, "elapsed_s": 0.0})


def start_limit(state) -> str:
    burst = state.properties.get("StartLimitBurst") or "?"
    interval = parse_timespan(state.properties.get("StartLimitIntervalUSec"))
    shown = f"{interval:g} s" if interval is not None else state.properties.get("StartLimitIntervalUSec") or "?"
    return f"StartLimitBurst={burst} starts within StartLimitIntervalSec={shown}"


def holder(entry: dict) -> dict:
    return {key: entry.get(key) for key in ("pid", "title", "unit", "gpus", "used_mib", "signals", "exited")}


@dataclass
class ChainResult:
    """What the chain found and did; :meth:`render` turns it into the module's result."""

    unit: str
    journal_lines: int
    healthy: bool | None = False
    changed: bool = False
    failed_step: str | None = None
    failed_tier: str | None = None
    reason: str | None = None
    tiers: list = field(default_factory=list)
    main_pid: int | None = None
    n_restarts: int | None = None
    active_state: str | None = None
    sub_state: str | None = None
    unit_result: str | None = None
    gpu_memory_mib: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    speculative: dict = field(default_factory=dict)
    generation: dict = field(default_factory=dict)
    snapshot: str | None = None
    journal: list = field(default_factory=list)
    start: str | None = None
    start_limit: str | None = None
    stop_mode: str | None = None
    reaped: list = field(default_factory=list)
    unreapable: list = field(default_factory=list)
    soak: int = 0
    attempts: int = 0
    gates: list = field(default_factory=list)
    lock: dict = field(default_factory=dict)
    gateway: dict | None = None
    plan: dict | None = None
    phase: str | None = None
    node_rank: int | None = None
    reference: dict | None = None

    def fail(self, failure: ChainFailure) -> None:
        self.healthy, self.failed_step, self.reason = False, failure.step, failure.reason
        for name, value in failure.facts.items():
            setattr(self, name, value)

    def take_gate(self, gate: dict, final_state=None) -> None:
        """The last attempt's gate; the unit's facts as the gate left them after a pass."""
        for key in ("healthy", "failed_tier", "reason", "tiers", "main_pid", "gpu_memory_mib"):
            if key in gate:
                setattr(self, key, gate[key])
        for key in ("model", "speculative", "generation"):
            setattr(self, key, gate.get(key) or {})
        if gate["healthy"] and final_state is not None:
            self.unit_facts(final_state)

    def unit_facts(self, state) -> None:
        self.active_state, self.sub_state = state.active_state, state.sub_state
        self.unit_result, self.n_restarts = state.result, state.n_restarts
        self.start_limit = start_limit(state)
        if self.main_pid is None and state.main_pid:
            self.main_pid = state.main_pid

    # -- rendering ----------------------------------------------------------------------------------

    def render(self, *, steps: list, elapsed_s: float, diff: dict, warnings: list, msg: str) -> dict:
        """The module's result: the groups, the top-level keys, and the deprecated flat aliases."""
        result = {
            "changed": self.changed,
            "healthy": self.healthy,
            "msg": msg,
            "diff": diff,
            "warnings": warnings,
            "elapsed_s": elapsed_s,
            "steps": steps,
            "gateway": self.gateway,
            "phase": self.phase,
            "node_rank": self.node_rank,
            "reference": self.reference,
        }
        if self.plan is not None:
            result["plan"] = self.plan
        for group, keys in GROUPS.items():
            result[group] = {key: getattr(self, name) for key, name in keys.items()}
        for flat, nested in FLAT_ALIASES.items():
            group, key = nested.split(".")
            result[flat] = result[group][key]
        return result

    def diff(self, before, check_mode: bool) -> dict:
        def render(active, sub, pid):
            return f"ActiveState={active}\nSubState={sub}\nMainPID={pid}\n"

        old = render(before.active_state, before.sub_state, before.main_pid) if before else ""
        if check_mode:
            new = render("active", "running", "(new)")
        else:
            new = render(self.active_state, self.sub_state, self.main_pid)
        return {"before": old, "after": new, "before_header": self.unit, "after_header": self.unit}

    def message(self, check_mode: bool, elapsed_s: float) -> str:
        if check_mode:
            if not self.plan:
                return f"check mode: {self.unit} restart chain would stop at {self.failed_step}: {self.reason}"
            if "stop" not in self.plan:
                return f"check mode: would run the {self.phase} phase of {self.unit}: {', '.join(self.plan)}"
            return f"check mode: would restart {self.unit}: {self.plan['stop']['why']}; then reap, start and gate it"
        if self.healthy is None and not self.failed_step:
            done = {"stop": f"stopped ({self.stop_mode}) and reaped", "start": "start queued"}[self.phase]
            return f"{self.unit} (node_rank {self.node_rank}) phase {self.phase}: {done} after {elapsed_s:.1f} s"
        if self.healthy:
            rejoined = " and is back in its gateway(s)" if (self.gateway or {}).get("in_gateways") else ""
            reference = (self.reference or {}).get("status")
            held = f"; reference {reference}" if reference in ("passed", "recorded", "accepted") else ""
            return f"{self.unit} passed its gate after {elapsed_s:.1f} s (MainPID {self.main_pid}){rejoined}{held}"
        lines = [self._failure_line()]
        if self.active_state:
            lines.append(self._unit_line())
        if self.journal:
            lines.append(f"last {self.journal_lines} journal lines:")
            lines.extend(self.journal)
        return "\n".join(lines)

    def _failure_line(self) -> str:
        if self.failed_step:
            line = f"{self.unit} restart chain failed at {self.failed_step}: {self.reason}"
        else:
            line = f"{self.unit} failed its gate: {self.failed_tier} tier: {self.reason}"
        gateway = self.gateway or {}
        if gateway.get("in_gateways") is False:
            left_out = gateway.get("left_out") or gateway["gateways"]
            line += f" ({gateway['worker_url']} is left out of its gateway(s): {', '.join(left_out)})"
        return line

    def _unit_line(self) -> str:
        line = (
            f"unit: ActiveState={self.active_state} SubState={self.sub_state} "
            f"Result={self.unit_result} NRestarts={self.n_restarts}"
        )
        if self.unit_result == "start-limit-hit":
            line += f"; systemd stopped restarting it: start limit hit ({self.start_limit})"
        elif self.active_state != "active" and self.failed_step is None:
            line += f"; Restart=on-failure retries at most {self.start_limit}, then leaves it failed"
        return line
