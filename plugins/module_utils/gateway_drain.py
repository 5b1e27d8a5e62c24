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
- :meth:`GatewayDrain.wait_idle` polls the engine's own ``/metrics`` until ``sglang:num_running_reqs`` and
  ``sglang:num_queue_reqs`` are both 0 on consecutive scrapes, or the drain budget ends (said in the detail);
- :meth:`GatewayDrain.rejoin` adds the worker to every replica (where the removal is still draining, once its
  old entry is gone) and waits until each reports it healthy.

Every failure is a :class:`DrainFailure` whose text names what was refused or could not be done and what was
changed so far; the chain reports it as its ``gateway_drain`` or ``gateway_add`` step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.gateway import (
    OUT_OF_ROTATION,
    GatewayError,
    GatewaySet,
    GatewaysUnavailable,
    MembershipIncomplete,
    RemovalRefused,
)

IN_FLIGHT_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
# A request the gateway sent just before the removal may still be on its way: idle counts after this many scrapes.
IDLE_SCRAPES = 2
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
            api_key=settings.api_key,
            validate_certs=settings.validate_certs,
            worker_api_key=settings.worker_api_key,
            wait_timeout=settings.wait_timeout,
            clock=clock,
            sleep=sleep,
        )
        self.state = {
            "worker_url": settings.worker_url,
            "gateways": self.gateways.urls,
            "min_healthy": settings.min_healthy,
            "removed_from": [],
            "draining_on": [],
            "drain": None,
            "added_to": [],
            "in_gateways": None,
            "detail": None,
        }

    # -- out ----------------------------------------------------------------------------------------------

    def leave(self, check_mode: bool = False) -> str:
        """Remove the worker from every gateway (in check mode: say where it would be removed)."""
        worker = self.settings.worker_url
        try:
            result = self.gateways.remove(
                worker, min_healthy=self.settings.min_healthy, check_mode=check_mode, until=OUT_OF_ROTATION
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
        self.state["draining_on"] = [view.url for view in result.views if view.draining]
        self.state["in_gateways"] = bool(check_mode and listed)
        where = ", ".join(listed) if listed else "none of them listed it"
        verb = "would remove" if check_mode else "removed"
        detail = f"{verb} {worker} from {len(listed)} of {len(result.views)} gateway(s): {where}"
        self.state["detail"] = detail
        return detail

    def wait_idle(self) -> tuple:
        """Poll the engine's /metrics until nothing runs or waits; ``(idle, detail)``."""
        budget = self.settings.drain_timeout
        started = self.clock()
        deadline = started + budget
        idle_scrapes = 0
        last = None
        while True:
            last = self.scrape()
            if last is None:
                # No /metrics (the engine does not run, or exports none): there is nothing to wait for.
                return self._drained(True, started, None, "the engine's /metrics did not answer: nothing to drain")
            idle_scrapes = idle_scrapes + 1 if last == (0, 0) else 0
            if idle_scrapes >= IDLE_SCRAPES:
                return self._drained(True, started, last, "no running and no queued request on the engine")
            now = self.clock()
            if now >= deadline:
                running, queued = last
                return self._drained(
                    False,
                    started,
                    last,
                    f"drain budget of {budget:g} s ended with {running} running and {queued} queued request(s) "
                    "on the engine; stopping anyway",
                )
            self.sleep(min(DRAIN_POLL_S, max(deadline - now, 0.0)))

    def _drained(self, idle: bool, started: float, last, detail: str) -> tuple:
        waited = round(self.clock() - started, 3)
        running, queued = last if last is not None else (None, None)
        self.state["drain"] = {"idle": idle, "waited_s": waited, "running": running, "queued": queued}
        return idle, f"{detail} (after {waited:g} s)"

    # -- back in ------------------------------------------------------------------------------------------

    def rejoin(self) -> str:
        """Add the worker to every gateway and wait until each reports it healthy."""
        worker = self.settings.worker_url
        try:
            result = self.gateways.add(worker)
        except MembershipIncomplete as exc:
            added = [view.url for view in exc.result.views if view.changed]
            self.state["added_to"] = added
            self.state["in_gateways"] = False
            raise DrainFailure(f"the gate passed but re-adding the worker failed: {exc}") from None
        except (GatewaysUnavailable, GatewayError) as exc:
            self.state["in_gateways"] = False
            raise DrainFailure(f"the gate passed but re-adding the worker failed: {exc}") from None
        self.state["added_to"] = [view.url for view in result.views if view.changed]
        self.state["in_gateways"] = True
        detail = f"{worker} healthy on all {len(result.views)} gateway(s): {', '.join(self.gateways.urls)}"
        self.state["detail"] = detail
        return detail

    def kept_out(self, why: str) -> str:
        """The worker stays out of the gateways (the gate failed); the detail says so."""
        self.state["in_gateways"] = False
        detail = f"{self.settings.worker_url} left out of {', '.join(self.gateways.urls)}: {why}"
        self.state["detail"] = detail
        return detail
