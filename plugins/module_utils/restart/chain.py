# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restart chain: one run, each step timed and reported::

    lock -> unit (read it) -> gateway drain (with gateways) -> stop -> reset-failed -> reap
         -> daemon-reload (when systemd asks) -> start (not waiting for the job) -> gate
         -> gateway re-add (on a pass, with gateways) -> snapshot (on a pass) -> release the lock (always)

- gateway drain: every gateway replica is read first (one that cannot be used fails the chain before the stop),
  the worker is removed from each (refused, before the stop, when a gateway would keep fewer than
  ``gateway_min_healthy`` other healthy workers of its model), then the chain waits while the engine's /metrics
  shows requests in flight, at most the drain budget (module_utils/gateway_drain.py); the gauges never prove it
  idle, the stop's wait for SGLang's own drain does. After a passing gate the worker is added back and the chain
  waits until every gateway reports it healthy; a failed gate (or step) leaves it out of the gateways, and the
  result's ``gateway`` field says where it is.
- stop: a unit caught in a restart loop is killed with SIGKILL (it serves nothing, and a drain would only wait
  for processes that may ignore SIGTERM); a running unit is stopped, which runs its ExecStop drain (plan.py).
- reap: GPU holders left in the unit's cgroup, then orphans titled ``^sglang::`` on the unit's GPUs, and a
  wait until every GPU of the unit is at or below the threshold (memory is released after its holder exits).
  A reaper that reports ``unreapable`` holders stops the chain before the start: the unit stays stopped.
- gate (gate.py): after an unclean stop (the reap found holders) the probe adds a soak of a few short
  generations. A gate that fails on the ``gpu`` tier (the model never loaded) is retried (stop, reap, start,
  gate) until the unit's start limit; the last attempt is left running.

A multi-node engine restarts as one: each member's chain runs in ``phase`` steps that the caller runs on every
member together - ``stop`` (lock, gateway drain, stop, reset-failed, reap), ``start`` (daemon-reload, start) and
``gate`` (gate, gateway re-add, snapshot) - and a member of ``node_rank`` >= 1 is gated on what it serves: its unit,
its GPUs and its health server (gate.py). ``all`` is the whole chain of one host.

