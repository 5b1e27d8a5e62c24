# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Membership of one worker (an SGLang engine's URL) across the replicas of an SGLang gateway.

Private to the llmops.inference collection; not a public API. One replica over HTTP (its dialect, its listing, an
add, a removal) is gateway_client.py's :class:`GatewayClient`; this file decides for all of them together.

Replicas do not share a registry, so every change is made on each of them. Every gateway is read first; a
gateway that cannot be used, a refused removal or bad input stops the operation before any gateway changes.
With ``unreachable=WARN`` a replica that cannot be reached (no connection, no answer in time) is left aside
instead, and the operation goes on with the others; with ``best_effort`` (an add) every replica that can be used
gets the worker, whatever the others answer. A replica that stops answering after it accepted a removal routes
nothing to the worker any more and is left aside too. Each one left aside is a view whose ``error`` says why
(:attr:`MembershipResult.skipped`); the caller decides whether that fails it.
The restart chain uses :class:`GatewaySet` directly::

    gateways = GatewaySet(urls, GatewayAccess(api_key=key, timeout=10))
    gateways.remove(worker_url, min_healthy=1)   # refuse, or remove from every replica and wait until gone
    gateways.remove(worker_url, until=OUT_OF_ROTATION)  # ... and wait only until no replica routes to it
    gateways.add(worker_url)                     # add where missing and wait until every replica says healthy
    gateways.add(worker_url, best_effort=True)   # ... on every replica that can be used; result.skipped: the rest
    gateways.add(worker_url, ChangeMode(check_mode=True))  # only say what would change
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ansible_collections.llmops.inference.plugins.module_utils.gateway_client import (
    DIALECT_LEGACY,
    DRAINING,
    GATEWAY_SCHEMES,
    GatewayClient,
    GatewayError,
    Worker,
    normalize_url,
    same_worker,
)
from ansible_collections.llmops.inference.plugins.module_utils.gateway_result import (
    GatewaysUnavailable,
    GatewayView,
    MembershipIncomplete,
    MembershipResult,
    RemovalRefused,
)

# What remove() waits for: the worker gone from every listing, or only out of rotation: gone, or listed as draining
# and not healthy. smg 1.13.0 lists a removed worker as draining (is_healthy false, routed no new request) at once
# and drops it about 5 s later; a caller that waits for the engine's own in-flight requests needs only the first.
GONE = "gone"
OUT_OF_ROTATION = "out of rotation"
# What to do about a replica that cannot be reached: stop (before any change, or fail afterwards), or go on with the
# others and warn.
UNREACHABLE_FAIL = "fail"
UNREACHABLE_WARN = "warn"
UNREACHABLE_CHOICES = (UNREACHABLE_FAIL, UNREACHABLE_WARN)


@dataclass(frozen=True)
class GatewayAccess:
    """How every replica is reached (its admin ``api_key``, ``timeout``, TLS), and the key smg gives the worker."""

    api_key: str | None = None
    timeout: float = 10.0
    validate_certs: bool = True
    worker_api_key: str | None = None


@dataclass(frozen=True)
class Polling:
    """How long and how often the replicas are asked until they agree; ``clock`` and ``sleep`` for tests."""

    wait_timeout: float = 120.0
    poll_interval: float = 0.5
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class ChangeMode:
    """How an add or a removal runs: wait until the replicas agree, only plan it (check mode), and what a replica
    that cannot be reached does (UNREACHABLE_FAIL or UNREACHABLE_WARN)."""

    wait: bool = True
    check_mode: bool = False
    unreachable: str = UNREACHABLE_FAIL

    def __post_init__(self):
        if self.unreachable not in UNREACHABLE_CHOICES:
            accepted = " or ".join(map(repr, UNREACHABLE_CHOICES))
            raise ValueError(f"unreachable must be {accepted}, got {self.unreachable!r}")

    @property
    def warn(self) -> bool:
        return self.unreachable == UNREACHABLE_WARN


