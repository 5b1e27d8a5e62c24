# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One worker out of its gateways before a restart, and back in after a passing gate: the restart chain's drain.

Private to the llmops.inference collection; not a public API.

- :meth:`GatewayDrain.leave` reads every gateway replica (one that cannot be used stops it before any change),
  refuses when the removal would leave a gateway with fewer than ``min_healthy`` other healthy workers of the
  worker's model, then removes the worker from every replica and waits until none routes to it (each lists it
  no more, or as draining: smg drops a removed worker from its list about 5 s after it stops routing to it, and
  what is still in flight is the engine's to tell, below);
- :meth:`GatewayDrain.wait_idle` waits while the engine's own ``/metrics`` reports requests in flight, at most the
  drain budget, read by module_utils/in_flight.py: ``sglang:http_requests_active`` summed over every endpoint but
  the probes' own, which counts each HTTP request from before its handler until its last streamed byte (live);
  where the engine does not export it, the scheduler's gauges, which say "busy" reliably but never "idle" (SGLang
  publishes them every ``decode_log_interval`` decode steps, without the batch just admitted and without
  requests still in the tokenizer). The detail says which it waited on. What the wait misses is drained by SGLang
  itself during the stop (the unit's ExecStop waits for the main process's own drain, which counts every request
  it holds);
- :meth:`GatewayDrain.rejoin` adds the worker to every replica that can be used (where the removal is still
  draining, once its old entry is gone) and waits until each reports it healthy. A replica that cannot be used
  never keeps the worker out of the others.

A replica that cannot be reached (``unreachable``): before the removal it stops the drain (``fail``), or is left
aside with a warning (``warn``); one that stops answering after it accepted the removal routes nothing to the
worker and is left aside with a warning either way. At the re-add, with ``fail`` one that cannot be reached fails
the re-add once every other replica reports the worker healthy; with ``warn`` it is a warning. A replica that
answers but cannot be used fails the re-add either way. ``state["unreachable"]`` names the replicas left aside.

Every failure is a :class:`DrainFailure` whose text names what was refused or could not be done and what was
changed so far; the chain reports it as its ``gateway_drain`` or ``gateway_add`` step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.gateway import (
    OUT_OF_ROTATION,
    UNREACHABLE_FAIL,
    ChangeMode,
    GatewayAccess,
    GatewaySet,
    GatewaysUnavailable,
    MembershipIncomplete,
    Polling,
    RemovalRefused,
)
from ansible_collections.llmops.inference.plugins.module_utils.gateway_client import GatewayError
from ansible_collections.llmops.inference.plugins.module_utils.in_flight import HTTP_REQUESTS_ACTIVE, InFlight

DRAIN_POLL_S = 0.2


class DrainFailure(Exception):
    """The drain or the re-add could not be done; ``str()`` says why and what changed."""


@dataclass
class DrainSettings:
    gateways: tuple
    worker_url: str
    api_key: str | None = None
    worker_api_key: str | None = None
    min_healthy: int = 1
    drain_timeout: float = 120.0
    wait_timeout: float = 120.0
    validate_certs: bool = True
    unreachable: str = UNREACHABLE_FAIL


