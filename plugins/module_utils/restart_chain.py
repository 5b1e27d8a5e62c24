# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restart chain of an SGLang unit, the logic of the sglang_restart module.

Private to the llmops.inference collection; not a public API.

One run, each step timed and reported::

    lock -> unit (read it) -> gateway drain (with gateways) -> stop -> reset-failed -> reap
         -> daemon-reload (when systemd asks) -> start (not waiting for the job) -> gate
         -> gateway re-add (on a pass, with gateways) -> snapshot (on a pass) -> release the lock (always)

- gateway drain: every gateway replica is read first (one that cannot be used fails the chain before the stop),
  the worker is removed from each (refused, before the stop, when a gateway would keep fewer than
  ``gateway_min_healthy`` other healthy workers of its model), then the chain waits while the engine's /metrics
  shows requests in flight, at most the drain budget (module_utils/gateway_drain.py); the gauges never prove it
  idle, the stop's wait for SGLang's own drain does. After a passing gate the worker is added
  back and the chain waits until every gateway reports it healthy; a failed gate (or step) leaves it out of the
  gateways, and the result's ``gateway`` field says where it is.

- stop: a unit caught in a restart loop is killed with SIGKILL (it serves nothing, and a drain would only wait
  for processes that may ignore SIGTERM); a running unit is stopped, which runs its ExecStop drain. A loop is
  seen between two starts (auto-restart), during a start, or in the moment a restarted unit without a readiness
  gate is active while its engine is not ready (the engine's cheap readiness endpoint says so; nothing to drain).
- reap: GPU holders left in the unit's cgroup, then orphans titled ``^sglang::`` on the unit's GPUs, and a
  wait until every GPU of the unit is at or below the threshold (memory is released after its holder exits).
  A reaper that reports ``unreapable`` holders stops the chain before the start: the unit stays stopped.
- gate: wait (polling) until the unit is ready, then the probe's tiers; the stability window starts when the
  server first answered /health and overlaps the tiers; what is left of it is polled, failing at once when
  MainPID, NRestarts or ActiveState move. After an unclean stop (the reap found holders) the probe adds a soak
  of a few short generations. A gate that fails on the ``gpu`` tier (the model never loaded) is retried (stop,
  reap, start, gate) until the unit's start limit; the last attempt is left running.

Every effect goes through injected runners (``run_command`` for systemctl and journalctl, the clock, the
reaper, the probe, the snapshot store, the lock), so each step and failure is unit-tested without a host.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from ansible_collections.llmops.inference.plugins.module_utils import host_lock as _host_lock
from ansible_collections.llmops.inference.plugins.module_utils.gateway import (
    GATEWAY_SCHEMES,
    UNREACHABLE_CHOICES,
    UNREACHABLE_FAIL,
    normalize_url,
)
from ansible_collections.llmops.inference.plugins.module_utils.gateway_drain import (
    IN_FLIGHT_METRICS,
    DrainFailure,
    DrainSettings,
    GatewayDrain,
    in_flight,
)
from ansible_collections.llmops.inference.plugins.module_utils.gpu_selection import ORPHAN_PATTERN
from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore, SnapshotError
from ansible_collections.llmops.inference.plugins.module_utils.module_support import OptionError
from ansible_collections.llmops.inference.plugins.module_utils.probe import SglangProbe
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import (
    TIER_NAMES,
    ProbeInputError,
    ProbeSettings,
)
from ansible_collections.llmops.inference.plugins.module_utils.reaper import (
    GpuReaper,
    ReapError,
    ReapInputError,
    parse_options,
)
from ansible_collections.llmops.inference.plugins.module_utils.redact import Redactor
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangClient, SglangError, validate_url
from ansible_collections.llmops.inference.plugins.module_utils.systemd import (
    RUNNING_STATES,
    SystemdError,
    normalize_unit_name,
    parse_timespan,
    show_unit,
)
from ansible_collections.llmops.inference.plugins.module_utils.unit_verdicts import (
    DEAD_STATES,
    unit_not_active_reason,
    unit_restart_reason,
)

UNIT_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "ExecMainPID",
    "NRestarts",
    "ControlGroup",
    "ExecMainStatus",
    "ExecMainCode",
    "InvocationID",
    "InactiveExitTimestampMonotonic",
    "ActiveEnterTimestampMonotonic",
    "KillMode",
    "ExecStop",
    "NeedDaemonReload",
    "StartLimitBurst",
    "StartLimitIntervalUSec",
)
# How often the chain reads the unit while it waits: one `systemctl show` (a few ms) per poll.
POLL_S = 0.1
# How long systemd may take to begin the start job the chain queued (it is usually immediate).
START_PICKUP_S = 30.0
HEALTH_TIMEOUT_S = 5.0
METRICS_TIMEOUT_S = 2.0
CLD_EXITED = "1"
GATE_TIERS = TIER_NAMES


class ChainInputError(OptionError):
    """An option is wrong; nothing on the host was touched."""


