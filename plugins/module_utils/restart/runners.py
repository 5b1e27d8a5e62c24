# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every effect the chain has on the host, behind injectable runners.

``run_command`` runs systemctl and journalctl; the reaper, the probe, the engine's /health, /ready and /metrics, the
snapshot store and the host lock default to the real ones on the host. Tests replace any of them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ansible_collections.llmops.inference.plugins.module_utils import host_lock as _host_lock
from ansible_collections.llmops.inference.plugins.module_utils.gpu_selection import ORPHAN_PATTERN
from ansible_collections.llmops.inference.plugins.module_utils.in_flight import IN_FLIGHT_METRICS, count_in_flight
from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore
from ansible_collections.llmops.inference.plugins.module_utils.probe import SglangProbe
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import ProbeSettings
from ansible_collections.llmops.inference.plugins.module_utils.reaper import GpuReaper, parse_options
from ansible_collections.llmops.inference.plugins.module_utils.reference_record import ReferenceEngine
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import ChainOptions
from ansible_collections.llmops.inference.plugins.module_utils.restart.result import ChainFailure, Steps
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangClient, SglangError
from ansible_collections.llmops.inference.plugins.module_utils.systemd import SHOW_PROPERTIES, SystemdError, show_unit

# The properties the chain reads besides those of every `systemctl show` of the collection.
UNIT_PROPERTIES = (
    *SHOW_PROPERTIES,
    "ExecMainPID",
    "InactiveExitTimestampMonotonic",
    "KillMode",
    "ExecStop",
    "NeedDaemonReload",
    "StartLimitBurst",
    "StartLimitIntervalUSec",
)
HEALTH_TIMEOUT_S = 5.0
METRICS_TIMEOUT_S = 2.0
CLIENT_TIMEOUT_S = 10.0


@dataclass
class Runners:
    """What the chain runs; None picks the host's own (see :class:`HostRunners`)."""

    run_command: Callable
    clock: Callable = time.monotonic
    sleep: Callable = time.sleep
    reap: Callable | None = None
    probe: Callable | None = None
    health: Callable | None = None
    ready: Callable | None = None
    scrape: Callable | None = None
    store: Any = KnownGoodStore
    locks: Any = _host_lock
    gateway_set: Any = None
    reference: Callable | None = None


class HostRunners:
    """The runners of one run, with the host's own in place of those not given."""

    def __init__(self, options: ChainOptions, given: Runners):
        self.options = options
        self.run_command = given.run_command
        self.clock, self.sleep = given.clock, given.sleep
        self.reap = given.reap or self._host_reap
        self.probe = given.probe or self._host_probe
        self.health = given.health or self._host_health
        self.ready = given.ready or self._host_ready
        self.scrape = given.scrape or self._host_in_flight
        self.store, self.locks, self.gateway_set = given.store, given.locks, given.gateway_set
        self.reference_engine = given.reference or self._host_reference_engine

    def _client(self, timeout: float = CLIENT_TIMEOUT_S) -> SglangClient:
        options = self.options
        return SglangClient(
            options.url, api_key=options.api_key, timeout=timeout, validate_certs=options.validate_certs
        )

    def _host_reap(self, params: dict, check_mode: bool) -> dict:
        return GpuReaper(parse_options(params), self.run_command).run(check_mode=check_mode)

    def _host_probe(self, settings: dict) -> dict:
        return SglangProbe.for_host(ProbeSettings(**settings).validate(), self._client(), self.run_command).run()

    def _host_reference_engine(self, settings: dict) -> ReferenceEngine:
        options = self.options
        return ReferenceEngine(options.url, options.api_key, options.validate_certs, settings)

    def _host_health(self) -> int:
        return self._client(HEALTH_TIMEOUT_S).health()

    def _host_ready(self) -> int:
        return self._client(HEALTH_TIMEOUT_S).ready()[1]

    def _host_in_flight(self):
        try:
            return count_in_flight(self._client(METRICS_TIMEOUT_S).metric_samples(IN_FLIGHT_METRICS))
        except SglangError:
            return None

    def engine_not_ready(self) -> str | None:
        """None when the engine's readiness endpoint answers 200, else what it answered."""
        try:
            status = self.ready()
        except SglangError as exc:
            return f"the engine is not ready: {exc}"
        return None if status == 200 else f"the engine is not ready: HTTP {status}"

    def serving_check(self):
        """What tells a unit that systemd restarted from one in its loop: the engine's readiness; none on a rank >= 1,
        whose dummy server has no /ready and whose unit (Restart=always) comes back after each of rank 0's stops."""
        return None if self.options.node_rank else self.engine_not_ready

    def systemctl(self, *args) -> tuple:
        return self.run_command(["systemctl", *args])

    def systemctl_or_fail(self, step: str, *args) -> None:
        """``systemctl ARGS``; a non-zero exit fails ``step`` with systemctl's own words."""
        rc, out, err = self.systemctl(*args)
        if rc != 0:
            command = " ".join(arg for arg in args if not arg.startswith("--"))
            raise ChainFailure(step, f"systemctl {command} failed (rc={rc}): {(err or out).strip()}")

    def read_unit(self, step: str = "unit"):
        try:
            return show_unit(self.run_command, self.options.unit, UNIT_PROPERTIES)
        except SystemdError as exc:
            raise ChainFailure(step, str(exc)) from None

    def journal(self, lines: int) -> list:
        rc, out, err = self.run_command(["journalctl", "-u", self.options.unit, "-n", str(lines), "--no-pager"])
        return out.splitlines() if rc == 0 else [f"journalctl failed (rc={rc}): {err.strip()}"]