Every effect goes through injected runners (runners.py), so each step and failure is unit-tested without a host.
"""

from __future__ import annotations

import os
from dataclasses import replace

from ansible_collections.llmops.inference.plugins.module_utils.gateway_drain import (
    DrainFailure,
    DrainSettings,
    GatewayDrain,
)
from ansible_collections.llmops.inference.plugins.module_utils.known_good import SnapshotError
from ansible_collections.llmops.inference.plugins.module_utils.reaper import ReapError, ReapInputError
from ansible_collections.llmops.inference.plugins.module_utils.redact import Redactor
from ansible_collections.llmops.inference.plugins.module_utils.restart.gate import Gate
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    PHASE_ALL,
    PHASE_START,
    PHASE_STOP,
    POLL_S,
    ChainOptions,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.plan import check_mode_plan, stop_mode
from ansible_collections.llmops.inference.plugins.module_utils.restart.reference_gate import (
    REFERENCE_TIER,
    ReferenceGate,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.result import (
    ChainFailure,
    ChainResult,
    Steps,
    holder,
    start_limit,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.runners import (
    HostLock,
    HostRunners,
    Runners,
    reap_params,
)

# Steps whose failure leaves nothing on the host worth explaining (the unit's state, the journal).
UNEXPLAINED_STEPS = ("lock", "unit", "gateway_drain")
# How long a rank >= 1 may take to end after rank 0's stop: rank 0's ShutdownReq broadcast stops its schedulers,
# which SGLang's rank 0 waits for up to 15 s (the stop budget's scheduler exit); a SIGTERM of its own only logs.
FOLLOWER_EXIT_S = 30.0
# A rank >= 1 that rank 0's ShutdownReq ended exits 0 (engine.py `_launch_subprocesses`, http_server.py
# `launch_server`); its unit (Restart=always) then waits to come back, in this state, which is the end of its run.
AUTO_RESTART = "auto-restart"
CLD_EXITED = "1"  # ExecMainCode of a main process that exited (not killed, not dumped)


def ended_cleanly(state) -> bool:
    """The unit waits for its automatic restart after its main process exited 0: a run that ended, not a crash loop
    (which reads Result=exit-code, signal, ...)."""
    props = state.properties
    return (
        state.sub_state == AUTO_RESTART
        and props.get("Result") == "success"
        and props.get("ExecMainCode") == CLD_EXITED
        and props.get("ExecMainStatus") == "0"
    )


# What tells one start from another; a gate run apart from its start knows no state before it.
START_MARKS = ("InvocationID", "InactiveExitTimestampMonotonic")


def gateway_drain(options: ChainOptions, runners: HostRunners) -> GatewayDrain | None:
    gateway = options.gateway
    if not gateway.urls:
        return None
    settings = DrainSettings(
        gateways=gateway.urls,
        worker_url=gateway.worker_url,
        api_key=gateway.api_key,
        worker_api_key=options.api_key,
        min_healthy=gateway.min_healthy,
        drain_timeout=gateway.drain_timeout,
        wait_timeout=gateway.wait_timeout,
        validate_certs=options.validate_certs,
        unreachable=gateway.unreachable,
    )
    return GatewayDrain(
        settings, runners.scrape, gateway_set=runners.gateway_set, clock=runners.clock, sleep=runners.sleep
    )


class RestartChain:
    """One restart of one unit. ``run(check_mode)`` returns the module's result (redacted)."""

    def __init__(self, options: ChainOptions, runners: Runners):
        self.options = options
        self.host = HostRunners(options, runners)
        self.clock = runners.clock
        self.redactor = Redactor([options.api_key, options.gateway.api_key, *options.secrets])
        self.steps = Steps(self.clock)
        self.lock = HostLock(self.host, self.steps)
        self.warnings = []
        self.drain = gateway_drain(options, self.host)
        self._left_gateways = False
        self.result = ChainResult(
            unit=options.unit, journal_lines=options.journal_lines, phase=options.phase, node_rank=options.node_rank
        )

    def run(self, check_mode: bool = False) -> dict:
        started = self.clock()
        before = None
        token = None
        try:
            token = self.lock.take(check_mode)
            self.result.lock = self.lock.record
            before = self._read_before(check_mode)
            phase = self.options.phase
            if phase in (PHASE_ALL, PHASE_STOP):
                self._gateway_leave(check_mode)
            if check_mode:
                check_mode_plan(self.host, self.result, before, self.drain)
                if "stop" in self.result.plan:
                    self.steps.note("stop", "planned", self.result.plan["stop"]["why"])
            else:
                self._run_phase(phase, before)
        except ChainFailure as failure:
            self._fail_step(failure, explain=failure.step not in UNEXPLAINED_STEPS and not check_mode)
            if self._left_gateways:
                self.drain.kept_out(f"the chain failed at {failure.step}")
        finally:
            if token:
                self.lock.release(token, self.warnings)
        if self.drain:
            self.result.gateway = self.drain.state
            self.warnings.extend(self.drain.warnings)
        return self._finish(before, started, check_mode)

    def _read_before(self, check_mode: bool):
        with self.steps.run("unit") as step:
            before = self.host.read_unit()
            if before.load_state != "not-found":
                step["detail"] = f"{before.active_state} ({before.sub_state}), MainPID {before.main_pid}"
            elif check_mode:  # a first run in check mode installs nothing: its plan is the first start
                step["detail"] = f"unit {before.name} not installed yet: a run installs it, then starts it"
            else:
                raise ChainFailure("unit", f"unit {before.name} not found (LoadState=not-found); install it first")
        self.result.start_limit = start_limit(before)
        return before

    # -- the gateways ------------------------------------------------------------------------------

    def _gateway_leave(self, check_mode: bool) -> None:
        """Out of every gateway, then wait until the engine has nothing in flight (check mode: only say where)."""
        if not self.drain:
            self.steps.note("gateway_drain", "skipped", "no gateways")
            return
        with self.steps.run("gateway_drain") as step:
            try:
                step["detail"] = self.drain.leave(check_mode=check_mode)
            except DrainFailure as exc:
                raise ChainFailure("gateway_drain", str(exc)) from None
            if check_mode:
                step["status"] = "planned"
                return
        self._left_gateways = True
        with self.steps.run("drain_wait") as step:
            idle, step["detail"] = self.drain.wait_idle()
            step["status"] = "ok" if idle else "expired"

    def _gateway_rejoin(self, gate: dict) -> None:
        """After the gate: back into every gateway on a pass; left out (and said so) after a failure."""
        if not self.drain:
            return
        if not gate["healthy"]:
            self.steps.note("gateway_add", "skipped", self.drain.kept_out("the gate failed"))
            return
        with self.steps.run("gateway_add") as step:
            try:
                step["detail"] = self.drain.rejoin()
            except DrainFailure as exc:
                raise ChainFailure("gateway_add", str(exc)) from None

    # -- the attempts -------------------------------------------------------------------------------

    def _start_limit(self, before) -> int:
        burst = before.properties.get("StartLimitBurst") or ""
        return self.options.max_starts or (int(burst) if burst.isdigit() and int(burst) > 0 else 1)

    def _attempts(self, before) -> None:
        state, limit = before, self._start_limit(before)
        self.result.changed = True
        for attempt in range(1, limit + 1):
            gate, checked = self._attempt(state, attempt)
            if gate["healthy"] or gate.get("failed_tier") != "gpu" or attempt == limit:
                break
            # The model never loaded: a fresh start may load it. Stop (the unit serves nothing), reap, start again.
            state = self.host.read_unit("gate")
        self._conclude(gate, checked)

    def _conclude(self, gate: dict, checked) -> None:
        """After the last gate: the reference, back into the gateways and a snapshot on a pass; the explanation
        after a failure."""
        reference = self._reference_check(gate)
        self.result.take_gate(gate, checked.final_state)
        try:
            self._gateway_rejoin(gate)
        except ChainFailure as failure:
            self._fail_step(failure, explain=False)
            return
        if gate["healthy"]:
            self._snapshot()
            self._reference_record(reference, gate)
        else:
            self._after_failed_gate(gate)

    # -- the reference ------------------------------------------------------------------------------

    def _reference_check(self, gate: dict) -> ReferenceGate | None:
        """After the probe's tiers passed: hold the engine to its reference when this restart changed its inputs."""
        if not gate["healthy"]:
            return None
        engine = self.host.reference_engine(self.options.reference)
        reference = ReferenceGate(self.options, self.host, engine)
        if self.options.reference["mode"] == "off":
            self.result.reference = reference.result
            return None
        began = self.clock()
        with self.steps.run("reference") as step:
            case = reference.plan()
            if case == "check":
                verdict = reference.check(bool((gate.get("speculative") or {}).get("algorithm")))
                tier = {"name": REFERENCE_TIER, "status": "ok" if verdict["healthy"] else "failed"}
                if not verdict["healthy"]:
                    gate.update(verdict)
                    tier["reason"] = verdict["reason"]
                tier["elapsed_s"] = round(self.clock() - began, 3)
                gate["tiers"] = [*(gate.get("tiers") or []), tier]
                step["status"] = tier["status"]
            else:
                step["status"] = "skipped" if case == "skipped" else "planned"
            step["detail"] = reference.result["reason"]
        self.result.reference = reference.result
        return reference

    def _reference_record(self, reference: ReferenceGate | None, gate: dict) -> None:
        """After a passing gate and its snapshot: record the reference when there is none, or when accepted."""
        if reference is None or reference.case not in ("missing", "accept") or self.result.failed_step:
            return
        if reference.case == "missing" and not self.options.reference["record_missing"]:
            return
        with self.steps.run("reference_record") as step:
            try:
                snapshot = self.host.store(self.options.known_good.root).read("current")
            except (SnapshotError, OSError):
                snapshot = None
            speculative = bool((gate.get("speculative") or {}).get("algorithm"))
            recorded = reference.record(speculative, snapshot, gate.get("model") or {})
            step["detail"] = recorded["reason"]
            if recorded["status"] == "not_recorded":
                step["status"] = "failed"
                self.warnings.append(recorded["reason"])
        self.result.reference = reference.result

    def _attempt(self, state, attempt: int) -> tuple:
        """Stop, reap, start and gate once; ``(gate, the Gate that decided it)``."""
        self.result.attempts = attempt
        self._stop(state, attempt)
        holders = self._reap(attempt)
        self._daemon_reload(state, attempt)
        self._start(attempt)
        return self._gate(state, attempt, soak=self.options.soak if holders else 0)

    def _gate(self, state, attempt: int, soak: int) -> tuple:
        checked = Gate(self.host)
        if self.steps.guard is not None:  # the wait for readiness may take minutes: the lock is checked at each poll
            checked.watch = lambda: self.steps.guard("gate", during=True)
        with self.steps.run("gate", attempt) as step:
            gate = checked.run(state, soak=soak)
            step["status"] = "ok" if gate["healthy"] else "failed"
            step["detail"] = (
                f"passed, holding a stability window of {self.options.stability_window:g} s"
                if gate["healthy"]
                else f"{gate['failed_tier']} tier: {gate['reason']}"
            )
        if checked.soak is not None:
            self.result.soak = checked.soak
        self.result.gates.append(
            {"attempt": attempt, **{key: gate.get(key) for key in ("healthy", "failed_tier", "reason", "main_pid")}}
        )
        return gate, checked

    # -- the phases of a group restart ----------------------------------------------------------------

    def _run_phase(self, phase: str, before) -> None:
        if phase == PHASE_ALL:
            self._attempts(before)
        elif phase == PHASE_STOP:
            self._stop_phase(before)
        elif phase == PHASE_START:
            self._start_phase(before)
        else:
            self._gate_phase(before)

    def _stop_phase(self, before) -> None:
        """Stop and reap; the unit stays stopped until the start phase."""
        self.result.changed, self.result.healthy = True, None
        state = before
        if self.options.node_rank and stop_mode(state, self.host.serving_check())[0] == "drain":
            # Running, not looping: it ends on rank 0's ShutdownReq, which the stop of rank 0 just sent.
            state = self._await_rank0_shutdown(state)
        self._stop(state, 1)
        self._reap(1)
        self.result.unit_facts(self.host.read_unit("reap"))

    def _await_rank0_shutdown(self, state):
        """A rank >= 1 ends once rank 0's drain broadcast ShutdownReq; the unit's state when it did, or gave up."""
        with self.steps.run("follow_rank0") as step:
            deadline = self.clock() + FOLLOWER_EXIT_S
            while state.is_running and not ended_cleanly(state) and self.clock() < deadline:
                self.host.sleep(POLL_S)
                state = self.host.read_unit("follow_rank0")
            if ended_cleanly(state):
                step["detail"] = f"ended after rank 0's stop ({AUTO_RESTART}: its automatic restart is pending)"
            elif not state.is_running:
                step["detail"] = f"ended after rank 0's stop ({state.active_state})"
            else:
                step["detail"] = f"still {state.active_state} {FOLLOWER_EXIT_S:g} s after rank 0's stop"
        return state

    def _start_phase(self, before) -> None:
        if before.is_running:
            raise ChainFailure(
                "start",
                f"{before.name} is {before.active_state} ({before.sub_state}): the start phase starts a stopped unit "
                "(run the stop phase first), or its gate would judge the engine that already ran",
            )
        self.result.changed, self.result.healthy = True, None
        self._daemon_reload(before, 1)
        self._start(1)
        self.result.unit_facts(self.host.read_unit("start"))

    def _gate_phase(self, before) -> None:
        """The gate of a start made by an earlier phase (one attempt: a retry would restart the whole group)."""
        # The gate of a restart: changed as the chain's whole run is, so that callers read it as one.
        self.result.attempts, self.result.changed = 1, True
        # Any start counts as the one to gate: it was queued before this phase read the unit.
        earlier = replace(before, properties={k: v for k, v in before.properties.items() if k not in START_MARKS})
        self._conclude(*self._gate(earlier, 1, soak=0))

    def _after_failed_gate(self, gate: dict) -> None:
        attempts = self.result.attempts
        if attempts > 1:
            self.result.reason = (
                f"{gate['reason']} (after {attempts} starts, the unit's start limit; the last one is left running)"
            )
        self._explain()

    # -- stop, reap, start ----------------------------------------------------------------------

    def _stop(self, state, attempt: int) -> None:
        mode, why = stop_mode(state, self.host.serving_check())
        if self.options.node_rank and ended_cleanly(state):
            # Ended, not failing: rank 0's ShutdownReq ended it cleanly and Restart=always would bring it back
            # alone; the stop cancels that restart, and the group's start brings every rank back together.
            mode = "ended"
            why = (
                f"node_rank {self.options.node_rank} ended cleanly on rank 0's ShutdownReq ({state.active_state}, "
                f"{AUTO_RESTART}): its automatic restart cancelled, the group's start brings it back"
            )
        elif mode == "drain" and self.options.node_rank:
            # SGLang's rank >= 1 only logs a SIGTERM and waits for rank 0's ShutdownReq (engine.py
            # `_launch_subprocesses`): an ExecStop drain would wait out its budget. It serves no request.
            mode = "kill"
            why = (
                f"{state.active_state} ({state.sub_state}) on node_rank {self.options.node_rank}, which serves no "
                "request and stops only on rank 0's ShutdownReq: killed with SIGKILL, not drained"
            )
        self.result.stop_mode = mode
        unit = self.options.unit
        with self.steps.run("stop", attempt) as step:
            if mode == "kill":
                # Nothing to kill is fine: the unit may be waiting to restart with no process at all.
                self.host.systemctl("kill", "--signal=SIGKILL", unit)
            if mode != "none":
                self.host.systemctl_or_fail("stop", "stop", unit)
            step["detail"] = why
        with self.steps.run("reset_failed", attempt) as step:
            # systemd counts the chain's own starts against StartLimitBurst; without the reset a few restarts within
            # the interval would be refused.
            rc, out, err = self.host.systemctl("reset-failed", unit)
            step["detail"] = "failed state and start counter cleared" if rc == 0 else (err or out).strip()

    def _reap(self, attempt: int) -> bool:
        """Reap the unit's leftovers and orphans on its GPUs, wait for the release; True when holders were found."""
        found = []
        with self.steps.run("reap", attempt) as step:
            for params in reap_params(self.options):
                found.extend(self._reap_scope(params).get("reaped") or [])
            self.result.reaped.extend(holder(entry) for entry in found)
            reaped = ", ".join(f"{e['pid']} {e['title']!r}" for e in found)
            summary = f"reaped {len(found)} holder(s): {reaped}" if found else "no holders"
            step["detail"] = f"{summary}; GPUs at or below {self.options.reap['threshold_mib']} MiB"
        return bool(found)

    def _reap_scope(self, params: dict) -> dict:
        try:
            result = self.host.reap(params, False)
        except ReapInputError as exc:
            raise ChainFailure("reap", str(exc)) from None
        except ReapError as exc:
            self._refuse_unreapable(exc.result or {}, str(exc))
            raise ChainFailure("reap", str(exc)) from None
        self._refuse_unreapable(result, None)
        return result

    def _refuse_unreapable(self, result: dict, message: str | None) -> None:
        entries = result.get("unreapable") or []
        if not entries:
            return
        self.result.unreapable = entries
        if not message or "needs a reset or a reboot" not in message:
            message = "; ".join(
                f"GPU {entry.get('gpu')} needs a reset or a reboot: {entry.get('evidence') or entry}"
                for entry in entries
            )
        evidence = "; ".join(
            f"GPU {e.get('gpu')} ({e.get('uuid')}): pid {e.get('pid')} state {e.get('state')} holds {e.get('mib')} MiB"
            for e in entries
        )
        raise ChainFailure(
            "reap", f"{message}. Not started: {self.options.unit} stays stopped until then. Evidence: {evidence}"
        )

    def _daemon_reload(self, state, attempt: int) -> None:
        if state.properties.get("NeedDaemonReload") != "yes":
            return
        with self.steps.run("daemon_reload", attempt) as step:
            self.host.systemctl_or_fail("daemon_reload", "daemon-reload")
            step["detail"] = "the unit's files changed since systemd read them"

    def _start(self, attempt: int) -> None:
        with self.steps.run("start", attempt) as step:
            # The engine loads while the gate polls; waiting for the start job would only add its latency.
            self.host.systemctl_or_fail("start", "start", "--no-block", self.options.unit)
            step["detail"] = "start job queued"
        self.result.start = "queued"

    # -- snapshot, explanation, result ------------------------------------------------------------

    def _snapshot(self) -> None:
        known_good = self.options.known_good
        if not known_good.root:
            self.steps.note("snapshot", "skipped", "no known_good.root given")
            return
        try:
            with self.steps.run("snapshot") as step:
                saved = self._save_snapshot()
                step["detail"] = saved.get("msg", "")
                self.result.snapshot = saved.get("msg")
        except ChainFailure as failure:
            self._fail_step(failure, explain=True)

    def _save_snapshot(self) -> dict:
        options, result = self.options, self.result
        known_good = options.known_good
        meta = {
            "unit": options.unit,
            "patch_state_id": known_good.patch_state_id,
            "main_pid": result.main_pid,
            "gpu_memory_mib": result.gpu_memory_mib,
            "model": result.model,
            "speculative": result.speculative,
        }
        sources = {"python": known_good.python} if known_good.python else None
        unit_path = known_good.files.get("unit") or os.path.join("/etc/systemd/system", options.unit)
        dropin_dir = known_good.dropin_dir or unit_path + ".d"
        try:
            return self.host.store(known_good.root).save(
                known_good.files, dropin_dir, meta, check_mode=False, sources=sources
            )
        except (SnapshotError, OSError) as exc:
            raise ChainFailure("snapshot", f"the known-good snapshot was not saved: {exc}") from None

    def _fail_step(self, failure: ChainFailure, explain: bool) -> None:
        self.result.fail(failure)
        if explain:
            self._explain()

    def _explain(self) -> None:
        """The unit's state after a failure and the last journal lines."""
        try:
            self.result.unit_facts(self.host.read_unit("explain"))
        except ChainFailure as exc:
            self.warnings.append(str(exc))
        self.result.journal = self.host.journal(self.options.journal_lines)

    def _finish(self, before, started: float, check_mode: bool) -> dict:
        elapsed_s = round(self.clock() - started, 2)
        rendered = self.result.render(
            steps=self.steps.items,
            elapsed_s=elapsed_s,
            diff=self.result.diff(before, check_mode),
            warnings=self.warnings,
            msg=self.result.message(check_mode, elapsed_s),
        )
        return self.redactor.value(rendered)