class ChainFailure(Exception):
    """A step could not be done; ``step`` names it."""

    def __init__(self, step: str, reason: str, **facts):
        super().__init__(reason)
        self.step = step
        self.reason = reason
        self.facts = facts


@dataclass
class ChainOptions:
    unit: str
    url: str
    api_key: str | None = None
    validate_certs: bool = True
    gpus: tuple = ()
    ready_timeout: float = 1260.0
    ready_when_active: bool = False
    stability_window: float = 5.0
    soak: int = 3
    max_starts: int | None = None
    reap_grace: float = 10.0
    reap_timeout: float = 60.0
    threshold_mib: int = 1024
    probe: dict = field(default_factory=dict)
    lock_path: str | None = None
    lock_token: str | None = None
    lock_owner: dict = field(default_factory=dict)
    lock_timeout: float = 600.0
    lock_lease: float = 3600.0
    known_good_root: str | None = None
    known_good_files: dict = field(default_factory=dict)
    dropin_dir: str | None = None
    patch_state_id: str = "unknown"
    engine_python: str | None = None
    journal_lines: int = 30
    secrets: tuple = ()
    gateways: tuple = ()
    gateway_api_key: str | None = None
    gateway_worker_url: str | None = None
    gateway_min_healthy: int = 1
    gateway_wait_timeout: float = 120.0
    gateway_unreachable: str = UNREACHABLE_FAIL
    drain_timeout: float = 120.0


def _number(params: dict, option: str, default, minimum: float = 0.0, above: bool = False):
    value = params.get(option.rsplit(".", 1)[-1])
    if value is None:
        return default
    if value < minimum or (above and value == minimum):
        relation = "greater than" if above else "at least"
        raise ChainInputError(option, f"{option} must be {relation} {minimum:g}, got {value}")
    return value


def _absolute(option: str, path) -> str | None:
    if not path:
        return None
    if not os.path.isabs(path):
        raise ChainInputError(option, f"{option} must be an absolute path, got {path!r}")
    return path


def parse_chain_options(params: dict) -> ChainOptions:
    """The module's parameters as ChainOptions; raise ChainInputError naming a wrong option."""
    unit = (params.get("unit") or "").strip()
    if not unit:
        raise ChainInputError("unit", "unit must name the systemd unit that runs the server")
    try:
        url = validate_url(params.get("url"))
    except ValueError as exc:
        raise ChainInputError("url", str(exc)) from None
    reap = params.get("reap") or {}
    lock = params.get("lock") or {}
    known_good = params.get("known_good") or {}
    options = ChainOptions(
        unit=normalize_unit_name(unit),
        url=url,
        api_key=params.get("api_key") or None,
        validate_certs=params.get("validate_certs", True) is not False,
        gpus=tuple(str(gpu).strip() for gpu in params.get("gpus") or ()),
        ready_timeout=_number(params, "ready_timeout", 1260.0),
        ready_when_active=bool(params.get("ready_when_active")),
        stability_window=_number(params, "stability_window", 5.0),
        soak=_number(params, "soak", 3),
        max_starts=_number(params, "max_starts", None, 1),
        reap_grace=_number(reap, "reap.grace", 10.0),
        reap_timeout=_number(reap, "reap.timeout", 60.0, above=True),
        threshold_mib=_number(reap, "reap.threshold_mib", 1024),
        probe=dict(params.get("probe") or {}),
        lock_path=_absolute("lock.path", lock.get("path")),
        lock_token=lock.get("token") or None,
        lock_owner=dict(lock.get("owner") or {}),
        lock_timeout=_number(lock, "lock.timeout", 600.0),
        lock_lease=_number(lock, "lock.lease", 3600.0, above=True),
        known_good_root=_absolute("known_good.root", known_good.get("root")),
        known_good_files={
            name: _absolute(f"known_good.files.{name}", path) for name, path in (known_good.get("files") or {}).items()
        },
        dropin_dir=_absolute("known_good.dropin_dir", known_good.get("dropin_dir")),
        patch_state_id=known_good.get("patch_state_id") or "unknown",
        engine_python=_absolute("known_good.python", known_good.get("python")),
        journal_lines=_number(params, "journal_lines", 30, 1),
        secrets=tuple(params.get("redact") or ()),
        gateway_api_key=params.get("gateway_api_key") or None,
        gateway_min_healthy=_number(params, "gateway_min_healthy", 1),
        gateway_wait_timeout=_number(params, "gateway_wait_timeout", 120.0),
        gateway_unreachable=params.get("gateway_unreachable") or UNREACHABLE_FAIL,
        drain_timeout=_number(params, "drain_timeout", 120.0),
    )
    _gateway_options(options, params)
    if options.lock_token and not options.lock_path:
        raise ChainInputError("lock.token", "lock.token needs lock.path, the lock it was taken on")
    if options.known_good_root and not options.known_good_files:
        raise ChainInputError("known_good.files", "known_good.files must name the files to snapshot (unit, ...)")
    try:
        ProbeSettings(**_probe_settings(options, wait_timeout=0.0)).validate()
    except ProbeInputError as exc:
        raise ChainInputError(f"probe.{exc.option}", f"probe.{exc}") from None
    return options