class HostLock:
    """The host lock: taken by the chain, or checked when the caller holds it (``lock.token``).

    The chain renews a lock it took itself from a thread, every ``lock.renew_period`` s for as long as the module
    runs (the module is its run); a caller's lock is renewed by the caller's run (the host_lock action plugin's
    keeper). Before each step (``Steps.guard``) the chain checks that the lock is still held with its token: a lock
    lost meanwhile (broken, or let go because its run stopped renewing it) stops the chain before that step, as a
    ``lock_lost`` failure that names the lock and says the unit's state as the chain left it.

    With ``lock.retake`` (the stop of a failed group restart), a caller's token that no longer holds the lock is
    replaced by a lock taken anew, at once and without waiting: when another run holds it now, the host is left to
    that run and nothing is changed."""

    # Steps that change nothing on the host, run before the lock is known to be held, or give it back.
    UNGUARDED = ("lock", "unit", "unlock", "lock_lost")

    def __init__(self, runners: HostRunners, steps: Steps):
        self.options = runners.options.lock
        self.locks = runners.locks
        self.steps = steps
        self.record = {}
        self.token = None
        self._done = threading.Event()
        self._renewer = None
        self._lost = False

    def take(self, check_mode: bool) -> str | None:
        """Take the lock, or check the one the caller holds; return a token to release, or None."""
        if not self.options.path:
            self.steps.note("lock", "skipped", "no lock.path given")
            return None
        with self.steps.run("lock") as step:
            if self.options.token:
                step["detail"], own = self._check_held(check_mode)
            elif check_mode:
                step["detail"], own = self._would_take(), None
            else:
                own = self._acquire(step, self.options.timeout)
        if own:
            self._renew_while_running(own)
        if self.token and not check_mode:
            self.steps.guard = self.guard
        return own

    def _check_held(self, check_mode: bool) -> tuple:
        path, token = self.options.path, self.options.token
        if self.locks.held_with(path, token):
            self.token = token
            self.record = {"path": path, "taken": False}
            return f"held by the caller: {path}", None
        holder = self.locks.status(path)
        if not self.options.retake:
            raise ChainFailure(
                "lock", f"lost the host lock {path}: it is not held with the given lock.token ({holder.get('msg')})"
            )
        if check_mode:
            self.record = {"path": path, "taken": False, "held": holder.get("held")}
            return f"the caller's lock is gone: would take {path} anew ({holder.get('msg')})", None
        step = {}
        own = self._acquire(step, 0, lost=f"the caller's lock.token no longer holds {path}")
        self.record["retaken"] = True
        return f"the caller's lock.token no longer held {path}: {step.get('detail')}", own

    def _would_take(self) -> str:
        state = self.locks.status(self.options.path)
        self.record = {"path": self.options.path, "taken": False, "held": state.get("held")}
        return f"would take {self.options.path} ({state.get('msg')})"

    def _acquire(self, step: dict, timeout: float, lost: str = "") -> str:
        options = self.options
        try:
            record = self.locks.acquire(
                options.path, options.owner, timeout, options.renew_period, options.renew_margin
            )
        except self.locks.LockError as exc:
            reason = f"{lost}, and it cannot be taken anew: {exc}; nothing changed" if lost else str(exc)
            raise ChainFailure("lock", reason) from None
        step["detail"] = record.get("msg", "")
        self.record = {"path": options.path, "taken": True, "waited_s": record.get("waited_s")}
        self.token = record["token"]
        return record["token"]

    def _renew_while_running(self, token: str) -> None:
        renew = getattr(self.locks, "renew", None)
        if renew is None:
            return

        def keep():
            while not self._done.wait(self.options.renew_period):
                if not renew(self.options.path, token):
                    self._lost = True
                    return

        self._renewer = threading.Thread(target=keep, name="host-lock-renewer", daemon=True)
        self._renewer.start()

    def guard(self, step_name: str, during: bool = False) -> None:
        """Before ``step_name`` (or ``during`` it, from its waits): stop the chain when this run no longer holds the
        lock."""
        if step_name in self.UNGUARDED or not self.token:
            return
        path = self.options.path
        if not self._lost and self.locks.held_with(path, self.token):
            return
        now = self.locks.status(path).get("msg")
        reason = (
            f"lost the host lock {path} (now: {now}); stopped {'during' if during else 'before'} the {step_name} step "
            "and changed nothing after it: the unit is left as the service fields say"
        )
        self.steps.note("lock_lost", "failed", reason)
        raise ChainFailure("lock_lost", reason)

    def release(self, token: str, warnings: list) -> None:
        self._done.set()
        if self._renewer is not None:
            self._renewer.join()
        with self.steps.run("unlock") as step:
            try:
                step["detail"] = self.locks.release(self.options.path, token).get("msg", "")
            except (self.locks.LockError, OSError) as exc:
                step["status"], step["detail"] = "failed", str(exc)
                warnings.append(f"releasing the host lock: {exc}")


def reap_params(options: ChainOptions) -> tuple:
    """The reaper's two scopes: the unit's leftovers (no release wait), then orphans on its GPUs (waiting)."""
    reap = options.reap
    common = {"gpus": list(options.gpus), "grace": reap["grace"], "timeout": reap["timeout"]}
    leftovers = dict(common, unit=options.unit, wait_released=False)
    orphans = dict(common, match=ORPHAN_PATTERN, orphans_only=True, released_below_mib=reap["threshold_mib"])
    return leftovers, orphans