class GatewayDrain:
    """The drain of one worker; ``state`` (what the result's ``gateway`` field holds) records each step."""

    def __init__(self, settings: DrainSettings, scrape, *, gateway_set=None, clock=time.monotonic, sleep=time.sleep):
        self.settings = settings
        self.scrape = scrape
        self.clock = clock
        self.sleep = sleep
        self.gateways = gateway_set or GatewaySet(
            list(settings.gateways),
            GatewayAccess(
                settings.api_key, validate_certs=settings.validate_certs, worker_api_key=settings.worker_api_key
            ),
            Polling(settings.wait_timeout, clock=clock, sleep=sleep),
        )
        self.state = {
            "worker_url": settings.worker_url,
            "gateways": self.gateways.urls,
            "min_healthy": settings.min_healthy,
            "removed_from": [],
            "draining_on": [],
            "drain": None,
            "added_to": [],
            "unreachable": [],
            "left_out": [],
            "in_gateways": None,
            "detail": None,
        }
        self.warnings = []

    # -- out ----------------------------------------------------------------------------------------------

    def leave(self, check_mode: bool = False) -> str:
        """Remove the worker from every gateway (in check mode: say where it would be removed)."""
        worker = self.settings.worker_url
        try:
            result = self.gateways.remove(
                worker,
                ChangeMode(check_mode=check_mode, unreachable=self.settings.unreachable),
                min_healthy=self.settings.min_healthy,
                until=OUT_OF_ROTATION,
            )
        except GatewaysUnavailable as exc:
            self.state["in_gateways"] = None
            raise DrainFailure(f"{exc}; the engine was not stopped") from None
        except RemovalRefused as exc:
            self.state["in_gateways"] = True
            raise DrainFailure(f"{exc}; the engine was not stopped") from None
        except MembershipIncomplete as exc:
            removed = [view.url for view in exc.result.views if view.changed]
            self.state["removed_from"] = removed
            self.state["in_gateways"] = False
            left = f"; it is out of {', '.join(removed)} until a restart passes" if removed else ""
            raise DrainFailure(f"{exc}; the engine was not stopped{left}") from None
        except (GatewayError, ValueError) as exc:
            raise DrainFailure(f"{exc}; the engine was not stopped") from None
        listed = [view.url for view in result.views if view.changed]
        self.state["removed_from"] = listed
        self.state["draining_on"] = [view.url for view in result.views if view.usable and view.draining]
        self.state["in_gateways"] = bool(check_mode and listed)
        where = ", ".join(listed) if listed else "none of them listed it"
        verb = "would remove" if check_mode else "removed"
        detail = f"{verb} {worker} from {len(listed)} of {len(result.views)} gateway(s): {where}"
        aside = self._set_aside(result, "the removal went on without it")
        self.state["detail"] = detail + (f"; {aside}" if aside else "")
        return self.state["detail"]

    def _set_aside(self, result, consequence: str) -> str:
        """Record and warn about the gateways the operation left aside; the text names each and why."""
        skipped = result.skipped
        for view in skipped:
            if view.url not in self.state["unreachable"]:
                self.state["unreachable"].append(view.url)
        if not skipped:
            return ""
        text = f"{len(skipped)} gateway(s) left aside ({consequence}): " + "; ".join(str(v.error) for v in skipped)
        self.warnings.append(f"{self.settings.worker_url}: {text}")
        return text

    def wait_idle(self) -> tuple:
        """Wait while the engine's /metrics reports requests in flight; ``(idle, detail)``.

        ``scrape()`` returns an :class:`InFlight` (module_utils/in_flight.py) or None. ``idle`` says the count read
        0: with ``sglang:http_requests_active`` no HTTP request was open then; with the scheduler's gauges only that
        they read 0 running and 0 queued. The stop that follows waits for SGLang's own drain either way.
        """
        budget = self.settings.drain_timeout
        started = self.clock()
        deadline = started + budget
        while True:
            last = self.scrape()
            if last is None:
                # No /metrics (the engine does not run, or exports none): the stop's own drain is all there is.
                return self._drained(
                    True,
                    started,
                    None,
                    "the engine's /metrics did not answer; the stop waits for SGLang's own drain of what is in flight",
                )
            if last.idle:
                return self._drained(True, started, last, self._idle_text(last))
            now = self.clock()
            if now >= deadline:
                return self._drained(
                    False,
                    started,
                    last,
                    f"drain budget of {budget:g} s ended with {self._count_text(last)} on the engine; the stop "
                    "waits for SGLang's own drain",
                )
            self.sleep(min(DRAIN_POLL_S, max(deadline - now, 0.0)))

    @staticmethod
    def _idle_text(last: InFlight) -> str:
        if last.live:
            return (
                f"waited on {HTTP_REQUESTS_ACTIVE}: no HTTP request in flight on the engine; the stop waits for "
                "SGLang's own drain of any that arrives meanwhile"
            )
        return (
            f"waited on the scheduler gauges ({HTTP_REQUESTS_ACTIVE} not exported): no running and no queued "
            "request; the stop waits for SGLang's own drain of what they do not show"
        )

    @staticmethod
    def _count_text(last: InFlight) -> str:
        if last.live:
            return f"{last.requests} HTTP request(s) in flight ({HTTP_REQUESTS_ACTIVE})"
        return f"{last.running} running and {last.queued} queued request(s) (scheduler gauges)"

    def _drained(self, idle: bool, started: float, last: InFlight | None, detail: str) -> tuple:
        waited = round(self.clock() - started, 3)
        self.state["drain"] = {
            "idle": idle,
            "waited_s": waited,
            "source": last.source if last is not None else None,
            "requests": last.requests if last is not None else None,
            "running": last.running if last is not None else None,
            "queued": last.queued if last is not None else None,
        }
        return idle, f"{detail} (after {waited:g} s)"

    # -- back in ------------------------------------------------------------------------------------------

    def rejoin(self) -> str:
        """Add the worker to every gateway that can be used and wait until each reports it healthy; then fail for
        those that could not be used (with ``warn``, only for those that answered)."""
        worker = self.settings.worker_url
        try:
            result = self.gateways.add(worker, best_effort=True)
        except MembershipIncomplete as exc:
            added = [view.url for view in exc.result.views if view.changed]
            self.state["added_to"] = added
            self.state["in_gateways"] = False
            self.state["left_out"] = [view.url for view in exc.result.views if view.problem or not view.usable]
            raise DrainFailure(f"the gate passed but re-adding the worker failed: {exc}") from None
        except (GatewaysUnavailable, GatewayError) as exc:
            self.state["in_gateways"] = False
            raise DrainFailure(f"the gate passed but re-adding the worker failed: {exc}") from None
        self.state["added_to"] = [view.url for view in result.views if view.changed]
        back = [view.url for view in result.views if view.usable]
        skipped = result.skipped
        healthy = f"{worker} healthy on {len(back)} of {len(result.views)} gateway(s): {', '.join(back) or 'none'}"
        if not skipped:
            self.state["in_gateways"] = True
            detail = f"{worker} healthy on all {len(result.views)} gateway(s): {', '.join(back)}"
            self.state["detail"] = detail
            return detail
        tolerated = self.settings.unreachable != UNREACHABLE_FAIL and all(view.error.unreachable for view in skipped)
        if tolerated:
            self.state["in_gateways"] = True
            aside = self._set_aside(result, f"gateway_unreachable={self.settings.unreachable}")
            self.state["detail"] = f"{healthy}; {aside}"
            return self.state["detail"]
        self.state["in_gateways"] = False
        self.state["left_out"] = [view.url for view in skipped]
        for view in skipped:
            if view.error.unreachable and view.url not in self.state["unreachable"]:
                self.state["unreachable"].append(view.url)
        problems = "; ".join(str(view.error) for view in skipped)
        unreached = any(view.error.unreachable for view in skipped)
        policy = f" (gateway_unreachable={self.settings.unreachable})" if unreached else ""
        message = f"the gate passed and {healthy}, but {len(skipped)} gateway(s) could not be used{policy}: {problems}"
        self.state["detail"] = message
        raise DrainFailure(message)

    def kept_out(self, why: str) -> str:
        """The worker stays out of the gateways (the gate failed); the detail says so."""
        self.state["in_gateways"] = False
        self.state["left_out"] = list(self.gateways.urls)
        detail = f"{self.settings.worker_url} left out of {', '.join(self.gateways.urls)}: {why}"
        self.state["detail"] = detail
        return detail