def _gateway_options(options: ChainOptions, params: dict) -> None:
    """The gateways and the worker's URL as they tell it, normalized; raise ChainInputError naming a wrong one."""
    gateways = params.get("gateways") or []
    if isinstance(gateways, str):
        raise ChainInputError("gateways", f"gateways must be a list of gateway URLs, got the string {gateways!r}")
    try:
        options.gateways = tuple(normalize_url(url, "gateways", GATEWAY_SCHEMES) for url in gateways)
        worker = params.get("gateway_worker_url") or options.url
        options.gateway_worker_url = normalize_url(worker, "gateway_worker_url") if options.gateways else None
    except ValueError as exc:
        option = "gateways" if str(exc).startswith("gateways") else "gateway_worker_url"
        raise ChainInputError(option, str(exc)) from None
    duplicates = sorted({url for url in options.gateways if options.gateways.count(url) > 1})
    if duplicates:
        raise ChainInputError("gateways", f"gateways lists {', '.join(duplicates)} more than once")
    if isinstance(options.gateway_min_healthy, bool) or int(options.gateway_min_healthy) != options.gateway_min_healthy:
        raise ChainInputError("gateway_min_healthy", "gateway_min_healthy must be an integer >= 0")
    options.gateway_min_healthy = int(options.gateway_min_healthy)
    if options.gateway_unreachable not in UNREACHABLE_CHOICES:
        raise ChainInputError(
            "gateway_unreachable",
            f"gateway_unreachable must be {' or '.join(UNREACHABLE_CHOICES)}, got {options.gateway_unreachable!r}",
        )


def _probe_settings(options: ChainOptions, wait_timeout: float, soak: int = 0) -> dict:
    """ProbeSettings arguments for the gate: the unit's GPUs, no window of its own (the chain holds it)."""
    probe = options.probe
    settings = {
        "url": options.url,
        "unit": options.unit,
        "expected_gpus": list(options.gpus) or None,
        "tp_size": probe.get("tp_size"),
        "expected_model": probe.get("expected_model"),
        "min_gpu_memory_mib": probe.get("min_gpu_memory_mib", 1024),
        "max_new_tokens": probe.get("max_new_tokens", 32),
        "generate_timeout": probe.get("generate_timeout", 60.0),
        "min_tokens_per_s": probe.get("min_tokens_per_s"),
        "min_accept_length": probe.get("min_accept_length"),
        "stability_window": 0.0,
        "wait_timeout": wait_timeout,
        "poll_interval": POLL_S,
    }
    if soak:
        settings["soak_requests"] = soak
    return settings


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


def start_limit(state) -> str:
    burst = state.properties.get("StartLimitBurst") or "?"
    interval = parse_timespan(state.properties.get("StartLimitIntervalUSec"))
    shown = f"{interval:g} s" if interval is not None else state.properties.get("StartLimitIntervalUSec") or "?"
    return f"StartLimitBurst={burst} starts within StartLimitIntervalSec={shown}"


def dead_reason(state, since_ready: float | None = None) -> str:
    """Why a started unit no longer runs its server; a main process that exited with status 0 is named as such."""
    if not state.main_pid and state.exec_main_status == 0 and state.properties.get("ExecMainCode") == CLD_EXITED:
        when = f" {since_ready:.1f} s after the server first answered /health" if since_ready is not None else ""
        return (
            f"unit {state.name} is {state.active_state} (exited 0): its main process exited with status 0{when}, "
            "and Restart=on-failure does not restart a clean exit"
        )
    return unit_not_active_reason(state)


def _tiers(failed: str, reason: str, elapsed: float = 0.0, passed: list | None = None) -> list:
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


class _Steps:
    """The steps of one run, in order, each with its status, detail and time."""

    def __init__(self, clock):
        self.clock = clock
        self.items = []

    @contextmanager
    def run(self, name: str, attempt: int = 1):
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


