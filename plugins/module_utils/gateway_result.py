# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What an add or a removal of one worker found and did on each gateway replica, as gateway.py's GatewaySet reports
it, and the ways it stops: a gateway that cannot be used, a refused removal, a change that did not finish.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.gateway_client import (
    GatewayClient,
    GatewayError,
    same_worker,
)


class GatewaysUnavailable(Exception):
    """Reading the gateways failed on at least one of them; nothing was changed anywhere."""

    def __init__(self, errors: list, total: int):
        self.errors = errors
        problems = "; ".join(str(error) for error in errors)
        super().__init__(f"{len(errors)} of {total} gateway(s) cannot be used, nothing was changed: {problems}")


class RemovalRefused(Exception):
    """Removing the worker would leave a gateway with fewer healthy workers of its model than asked."""

    def __init__(self, worker_url: str, refusals: list, min_healthy: int):
        self.worker_url = worker_url
        self.refusals = refusals
        self.min_healthy = min_healthy
        super().__init__(
            f"refusing to remove {worker_url} from any gateway (min_healthy={min_healthy}): " + "; ".join(refusals)
        )


class MembershipIncomplete(Exception):
    """An add or removal started but did not finish on every gateway; ``result`` says what did change."""

    def __init__(self, message: str, result: MembershipResult):
        self.result = result
        super().__init__(message)


class GatewayView:
    """What one gateway reported, and what this operation did there."""

    def __init__(self, client: GatewayClient, workers: list, worker_url: str):
        self.client = client
        self.worker_url = worker_url
        self.before = workers
        self.after = workers
        self.action = "none"
        self.changed = False
        self.job_id = None
        self.problem = None
        # The GatewayError that left this gateway aside (read: before any change; else after), or None.
        self.error = None

    @classmethod
    def aside(cls, client: GatewayClient, worker_url: str, error: GatewayError) -> GatewayView:
        """A gateway left aside at the read: nothing is known of its workers."""
        view = cls(client, None, worker_url)
        view.error = error
        view.action = "unreachable" if error.unreachable else "cannot be used"
        return view

    @property
    def url(self) -> str:
        return self.client.url

    def plan(self, action: str, after: list) -> None:
        """Check mode: what this gateway's listing would be after ``action``."""
        self.action = action
        self.changed = True
        self.after = after

    @property
    def usable(self) -> bool:
        return self.error is None

    def find(self, workers=None):
        for worker in (self.after if workers is None else workers) or []:
            if same_worker(worker.url, self.worker_url):
                return worker
        return None

    @property
    def draining(self) -> bool:
        """The gateway lists the worker as draining (removed, routed nothing, not yet dropped)."""
        mine = self.find()
        return mine is not None and mine.draining

    def to_dict(self) -> dict:
        mine = self.find()
        return {
            "url": self.url,
            "api": self.client.dialect,
            "action": self.action,
            "changed": self.changed,
            "present": mine is not None,
            "healthy": mine.serving if mine else None,
            "status": mine.status if mine else None,
            "model": mine.model if mine else None,
            "worker_id": mine.id if mine else self.job_id,
            "waiting_for": self.problem,
            "problem": str(self.error) if self.error else None,
            "workers": [worker.to_dict() for worker in self.after or []],
        }


@dataclass
class MembershipResult:
    """The outcome on every gateway; ``diff`` maps each gateway to its worker URLs before and after."""

    worker_url: str
    state: str
    views: list
    check_mode: bool
    warnings: list

    @property
    def changed(self) -> bool:
        return any(view.changed for view in self.views)

    @property
    def skipped(self) -> list:
        """The views of the gateways left aside (each with its ``error``)."""
        return [view for view in self.views if view.error is not None]

    @property
    def diff(self) -> dict:
        known = [view for view in self.views if view.before is not None]
        return {
            "before": {view.url: sorted(worker.url for worker in view.before) for view in known},
            "after": {view.url: sorted(worker.url for worker in view.after or []) for view in known},
        }

    def to_dict(self) -> dict:
        return {
            "changed": self.changed,
            "worker_url": self.worker_url,
            "state": self.state,
            "gateways": [view.to_dict() for view in self.views],
        }
