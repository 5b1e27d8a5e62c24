# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One replica of an SGLang gateway over HTTP: which dialect it speaks, the workers it lists, an add, a removal.

Private to the llmops.inference collection; not a public API. Two HTTP dialects, detected once per gateway:

- ``smg`` - the SGLang Model Gateway (``smg``, and ``sglang-router`` from 0.2): ``GET /workers`` lists the
  workers with ``id``, ``url``, ``model_id``, ``is_healthy`` and (smg) ``status``; ``POST /workers`` queues an
  add job (202, ``worker_id``); ``GET /workers/{id}`` shows a pending add's ``job_status``; ``DELETE
  /workers/{id}`` queues the removal (the worker drains, then leaves the list).
- ``legacy`` - sglang-router before 0.2: ``GET /list_workers`` (``{"urls": [...]}``), ``POST
  /add_worker?url=`` (answers once the worker passed the router's health check, or 400 after its startup
  timeout), ``POST /remove_worker?url=``.

The transport is http_client.py's; every failure of a replica is a :class:`GatewayError` naming it. The
replicas together (read all, decide, change each, wait) are gateway.py's :class:`GatewaySet`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urlparse

from ansible_collections.llmops.inference.plugins.module_utils.http_client import (
    Answer,
    HttpClient,
    HttpUnreachable,
    snippet,
)

DIALECT_SMG = "smg"
DIALECT_LEGACY = "legacy"
WORKER_SCHEMES = ("http", "https")
GATEWAY_SCHEMES = ("http", "https")
# smg's statuses of a listed worker; only "ready" (with is_healthy) serves. sglang-router 0.2/0.3 report no
# status, only is_healthy; the older router lists a worker only once it passed its health check.
LISTED = "listed"
READY_STATUSES = (None, "ready", LISTED)
DRAINING = "draining"


class GatewayError(Exception):
    """One gateway cannot be used or did not do what was asked; ``str()`` starts with ``gateway <url>:``.

    ``unreachable``: no connection or no answer in time (as opposed to an answer that refuses or makes no sense).
    """

    def __init__(self, gateway: str, problem: str, unreachable: bool = False):
        self.gateway = gateway
        self.problem = problem
        self.unreachable = unreachable
        super().__init__(f"gateway {gateway}: {problem}")