class RestartChain:
    """One restart of one unit. ``run(check_mode)`` returns the module's result (redacted)."""

    def __init__(
        self,
        options: ChainOptions,
        run_command,
        *,
        clock=time.monotonic,
        sleep=time.sleep,
        reap=None,
        probe=None,
        health=None,
        ready=None,
        store=KnownGoodStore,
        locks=_host_lock,
        scrape=None,
        gateway_set=None,
    ):
        self.options = options
        self.run_command = run_command
        self.clock = clock
        self.sleep = sleep
        self.reap = reap or self._host_reap
        self.probe = probe or self._host_probe
        self.health = health or self._host_health
        self.ready = ready or self._host_ready
        self.store = store
        self.locks = locks
        self.redactor = Redactor([options.api_key, options.gateway_api_key, *options.secrets])
        self.steps = _Steps(clock)
        self.warnings = []
        self.drain = None
        self._left_gateways = False
        if options.gateways:
            settings = DrainSettings(
                gateways=options.gateways,
                worker_url=options.gateway_worker_url,
                api_key=options.gateway_api_key,
                worker_api_key=options.api_key,
                min_healthy=options.gateway_min_healthy,
                drain_timeout=options.drain_timeout,
                wait_timeout=options.gateway_wait_timeout,
                validate_certs=options.validate_certs,
                unreachable=options.gateway_unreachable,
            )
            self.drain = GatewayDrain(
                settings, scrape or self._host_in_flight, gateway_set=gateway_set, clock=clock, sleep=sleep
            )
        self.result = {
            "unit": options.unit,
            "healthy": False,
            "failed_step": None,
            "failed_tier": None,
            "reason": None,
            "tiers": [],
            "main_pid": None,
            "n_restarts": None,
            "active_state": None,
            "sub_state": None,
            "result": None,
            "gpu_memory_mib": {},
            "model": {},
            "speculative": {},
            "generation": {},
            "snapshot": None,
            "journal": [],
            "start": None,
            "start_limit": None,
            "stop_mode": None,
            "reaped": [],
            "unreapable": [],
            "soak": 0,
            "attempts": 0,
            "gates": [],
            "lock": {},
            "gateway": None,
            "changed": False,
        }

    # -- host runners ----------------------------------------------------------------------------

    def _host_reap(self, params: dict, check_mode: bool) -> dict:
        return GpuReaper(parse_options(params), self.run_command).run(check_mode=check_mode)

    def _client(self, timeout: float = 10.0) -> SglangClient:
        options = self.options
        return SglangClient(
            options.url, api_key=options.api_key, timeout=timeout, validate_certs=options.validate_certs
        )

    def _host_probe(self, settings: dict) -> dict:
        return SglangProbe.for_host(ProbeSettings(**settings).validate(), self._client(), self.run_command).run()

    def _host_health(self) -> int:
        return self._client(HEALTH_TIMEOUT_S).health()

    def _host_ready(self) -> int:
        return self._client(HEALTH_TIMEOUT_S).ready()[1]

    def _engine_not_ready(self) -> str | None:
        """None when the engine's readiness endpoint answers 200, else what it answered."""
        try:
            status = self.ready()
        except SglangError as exc:
            return f"the engine is not ready: {exc}"
        return None if status == 200 else f"the engine is not ready: HTTP {status}"

    def _host_in_flight(self):
        try:
            return in_flight(self._client(METRICS_TIMEOUT_S).metric_samples(IN_FLIGHT_METRICS))
        except SglangError:
            return None

    def _systemctl(self, *args) -> tuple:
        return self.run_command(["systemctl", *args])

    def _read_unit(self, step: str = "unit"):
        try:
            return show_unit(self.run_command, self.options.unit, UNIT_PROPERTIES)
        except SystemdError as exc:
            raise ChainFailure(step, str(exc)) from None

    # -- the run ---------------------------------------------------------------------------------

    def run(self, check_mode: bool = False) -> dict:
        started = self.clock()
        before = None
        token = None
        try:
            token = self._lock(check_mode)
            with self.steps.run("unit") as step:
                before = self._read_unit()
                if before.load_state != "not-found":
                    step["detail"] = f"{before.active_state} ({before.sub_state}), MainPID {before.main_pid}"
                elif check_mode:  # a first run in check mode installs nothing: its plan is the first start
                    step["detail"] = f"unit {before.name} not installed yet: a run installs it, then starts it"
                else:
                    raise ChainFailure("unit", f"unit {before.name} not found (LoadState=not-found); install it first")
            self.result["start_limit"] = start_limit(before)
            self._gateway_leave(check_mode)
            if check_mode:
                self._plan(before)
            else:
                self._attempts(before)
        except ChainFailure as failure:
            self._fail_step(failure, explain=failure.step not in ("lock", "unit", "gateway_drain") and not check_mode)
            if self._left_gateways:
                self.drain.kept_out(f"the chain failed at {failure.step}")
        finally:
            if token:
                self._release(token)
        if self.drain:
            self.result["gateway"] = self.drain.state
            self.warnings.extend(self.drain.warnings)
        return self._finish(before, started, check_mode)

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

    def _lock(self, check_mode: bool) -> str | None:
        """Take the host lock, or check the one the caller holds; return a token to release, or None."""
        options = self.options
        if not options.lock_path:
            self.steps.note("lock", "skipped", "no lock.path given")
            return None
        with self.steps.run("lock") as step:
            if options.lock_token:
                if not self.locks.held_with(options.lock_path, options.lock_token):
                    holder = self.locks.status(options.lock_path)
                    raise ChainFailure(
                        "lock", f"{options.lock_path} is not held with the given lock.token ({holder.get('msg')})"
                    )
                step["detail"] = f"held by the caller: {options.lock_path}"
                self.result["lock"] = {"path": options.lock_path, "taken": False}
                return None
            if check_mode:
                state = self.locks.status(options.lock_path)
                step["detail"] = f"would take {options.lock_path} ({state.get('msg')})"
                self.result["lock"] = {"path": options.lock_path, "taken": False, "held": state.get("held")}
                return None
            try:
                record = self.locks.acquire(
                    options.lock_path, options.lock_owner, options.lock_timeout, options.lock_lease
                )
            except self.locks.LockError as exc:
                raise ChainFailure("lock", str(exc)) from None
            step["detail"] = record.get("msg", "")
            self.result["lock"] = {"path": options.lock_path, "taken": True, "waited_s": record.get("waited_s")}
            return record["token"]

    def _release(self, token: str) -> None:
        with self.steps.run("unlock") as step:
            try:
                step["detail"] = self.locks.release(self.options.lock_path, token).get("msg", "")
            except (self.locks.LockError, OSError) as exc:
                step["status"], step["detail"] = "failed", str(exc)
                self.warnings.append(f"releasing the host lock: {exc}")

    def _attempts(self, before) -> None:
        state = before
        burst = before.properties.get("StartLimitBurst") or ""
        limit = self.options.max_starts or (int(burst) if burst.isdigit() and int(burst) > 0 else 1)
        self.result["changed"] = True
        gate = {}
        for attempt in range(1, limit + 1):
            self.result["attempts"] = attempt
            self._stop(state, attempt)
            holders = self._reap(attempt)
            self._daemon_reload(state, attempt)
            self._start(attempt)
            gate = self._gate(state, attempt, soak=self.options.soak if holders else 0)
            self.result["gates"].append(
                {
                    "attempt": attempt,
                    "healthy": gate["healthy"],
                    "failed_tier": gate.get("failed_tier"),
                    "reason": gate.get("reason"),
                    "main_pid": gate.get("main_pid"),
                }
            )
            if gate["healthy"] or gate.get("failed_tier") != "gpu" or attempt == limit:
                break
            # The model never loaded: a fresh start may load it. Stop (the unit serves nothing), reap, start again.
            state = self._read_unit("gate")
        self._take_gate(gate)
        try:
            self._gateway_rejoin(gate)
        except ChainFailure as failure:
            self._fail_step(failure, explain=False)
            return
        if gate["healthy"]:
            self._snapshot()
        else:
            if self.result["attempts"] > 1:
                self.result["reason"] = (
                    f"{gate['reason']} (after {self.result['attempts']} starts, the unit's start limit; the last "
                    "one is left running)"
                )
            self._explain()

    # -- stop, reap, start ----------------------------------------------------------------------

    def _stop(self, state, attempt: int) -> None:
        mode, why = stop_mode(state, self._engine_not_ready)
        self.result["stop_mode"] = mode
        unit = self.options.unit
        with self.steps.run("stop", attempt) as step:
            if mode == "kill":
                # Nothing to kill is fine: the unit may be waiting to restart with no process at all.
                self._systemctl("kill", "--signal=SIGKILL", unit)
            if mode != "none":
                rc, out, err = self._systemctl("stop", unit)
                if rc != 0:
                    raise ChainFailure("stop", f"systemctl stop {unit} failed (rc={rc}): {(err or out).strip()}")
            step["detail"] = why
        with self.steps.run("reset_failed", attempt) as step:
            # systemd counts the chain's own starts against StartLimitBurst; without the reset a few restarts within
            # the interval would be refused.
            rc, out, err = self._systemctl("reset-failed", unit)
            step["detail"] = "failed state and start counter cleared" if rc == 0 else (err or out).strip()

    def _reap_params(self) -> tuple:
        options = self.options
        common = {"gpus": list(options.gpus), "grace": options.reap_grace, "timeout": options.reap_timeout}
        leftovers = dict(common, unit=options.unit, wait_released=False)
        orphans = dict(common, match=ORPHAN_PATTERN, orphans_only=True, released_below_mib=options.threshold_mib)
        return leftovers, orphans

    def _reap(self, attempt: int) -> bool:
        """Reap the unit's leftovers and orphans on its GPUs, wait for the release; True when holders were found."""
        found = []
        with self.steps.run("reap", attempt) as step:
            for params in self._reap_params():
                result = self._reap_scope(params)
                found.extend(result.get("reaped") or [])
            self.result["reaped"].extend(_holder(entry) for entry in found)
            released = f"GPUs at or below {self.options.threshold_mib} MiB"
            step["detail"] = (
                f"reaped {len(found)} holder(s): " + ", ".join(f"{e['pid']} {e['title']!r}" for e in found)
                if found
                else "no holders"
            ) + f"; {released}"
        return bool(found)

    def _reap_scope(self, params: dict) -> dict:
        try:
            result = self.reap(params, False)
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
        self.result["unreapable"] = entries
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
            rc, out, err = self._systemctl("daemon-reload")
            if rc != 0:
                raise ChainFailure("daemon_reload", f"systemctl daemon-reload failed (rc={rc}): {(err or out).strip()}")
            step["detail"] = "the unit's files changed since systemd read them"

    def _start(self, attempt: int) -> None:
        unit = self.options.unit
        with self.steps.run("start", attempt) as step:
            # The engine loads while the gate below polls; waiting for the start job would only add its latency.
            rc, out, err = self._systemctl("start", "--no-block", unit)
            if rc != 0:
                raise ChainFailure("start", f"systemctl start {unit} failed (rc={rc}): {(err or out).strip()}")
            step["detail"] = "start job queued"
        self.result["start"] = "queued"

    # -- the gate --------------------------------------------------------------------------------

    def _gate(self, before, attempt: int, soak: int) -> dict:
        with self.steps.run("gate", attempt) as step:
            gate = self._wait_ready(before)
            if gate is None:
                gate = self._probe_and_hold(soak)
            step["status"] = "ok" if gate["healthy"] else "failed"
            step["detail"] = (
                f"passed, holding a stability window of {self.options.stability_window:g} s"
                if gate["healthy"]
                else f"{gate['failed_tier']} tier: {gate['reason']}"
            )
        return gate

    def _started(self, state, before) -> bool:
        """Whether ``state`` is of a start after ``before`` (a new invocation, or the unit left inactive again)."""
        new_id = state.properties.get("InvocationID")
        if new_id and new_id != before.properties.get("InvocationID"):
            return True
        exit_ts = state.properties.get("InactiveExitTimestampMonotonic")
        return bool(exit_ts) and exit_ts not in ("0", before.properties.get("InactiveExitTimestampMonotonic"))

    def _wait_ready(self, before) -> dict | None:
        """Poll until the server is ready (None: go on with the probe, from ``self._ready_at``), or a failed gate."""
        options = self.options
        start = self.clock()
        deadline = start + options.ready_timeout
        baseline = baseline_at = None
        last_health = None
        while True:
            now = self.clock()
            state = self._read_unit("gate")
            if not self._started(state, before):
                if now - start > START_PICKUP_S:
                    return self._failed_gate(
                        "unit", f"the start job of {options.unit} did not begin within {START_PICKUP_S:g} s", state
                    )
            else:
                if baseline is None:
                    # A manual start sets NRestarts to 0: any count above it is a restart of this start.
                    baseline, baseline_at = replace(state, n_restarts=0), now
                restart = unit_restart_reason(baseline, state, now - baseline_at)
                if restart:
                    return self._failed_gate("unit", restart, state)
                if state.active_state in DEAD_STATES:
                    return self._failed_gate("unit", dead_reason(state), state)
                if state.is_active:
                    if options.ready_when_active:
                        self._ready(state, now)
                        return None
                    try:
                        last_health = self.health()
                    except SglangError as exc:
                        last_health = str(exc)
                    if last_health == 200:
                        self._ready(state, self.clock())
                        return None
            if now >= deadline:
                if state.is_active:
                    answer = f"HTTP {last_health}" if isinstance(last_health, int) else last_health
                    unhealthy = f"/health did not answer 200 within {options.ready_timeout:g} s ({answer})"
                    return self._why_not_ready(state, unhealthy) or self._failed_gate("health", unhealthy, state)
                not_ready = (
                    f"unit {state.name} not ready within {options.ready_timeout:g} s: "
                    f"ActiveState={state.active_state}, SubState={state.sub_state}"
                )
                return self._why_not_ready(state, not_ready) or self._failed_gate("unit", not_ready, state)
            self.sleep(POLL_S)

    def _why_not_ready(self, state, not_ready: str) -> dict | None:
        """A failed gate on the ``gpu`` tier when a unit that is not ready holds no model on its GPUs, else None.

        An engine that never loads answers /health with 503 for ever, and SGLang's readiness gate (ExecStartPost)
        keeps its unit ``activating``: neither tells a model that did not load (worth a fresh start) from a slow one.
        """
        if not state.main_pid:
            return None
        probe = self.probe({**_probe_settings(self.options, wait_timeout=0.0), "tiers": ["gpu"]})
        if probe.get("healthy") or probe.get("failed_tier") != "gpu":
            return None
        gate = self._failed_gate("gpu", f"{probe.get('reason')} ({not_ready})", state)
        gate["gpu_memory_mib"] = probe.get("gpu_memory_mib") or {}
        return gate

    def _ready(self, state, now: float) -> None:
        """The moment the server first answered /health: with a readiness gate, when the unit turned active."""
        ready_at = now
        entered = state.properties.get("ActiveEnterTimestampMonotonic") or ""
        if self.options.ready_when_active and entered.isdigit() and 0 < int(entered) / 1e6 <= now:
            ready_at = int(entered) / 1e6
        self._ready_at, self._ready_state = ready_at, state

    def _probe_and_hold(self, soak: int) -> dict:
        options = self.options
        window_end = self._ready_at + options.stability_window
        # Within the window the probe may try again (a tier that was not ready yet); after it, it decides.
        settings = _probe_settings(options, wait_timeout=max(0.0, window_end - self.clock()), soak=soak)
        self.result["soak"] = soak
        probe = self.probe(settings)
        gate = {
            "healthy": bool(probe.get("healthy")),
            "failed_tier": probe.get("failed_tier"),
            "reason": probe.get("reason"),
            "tiers": list(probe.get("tiers") or []),
            "main_pid": probe.get("main_pid"),
            "gpu_memory_mib": probe.get("gpu_memory_mib") or {},
            "model": probe.get("model") or {},
            "speculative": probe.get("speculative") or {},
            "generation": probe.get("generation") or {},
        }
        if not gate["healthy"]:
            return gate
        moved = self._hold_window(window_end)
        if moved is not None:
            state, reason = moved
            gate.update(self._failed_gate("unit", reason, state, passed=gate["tiers"]))
        return gate

    def _hold_window(self, window_end: float):
        """Poll the unit until the window ends; ``(state, reason)`` as soon as it moved, else None."""
        base = self._ready_state
        while True:
            now = self.clock()
            state = self._read_unit("gate")
            since = now - self._ready_at
            verdict = unit_restart_reason(base, state, since)
            if verdict is None and not state.is_active:
                verdict = dead_reason(state, since)
            if verdict is not None:
                window = self.options.stability_window
                return state, f"{verdict} (within the stability window of {window:g} s after the first /health 200)"
            self._final_state = state
            if now >= window_end:
                return None
            self.sleep(min(POLL_S, window_end - now))

    def _failed_gate(self, tier: str, reason: str, state, passed: list | None = None) -> dict:
        return {
            "healthy": False,
            "failed_tier": tier,
            "reason": reason,
            "tiers": _tiers(tier, reason, passed=passed),
            "main_pid": state.main_pid or None,
        }

    def _take_gate(self, gate: dict) -> None:
        for key in ("healthy", "failed_tier", "reason", "tiers", "main_pid", "gpu_memory_mib"):
            if key in gate:
                self.result[key] = gate[key]
        for key in ("model", "speculative", "generation"):
            self.result[key] = gate.get(key) or {}
        state = getattr(self, "_final_state", None)
        if gate["healthy"] and state is not None:
            self._unit_facts(state)

    # -- snapshot, explanation, result ------------------------------------------------------------

    def _snapshot(self) -> None:
        options = self.options
        if not options.known_good_root:
            self.steps.note("snapshot", "skipped", "no known_good.root given")
            return
        result = self.result
        meta = {
            "unit": options.unit,
            "patch_state_id": options.patch_state_id,
            "main_pid": result["main_pid"],
            "gpu_memory_mib": result["gpu_memory_mib"],
            "model": result["model"],
            "speculative": result["speculative"],
        }
        sources = {"python": options.engine_python} if options.engine_python else None
        dropin_dir = options.dropin_dir or self._unit_path() + ".d"
        try:
            with self.steps.run("snapshot") as step:
                try:
                    saved = self.store(options.known_good_root).save(
                        options.known_good_files, dropin_dir, meta, check_mode=False, sources=sources
                    )
                except (SnapshotError, OSError) as exc:
                    raise ChainFailure("snapshot", f"the known-good snapshot was not saved: {exc}") from None
                step["detail"] = saved.get("msg", "")
                result["snapshot"] = saved.get("msg")
        except ChainFailure as failure:
            self._fail_step(failure, explain=True)

    def _unit_path(self) -> str:
        return self.options.known_good_files.get("unit") or os.path.join("/etc/systemd/system", self.options.unit)

    def _fail_step(self, failure: ChainFailure, explain: bool) -> None:
        self.result.update(healthy=False, failed_step=failure.step, reason=failure.reason, **failure.facts)
        if explain:
            self._explain()

    def _unit_facts(self, state) -> None:
        self.result.update(
            active_state=state.active_state,
            sub_state=state.sub_state,
            result=state.result,
            n_restarts=state.n_restarts,
        )
        self.result["start_limit"] = start_limit(state)
        if self.result["main_pid"] is None and state.main_pid:
            self.result["main_pid"] = state.main_pid

    def _explain(self) -> None:
        """The unit's state after a failure and the last journal lines."""
        try:
            self._unit_facts(self._read_unit("explain"))
        except ChainFailure as exc:
            self.warnings.append(str(exc))
        lines = self.options.journal_lines
        rc, out, err = self.run_command(["journalctl", "-u", self.options.unit, "-n", str(lines), "--no-pager"])
        self.result["journal"] = out.splitlines() if rc == 0 else [f"journalctl failed (rc={rc}): {err.strip()}"]

    def _plan(self, before) -> None:
        """Check mode: what the chain would do, from what it reads; nothing is changed."""
        mode, why = stop_mode(before, self._engine_not_ready)
        plan = {"stop": {"mode": mode, "why": why}, "reap": {}}
        leftovers, orphans = self._reap_params()
        scopes = [("orphans", orphans)]
        if before.is_running:
            plan["reap"]["unit"] = "the unit runs now; its leftovers, if any, are reaped after the stop"
        else:
            scopes.insert(0, ("unit", leftovers))
        for name, params in scopes:
            try:
                answer = self.reap(params, True)
            except (ReapError, ReapInputError) as exc:
                plan["reap"][name] = f"cannot tell: {exc}"
                continue
            plan["reap"][name] = [_holder(entry) for entry in answer.get("reaped") or []]
            if answer.get("unreapable"):
                self.result["unreapable"].extend(answer["unreapable"])
                plan["reap"]["unreapable"] = "GPU memory nobody can free: the chain would stop before the start"
        options = self.options
        plan["daemon_reload"] = before.properties.get("NeedDaemonReload") == "yes"
        plan["start"] = f"systemctl start --no-block {options.unit}"
        plan["gate"] = (
            f"wait up to {options.ready_timeout:g} s for the server to be ready, then probe "
            f"{', '.join(GATE_TIERS)} with a stability window of {options.stability_window:g} s"
            + (f" and a soak of {options.soak} generations if the reap finds holders" if options.soak else "")
        )
        plan["snapshot"] = options.known_good_root
        if self.drain:
            gateways = ", ".join(options.gateways)
            plan["gateway"] = {
                "remove": self.drain.state["detail"],
                "drain": f"wait up to {options.drain_timeout:g} s while the engine's /metrics shows requests running "
                "or queued; the stop then waits for SGLang's own drain",
                "add": f"after a passing gate, add {options.gateway_worker_url} to {gateways} and wait until each "
                "reports it healthy; a failed gate leaves it out; a gateway that cannot be reached then "
                + ("fails the host" if options.gateway_unreachable == UNREACHABLE_FAIL else "is a warning")
                + " (gateway_unreachable)",
            }
        self.result.update(plan=plan, stop_mode=mode, changed=True, healthy=None)
        self.steps.note("stop", "planned", why)

    def _diff(self, before, check_mode: bool) -> dict:
        def render(active, sub, pid):
            return f"ActiveState={active}\nSubState={sub}\nMainPID={pid}\n"

        old = render(before.active_state, before.sub_state, before.main_pid) if before else ""
        if check_mode:
            new = render("active", "running", "(new)")
        else:
            new = render(self.result["active_state"], self.result["sub_state"], self.result["main_pid"])
        return {"before": old, "after": new, "before_header": self.options.unit, "after_header": self.options.unit}

    def _finish(self, before, started: float, check_mode: bool) -> dict:
        result = self.result
        result["steps"] = self.steps.items
        result["elapsed_s"] = round(self.clock() - started, 2)
        result["diff"] = self._diff(before, check_mode)
        result["warnings"] = self.warnings
        result["msg"] = self._message(check_mode)
        return self.redactor.value(result)

    def _message(self, check_mode: bool) -> str:
        result = self.result
        unit = self.options.unit
        if check_mode:
            plan = result.get("plan") or {}
            if not plan:
                return f"check mode: {unit} restart chain would stop at {result['failed_step']}: {result['reason']}"
            return f"check mode: would restart {unit}: {plan['stop']['why']}; then reap, start and gate it"
        if result["healthy"]:
            rejoined = " and is back in its gateway(s)" if (result["gateway"] or {}).get("in_gateways") else ""
            return f"{unit} passed its gate after {result['elapsed_s']:.1f} s (MainPID {result['main_pid']}){rejoined}"
        if result["failed_step"]:
            lines = [f"{unit} restart chain failed at {result['failed_step']}: {result['reason']}"]
        else:
            lines = [f"{unit} failed its gate: {result['failed_tier']} tier: {result['reason']}"]
        gateway = result["gateway"] or {}
        if gateway.get("in_gateways") is False:
            left_out = gateway.get("left_out") or gateway["gateways"]
            lines[0] += f" ({gateway['worker_url']} is left out of its gateway(s): {', '.join(left_out)})"
        if result["active_state"]:
            line = (
                f"unit: ActiveState={result['active_state']} SubState={result['sub_state']} "
                f"Result={result['result']} NRestarts={result['n_restarts']}"
            )
            if result["result"] == "start-limit-hit":
                line += f"; systemd stopped restarting it: start limit hit ({result['start_limit']})"
            elif result["active_state"] != "active" and result["failed_step"] is None:
                line += f"; Restart=on-failure retries at most {result['start_limit']}, then leaves it failed"
            lines.append(line)
        if result["journal"]:
            lines.append(f"last {self.options.journal_lines} journal lines:")
            lines.extend(result["journal"])
        return "\n".join(lines)


def _holder(entry: dict) -> dict:
    return {key: entry.get(key) for key in ("pid", "title", "unit", "gpus", "used_mib", "signals", "exited")}