def _unreached(error: GatewayError) -> bool:
    return error.unreachable


class GatewaySet:
    """The replicas of one gateway: read all, decide, then change each and wait until each agrees."""

    def __init__(
        self,
        urls,
        access: GatewayAccess = GatewayAccess(),
        polling: Polling = Polling(),
        *,
        client_factory=GatewayClient,
    ):
        if isinstance(urls, str) or not urls:
            raise ValueError("gateways must be a non-empty list of gateway URLs such as http://10.0.0.9:30080")
        normalized = [normalize_url(url, "gateways", GATEWAY_SCHEMES) for url in urls]
        duplicates = sorted({url for url in normalized if normalized.count(url) > 1})
        if duplicates:
            raise ValueError(f"gateways lists {', '.join(duplicates)} more than once")
        if access.timeout <= 0 or polling.wait_timeout < 0 or polling.poll_interval <= 0:
            raise ValueError("timeout and poll_interval must be > 0 and wait_timeout >= 0")
        self.clients = [
            client_factory(url, api_key=access.api_key, timeout=access.timeout, validate_certs=access.validate_certs)
            for url in normalized
        ]
        self.access = access
        self.polling = polling

    @property
    def urls(self) -> list:
        return [client.url for client in self.clients]

    def read(self) -> tuple:
        """Read every gateway: ``({url: [Worker, ...]}, [GatewayError of each that could not be read])``."""
        listings = {}
        errors = []
        for client in self.clients:
            try:
                client.detect()
                listings[client.url] = client.workers()
            except GatewayError as exc:
                errors.append(exc)
        return listings, errors

    def check(self) -> dict:
        """Read every gateway: ``{url: [Worker, ...]}``. Raises GatewaysUnavailable naming each that failed."""
        listings, errors = self.read()
        if errors:
            raise GatewaysUnavailable(errors, len(self.clients))
        return listings

    def _views(self, worker_url: str, set_aside=None) -> list:
        """A view of every gateway; one that cannot be read is set aside when ``set_aside(error)`` says so, else
        GatewaysUnavailable (naming every one that cannot be used) stops the operation before any change."""
        listings, errors = self.read()
        refused = [error for error in errors if not (set_aside and set_aside(error))]
        if refused:
            raise GatewaysUnavailable(errors, len(self.clients))
        failed = {error.gateway: error for error in errors}
        return [
            GatewayView.aside(client, worker_url, failed[client.url])
            if client.url in failed
            else GatewayView(client, listings[client.url], worker_url)
            for client in self.clients
        ]

    def _warnings(self, views: list) -> list:
        warnings = []
        legacy = [view.url for view in views if view.client.dialect == DIALECT_LEGACY]
        if self.access.worker_api_key and legacy:
            warnings.append(
                f"worker_api_key is not sent to {', '.join(legacy)}: sglang-router before 0.2 authenticates to its "
                "workers with its own --api-key"
            )
        if self.access.worker_api_key and self.access.api_key and self.access.worker_api_key != self.access.api_key:
            warnings.append(
                "api_key and worker_api_key differ: smg forwards each client's Authorization header to the worker, "
                "so requests proxied with the gateway's key will be refused by a worker that expects another key"
            )
        return warnings

    def add(self, worker_url: str, mode: ChangeMode = ChangeMode(), *, best_effort: bool = False) -> MembershipResult:
        """Add the worker to every gateway that does not list it; with ``mode.wait``, until every one says healthy.

        A gateway that cannot be reached is set aside with ``unreachable=WARN``, and one that cannot be used for any
        reason with ``best_effort`` (the others still get the worker); otherwise it stops the add (before any change
        when the read finds it). Those set aside are the result's ``skipped``.
        """
        worker_url = normalize_url(worker_url, "worker_url")

        def tolerated(error: GatewayError) -> bool:
            return best_effort or (mode.warn and error.unreachable)

        views = self._views(worker_url, tolerated)
        result = MembershipResult(worker_url, "present", views, mode.check_mode, self._warnings(views))
        usable = [view for view in views if view.usable]
        missing = [view for view in usable if view.find() is None]
        # A removal still in progress (the worker left with until=OUT_OF_ROTATION): the gateway takes the URL
        # again once its old entry is gone.
        leaving = [view for view in usable if view.draining]
        if mode.check_mode:
            for view in missing + leaving:
                view.plan("would add", [*view.before, Worker(worker_url, status="would add")])
            return result
        deadline = self.polling.clock() + self.polling.wait_timeout
        if leaving:
            self._wait(result, deadline, self._left, "done draining", tolerated)
            missing += [view for view in leaving if view.usable]
        for view in missing:
            self._add_to(result, view, max(deadline - self.polling.clock(), view.client.timeout), tolerated)
        if mode.wait:
            self._wait(result, deadline, self._added, "healthy", tolerated)
        else:
            self._refresh(result)
        return result

    def _add_to(self, result: MembershipResult, view: GatewayView, timeout: float, tolerated) -> None:
        try:
            outcome, job_id = view.client.add(result.worker_url, self.access.worker_api_key, timeout=timeout)
        except GatewayError as exc:
            if not tolerated(exc):
                message = self._incomplete(result, f"adding {result.worker_url} failed: {exc}")
                raise MembershipIncomplete(message, result) from None
            view.error = exc
            return
        view.job_id = job_id
        view.action = {"accepted": "added", "added": "added", "in_progress": "add pending"}.get(outcome, "none")
        view.changed = outcome in ("accepted", "added")

    def remove(
        self, worker_url: str, mode: ChangeMode = ChangeMode(), *, min_healthy: int = 1, until: str = GONE
    ) -> MembershipResult:
        """Remove the worker from every gateway that lists it, unless that leaves a gateway with fewer than
        ``min_healthy`` other healthy workers of the worker's model (then nothing is removed anywhere). With
        ``mode.wait``, wait until it is ``until`` (GONE or OUT_OF_ROTATION) on every gateway.

        A gateway that cannot be reached stops the removal before any change, or with ``unreachable=WARN`` is set
        aside. One that stops answering after the removal was asked (or that did not list the worker) is set aside
        either way: it routes nothing to the worker any more.
        """
        worker_url = normalize_url(worker_url, "worker_url")
        if isinstance(min_healthy, bool) or not isinstance(min_healthy, int) or min_healthy < 0:
            raise ValueError(f"min_healthy must be an integer >= 0, got {min_healthy!r}")
        pending = {GONE: self._gone, OUT_OF_ROTATION: self._out_of_rotation}.get(until)
        if pending is None:
            raise ValueError(f"until must be {GONE!r} or {OUT_OF_ROTATION!r}, got {until!r}")
        views = self._views(worker_url, _unreached if mode.warn else None)
        result = MembershipResult(worker_url, "absent", views, mode.check_mode, self._warnings(views))
        refusals = [refusal for refusal in (self._refusal(view, min_healthy) for view in views) if refusal]
        if refusals:
            raise RemovalRefused(worker_url, refusals, min_healthy)
        listed = [view for view in views if view.usable and view.find() is not None]
        if mode.check_mode:
            for view in listed:
                view.plan("would remove", [worker for worker in view.before if not same_worker(worker.url, worker_url)])
            return result
        deadline = self.polling.clock() + self.polling.wait_timeout
        for view in listed:
            self._remove_from(result, view, mode.warn)
        if mode.wait:
            self._wait(result, deadline, pending, until, _unreached)
        else:
            self._refresh(result)
        return result

    def _remove_from(self, result: MembershipResult, view: GatewayView, warn: bool) -> None:
        worker = view.find()
        if worker.status != DRAINING:
            try:
                view.client.remove(worker)
            except GatewayError as exc:
                if not (warn and exc.unreachable):
                    message = self._incomplete(result, f"removing {result.worker_url} failed: {exc}")
                    raise MembershipIncomplete(message, result) from None
                view.error = exc
                return
            view.changed = True
        view.action = "removed" if view.changed else "removal pending"

    @staticmethod
    def _refusal(view: GatewayView, min_healthy: int):
        """Why removing the worker from this gateway is refused, or None.

        Only a serving worker counts: removing one that is unhealthy or draining takes nothing away.
        """
        mine = view.find()
        if mine is None or not mine.serving or min_healthy == 0:
            return None
        others = [
            worker.url
            for worker in view.before
            if worker.serving and worker.model == mine.model and not same_worker(worker.url, view.worker_url)
        ]
        if len(others) >= min_healthy:
            return None
        model = f"model {mine.model}" if mine.model else "its model"
        left = ", ".join(others) if others else "none"
        return (
            f"gateway {view.url}: it would leave {len(others)} healthy worker(s) of {model} (needs {min_healthy}; "
            f"healthy others: {left})"
        )

    def _added(self, view: GatewayView):
        """None once the gateway lists the worker as healthy, else what it is waiting for."""
        mine = view.find()
        if mine is not None:
            return None if mine.serving else f"listed but not healthy (status {mine.status or 'unknown'})"
        job = view.client.add_job(view.job_id)
        job_status = job.get("job_status") if isinstance(job.get("job_status"), dict) else {}
        if job_status.get("status") == "failed" and job_status.get("job_type") in (None, "AddWorker"):
            raise GatewayError(view.url, f"the add job failed: {job_status.get('message') or 'no reason given'}")
        if job:
            return f"add still {job_status.get('status') or job.get('status') or 'pending'}"
        return "not listed"

    @staticmethod
    def _gone(view: GatewayView):
        mine = view.find()
        if mine is None:
            return None
        return f"still listed (status {mine.status or 'unknown'})"

    @classmethod
    def _out_of_rotation(cls, view: GatewayView):
        return None if view.draining else cls._gone(view)

    @staticmethod
    def _left(view: GatewayView):
        """None once the worker's draining entry is gone (a view that lists no draining entry has nothing to wait
        for), else what it is waiting for."""
        return "still draining from its earlier removal" if view.draining else None

    def _refresh(self, result: MembershipResult) -> None:
        for view in result.views:
            if view.usable:
                view.after = view.client.workers()

    def _wait(self, result: MembershipResult, deadline: float, pending_reason, goal: str, tolerated=None) -> None:
        """Poll every usable gateway until ``pending_reason(view)`` is None for each, or the deadline passes. A
        gateway that fails meanwhile is set aside when ``tolerated(error)`` says so, else it stops the wait."""
        while True:
            waiting = {}
            for view in result.views:
                if not view.usable:
                    continue
                try:
                    view.after = view.client.workers()
                    reason = pending_reason(view)
                except GatewayError as exc:
                    if tolerated is None or not tolerated(exc):
                        raise MembershipIncomplete(self._incomplete(result, str(exc)), result) from None
                    view.error = exc
                    continue
                if reason:
                    waiting[view.url] = reason
            if not waiting:
                return
            if self.polling.clock() >= deadline:
                for view in result.views:
                    view.problem = waiting.get(view.url)
                details = "; ".join(f"gateway {url}: {reason}" for url, reason in waiting.items())
                waited = f"after {self.polling.wait_timeout:g} s"
                message = f"{result.worker_url} is not {goal} on every gateway {waited}: {details}"
                raise MembershipIncomplete(self._incomplete(result, message), result)
            self.polling.sleep(min(self.polling.poll_interval, max(deadline - self.polling.clock(), 0.0)))

    @staticmethod
    def _incomplete(result: MembershipResult, message: str) -> str:
        done = [view.url for view in result.views if view.changed]
        if done:
            return f"{message} (changed so far: {', '.join(done)})"
        return f"{message} (nothing was changed)"
