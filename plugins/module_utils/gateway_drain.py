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
- :meth:`GatewayDrain.wait_idle` waits while the engine's own ``/metrics`` reports requests running or queued, at
  most the drain budget. The gauges say "busy" reliably but never "idle": SGLang publishes them every
  ``decode_log_interval`` decode steps, without the batch just admitted and without requests still in the
  tokenizer. So this wait only lets the busy part pass while the engine is fully up; what the gauges miss is
  drained by SGLang itself during the stop (the unit's ExecStop waits for the main process's own drain, which
  counts every request it holds);
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

IN_FLIGHT_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
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


def in_flight(samples: dict) -> tuple | None:
    """``(running, queued)`` summed over every sample of each metric; None when neither is exported."""
    if not any(samples.get(name) for name in IN_FLIGHT_METRICS):
        return None
    return tuple(int(sum(value for _labels, value in samples.get(name) or ())) for name in IN_FLIGHT_METRICS)


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

        ``idle`` only says the gauges read 0 running and 0 queued: the stop that follows waits for SGLang's own
        drain, which answers what the gauges do not show.
        """
        budget = self.settings.drain_timeout
        started = self.clock()
        deadline = started + budget
        later = "; the stop waits for SGLang's own drain of what they do not show"
        while True:
            last = self.scrape()
            if last is None:
                # No /metrics (the engine does not run, or exports none): the stop's own drain is all there is.
                return self._drained(True, started, None, "the engine's /metrics did not answer" + later)
            if last == (0, 0):
                return self._drained(
                    True, started, last, "the engine's gauges show no running and no queued request" + later
                )
            now = self.clock()
            if now >= deadline:
                running, queued = last
                return self._drained(
                    False,
                    started,
                    last,
                    f"drain budget of {budget:g} s ended with {running} running and {queued} queued request(s) "
                    "on the engine; the stop waits for SGLang's own drain",
                )
            self.sleep(min(DRAIN_POLL_S, max(deadline - now, 0.0)))

    def _drained(self, idle: bool, started: float, last, detail: str) -> tuple:
        waited = round(self.clock() - started, 3)
        running, queued = last if last is not None else (None, None)
        self.state["drain"] = {"idle": idle, "waited_s": waited, "running": running, "queued": queued}
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