def normalize_url(url: str, option: str = "url", schemes=WORKER_SCHEMES) -> str:
    """``url`` as the gateways are told it: lowercase scheme and host, no trailing slash.

    Raises ValueError (naming ``option``) unless it is ``scheme://host[:port]`` with one of ``schemes``.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"{option} must be a URL such as http://10.0.0.5:30000, got {url!r}")
    if any(ord(char) < 32 or char.isspace() for char in url):
        raise ValueError(f"{option} must not contain spaces or control characters, got {url!r}")
    parsed = urlparse(url)
    if parsed.scheme.lower() not in schemes or not parsed.hostname:
        accepted = " or ".join(f"{scheme}://" for scheme in schemes)
        raise ValueError(f"{option} must be an absolute {accepted} URL such as http://10.0.0.5:30000, got {url!r}")
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f"{option} has an invalid port: {url!r}") from None
    if parsed.path.strip("/") or parsed.query or parsed.fragment or parsed.username or parsed.password:
        raise ValueError(f"{option} must be scheme://host:port without a path, query or credentials, got {url!r}")
    host = parsed.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{parsed.scheme.lower()}://{host}" + (f":{port}" if port is not None else "")


def same_worker(listed: str, wanted: str) -> bool:
    """Whether a URL a gateway lists names the worker ``wanted`` (already normalized)."""
    try:
        return normalize_url(listed) == wanted
    except ValueError:
        return (listed or "").rstrip("/") == wanted


@dataclass
class Worker:
    """One worker as one gateway lists it."""

    url: str
    id: str | None = None
    model: str | None = None
    healthy: bool = True
    status: str | None = None

    @property
    def serving(self) -> bool:
        return bool(self.healthy) and self.status in READY_STATUSES

    @property
    def draining(self) -> bool:
        """Listed on its way out: the gateway routes it no new request."""
        return self.status == DRAINING and not self.healthy

    def to_dict(self) -> dict:
        return {"url": self.url, "id": self.id, "model": self.model, "healthy": self.serving, "status": self.status}

    @classmethod
    def from_smg(cls, entry: dict) -> Worker:
        models = entry.get("models") if isinstance(entry.get("models"), list) else []
        labels = entry.get("labels") if isinstance(entry.get("labels"), dict) else {}
        first_model = models[0].get("id") if models and isinstance(models[0], dict) else None
        return cls(
            url=str(entry.get("url") or ""),
            id=entry.get("id") or entry.get("url"),
            model=entry.get("model_id") or first_model or labels.get("served_model_name"),
            healthy=entry.get("is_healthy") is True,
            status=entry.get("status"),
        )


class GatewayClient(HttpClient):
    """Talks to one gateway replica; :meth:`detect` decides its dialect once."""

    def __init__(self, url: str, *, api_key=None, timeout: float = 10.0, validate_certs: bool = True):
        super().__init__(
            normalize_url(url, "gateways", GATEWAY_SCHEMES),
            api_key=api_key,
            timeout=timeout,
            validate_certs=validate_certs,
        )
        self.dialect = None
        self._detected_listing = None

    def request(self, method: str, path: str, payload=None, timeout=None) -> Answer:
        """Send one request; connection problems and timeouts raise GatewayError, HTTP errors are answers."""
        try:
            return self.exchange(method, path, payload, timeout)
        except HttpUnreachable as exc:
            if exc.timed_out:
                problem = f"no answer to {method} {path} within {exc.timeout:g} s"
            else:
                problem = f"cannot reach it ({method} {path}: {exc.reason})"
            raise GatewayError(self.url, problem, unreachable=True) from None

    def _refuse_auth(self, answer: Answer, what: str) -> None:
        if answer.status == 401:
            if self.api_key:
                raise GatewayError(self.url, f"{what} answered HTTP 401: the gateway refused api_key ({answer.text})")
            raise GatewayError(self.url, f"{what} answered HTTP 401: the gateway needs an API key (set api_key)")
        if answer.status == 403:
            raise GatewayError(
                self.url, f"{what} answered HTTP 403: api_key may not manage workers (needs the admin role)"
            )

    def _unexpected(self, answer: Answer, what: str) -> GatewayError:
        self._refuse_auth(answer, what)
        return GatewayError(self.url, f"{what} answered HTTP {answer.status}: {answer.text}")

    def detect(self) -> str:
        """``smg`` when ``GET /workers`` lists workers, ``legacy`` when only ``GET /list_workers`` does."""
        if self.dialect:
            return self.dialect
        answer = self.request("GET", "/workers")
        self._refuse_auth(answer, "GET /workers")
        if answer.status == 200:
            listing = answer.json()
            if isinstance(listing, dict) and isinstance(listing.get("workers"), list):
                self.dialect = DIALECT_SMG
                self._detected_listing = answer
                return self.dialect
            raise GatewayError(self.url, f"GET /workers did not answer a worker list: {snippet(answer.body)!r}")
        if answer.status not in (404, 405):
            raise self._unexpected(answer, "GET /workers")
        legacy = self.request("GET", "/list_workers")
        self._refuse_auth(legacy, "GET /list_workers")
        listing = legacy.json() if legacy.status == 200 else None
        if isinstance(listing, dict) and isinstance(listing.get("urls"), list):
            self.dialect = DIALECT_LEGACY
            self._detected_listing = legacy
            return self.dialect
        raise GatewayError(
            self.url,
            f"answers neither smg's GET /workers (HTTP {answer.status}) nor sglang-router's GET /list_workers "
            f"(HTTP {legacy.status}): is it an SGLang gateway?",
        )

    def _listing(self, path: str) -> Answer:
        """The listing at ``path``; the first call after detect() uses the answer detect() already read."""
        answer, self._detected_listing = self._detected_listing, None
        return answer if answer is not None else self.request("GET", path)

    def workers(self) -> list:
        """Every worker the gateway lists (smg leaves out workers whose add is still pending)."""
        if self.detect() == DIALECT_SMG:
            answer = self._listing("/workers")
            listing = answer.json() if answer.status == 200 else None
            if not isinstance(listing, dict) or not isinstance(listing.get("workers"), list):
                raise self._unexpected(answer, "GET /workers")
            return [Worker.from_smg(entry) for entry in listing["workers"] if isinstance(entry, dict)]
        answer = self._listing("/list_workers")
        listing = answer.json() if answer.status == 200 else None
        if not isinstance(listing, dict) or not isinstance(listing.get("urls"), list):
            raise self._unexpected(answer, "GET /list_workers")
        # The old router lists a worker only once it passed the health check, and serves one model.
        return [Worker(str(url), id=str(url), status=LISTED) for url in listing["urls"]]

    def add(self, worker_url: str, worker_api_key=None, timeout=None):
        """Ask the gateway to add the worker: ``(outcome, worker_id)``.

        smg answers at once (``accepted``, or ``in_progress`` for an add already queued, or ``exists``);
        the old router answers once the worker is healthy (``added``), so ``timeout`` should cover that wait.
        """
        if self.detect() == DIALECT_SMG:
            body = {"url": worker_url}
            if worker_api_key:
                body["api_key"] = worker_api_key
            answer = self.request("POST", "/workers", body)
            reply = answer.json() if isinstance(answer.json(), dict) else {}
            if answer.status in (200, 201, 202):
                return "accepted", reply.get("worker_id")
            if answer.status == 409:
                code = reply.get("code")
                if code == "WORKER_CREATE_IN_PROGRESS":
                    # "... already in progress for URL '...' with ID <id>. Poll GET /workers/<id>."
                    pending = re.search(r"with ID ([0-9A-Za-z-]+)", str(reply.get("error") or ""))
                    return "in_progress", pending.group(1) if pending else None
                if code == "WORKER_ALREADY_EXISTS":
                    return "exists", None
            raise self._unexpected(answer, "POST /workers")
        answer = self.request("POST", "/add_worker?" + urlencode({"url": worker_url}), timeout=timeout)
        if answer.status == 200:
            return "added", worker_url
        if answer.status == 400 and "already exists" in answer.text:
            return "exists", worker_url
        raise self._unexpected(answer, "POST /add_worker")

    def remove(self, worker: Worker) -> None:
        """Ask the gateway to remove a listed worker (smg drains it first, then it leaves the list)."""
        if self.detect() == DIALECT_SMG:
            answer = self.request("DELETE", "/workers/" + quote(str(worker.id), safe=""))
            if answer.status not in (200, 202, 204):
                raise self._unexpected(answer, "DELETE /workers/{id}")
            return
        answer = self.request("POST", "/remove_worker?" + urlencode({"url": worker.url}))
        if answer.status != 200:
            raise self._unexpected(answer, "POST /remove_worker")

    def add_job(self, worker_id) -> dict:
        """smg's state of a worker not (yet) listed: ``status`` and its ``job_status``; {} when unknown."""
        if self.detect() != DIALECT_SMG or not worker_id:
            return {}
        answer = self.request("GET", "/workers/" + quote(str(worker_id), safe=""))
        reply = answer.json() if answer.status == 200 else None
        return reply if isinstance(reply, dict) else {}
