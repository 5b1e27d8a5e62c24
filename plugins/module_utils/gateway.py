# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Membership of one worker (an SGLang engine's URL) across the replicas of an SGLang gateway.

Private to the llmops.inference collection; not a public API. Two HTTP dialects, detected once per gateway:

- ``smg`` - the SGLang Model Gateway (``smg``, and ``sglang-router`` from 0.2): ``GET /workers`` lists the
  workers with ``id``, ``url``, ``model_id``, ``is_healthy`` and (smg) ``status``; ``POST /workers`` queues an
  add job (202, ``worker_id``); ``GET /workers/{id}`` shows a pending add's ``job_status``; ``DELETE
  /workers/{id}`` queues the removal (the worker drains, then leaves the list).
- ``legacy`` - sglang-router before 0.2: ``GET /list_workers`` (``{"urls": [...]}``), ``POST
  /add_worker?url=`` (answers once the worker passed the router's health check, or 400 after its startup
  timeout), ``POST /remove_worker?url=``.

Replicas do not share a registry, so every change is made on each of them. Every gateway is read first; a
gateway that cannot be used, a refused removal or bad input stops the operation before any gateway changes.
With ``unreachable=WARN`` a replica that cannot be reached (no connection, no answer in time) is left aside
instead, and the operation goes on with the others; with ``best_effort`` (an add) every replica that can be used
gets the worker, whatever the others answer. A replica that stops answering after it accepted a removal routes
nothing to the worker any more and is left aside too. Each one left aside is a view whose ``error`` says why
(:attr:`MembershipResult.skipped`); the caller decides whether that fails it.
The restart chain uses :class:`GatewaySet` directly::

    gateways = GatewaySet(urls, api_key=key, timeout=10)
    gateways.remove(worker_url, min_healthy=1)   # refuse, or remove from every replica and wait until gone
    gateways.remove(worker_url, until=OUT_OF_ROTATION)  # ... and wait only until no replica routes to it
    gateways.add(worker_url)                     # add where missing and wait until every replica says healthy
    gateways.add(worker_url, best_effort=True)   # ... on every replica that can be used; result.skipped: the rest
"""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode, urlparse

from ansible.module_utils.urls import Request, make_context

DIALECT_SMG = "smg"
DIALECT_LEGACY = "legacy"
WORKER_SCHEMES = ("http", "https")
GATEWAY_SCHEMES = ("http", "https")
ERROR_BODY_CHARS = 200
# smg's statuses of a listed worker; only "ready" (with is_healthy) serves. sglang-router 0.2/0.3 report no
# status, only is_healthy; the older router lists a worker only once it passed its health check.
LISTED = "listed"
READY_STATUSES = (None, "ready", LISTED)
DRAINING = "draining"
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


class GatewayError(Exception):
    """One gateway cannot be used or did not do what was asked; ``str()`` starts with ``gateway <url>:``.

    ``unreachable``: no connection or no answer in time (as opposed to an answer that refuses or makes no sense).
    """

    def __init__(self, gateway: str, problem: str, unreachable: bool = False):
        self.gateway = gateway
        self.problem = problem
        self.unreachable = unreachable
        super().__init__(f"gateway {gateway}: {problem}")


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


class Worker:
    """One worker as one gateway lists it."""

    def __init__(self, url: str, worker_id=None, model=None, healthy: bool = True, status=None):
        self.url = url
        self.id = worker_id
        self.model = model
        self.healthy = healthy
        self.status = status

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
            worker_id=entry.get("id") or entry.get("url"),
            model=entry.get("model_id") or first_model or labels.get("served_model_name"),
            healthy=entry.get("is_healthy") is True,
            status=entry.get("status"),
        )


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return True
    return isinstance(exc, URLError) and isinstance(exc.reason, (socket.timeout, TimeoutError))


def _snippet(body) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    text = " ".join(text.split())
    return text if len(text) <= ERROR_BODY_CHARS else text[:ERROR_BODY_CHARS] + "..."


def _error_text(body: bytes) -> str:
    """The message of an error body: smg's ``{"error": {"message"}}`` or ``{"error": "..."}``, else the text."""
    try:
        answer = json.loads(body.decode("utf-8"))
    except ValueError:
        return _snippet(body)
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return _snippet(str(error["message"]))
    if isinstance(error, str):
        return _snippet(error)
    return _snippet(body)


class Answer:
    """One HTTP answer: status and body (HTTP errors are answers too)."""

    def __init__(self, status: int, body: bytes):
        self.status = status
        self.body = body

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except ValueError:
            return None

    @property
    def text(self) -> str:
        return _error_text(self.body)


class GatewayClient:
    """Talks to one gateway replica; :meth:`detect` decides its dialect once."""

    def __init__(self, url: str, *, api_key=None, timeout: float = 10.0, validate_certs: bool = True):
        self.url = normalize_url(url, "gateways", GATEWAY_SCHEMES)
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs
        self.dialect = None
        self._session = None
        self._detected_listing = None

    def _open(self, method: str, url: str, data, headers: dict, timeout: float):
        if self._session is None:
            context = make_context(validate_certs=self.validate_certs)
            self._session = Request(validate_certs=self.validate_certs, follow_redirects="safe", context=context)
        return self._session.open(method, url, data=data, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, payload=None, timeout=None) -> Answer:
        """Send one request; connection problems and timeouts raise GatewayError, HTTP errors are answers."""
        timeout = self.timeout if timeout is None else timeout
        headers = {"Accept": "application/json"}
        data = None
        if payload is not None:
            data = json.dumps(payload).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            response = self._open(method, self.url + path, data, headers, timeout)
            try:
                return Answer(response.getcode(), response.read())
            finally:
                response.close()
        except HTTPError as exc:
            try:
                body = exc.read() if exc.fp is not None else b""
            except Exception:
                body = b""
            return Answer(exc.code, body)
        except Exception as exc:
            if _is_timeout(exc):
                raise GatewayError(
                    self.url, f"no answer to {method} {path} within {timeout:g} s", unreachable=True
                ) from None
            reason = exc.reason if isinstance(exc, URLError) else exc
            raise GatewayError(self.url, f"cannot reach it ({method} {path}: {reason})", unreachable=True) from None

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
            raise GatewayError(self.url, f"GET /workers did not answer a worker list: {_snippet(answer.body)!r}")
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
        return [Worker(str(url), worker_id=str(url), status=LISTED) for url in listing["urls"]]

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


class GatewaySet:
    """The replicas of one gateway: read all, decide, then change each and wait until each agrees."""

    def __init__(
        self,
        urls,
        api_key=None,
        timeout: float = 10.0,
        *,
        validate_certs: bool = True,
        worker_api_key=None,
        wait_timeout: float = 120.0,
        poll_interval: float = 0.5,
        client_factory=GatewayClient,
        clock=time.monotonic,
        sleep=time.sleep,
    ):
        if isinstance(urls, str) or not urls:
            raise ValueError("gateways must be a non-empty list of gateway URLs such as http://10.0.0.9:30080")
        normalized = [normalize_url(url, "gateways", GATEWAY_SCHEMES) for url in urls]
        duplicates = sorted({url for url in normalized if normalized.count(url) > 1})
        if duplicates:
            raise ValueError(f"gateways lists {', '.join(duplicates)} more than once")
        if timeout <= 0 or wait_timeout < 0 or poll_interval <= 0:
            raise ValueError("timeout and poll_interval must be > 0 and wait_timeout >= 0")
        self.clients = [
            client_factory(url, api_key=api_key, timeout=timeout, validate_certs=validate_certs) for url in normalized
        ]
        self.api_key = api_key
        self.worker_api_key = worker_api_key
        self.wait_timeout = wait_timeout
        self.poll_interval = poll_interval
        self._clock = clock
        self._sleep = sleep

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

    @staticmethod
    def _check_unreachable(unreachable: str) -> None:
        if unreachable not in UNREACHABLE_CHOICES:
            raise ValueError(f"unreachable must be {' or '.join(map(repr, UNREACHABLE_CHOICES))}, got {unreachable!r}")

    def _warnings(self, views: list) -> list:
        warnings = []
        legacy = [view.url for view in views if view.client.dialect == DIALECT_LEGACY]
        if self.worker_api_key and legacy:
            warnings.append(
                f"worker_api_key is not sent to {', '.join(legacy)}: sglang-router before 0.2 authenticates to its "
                "workers with its own --api-key"
            )
        if self.worker_api_key and self.api_key and self.worker_api_key != self.api_key:
            warnings.append(
                "api_key and worker_api_key differ: smg forwards each client's Authorization header to the worker, "
                "so requests proxied with the gateway's key will be refused by a worker that expects another key"
            )
        return warnings

    def add(
        self,
        worker_url: str,
        *,
        wait: bool = True,
        check_mode: bool = False,
        unreachable: str = UNREACHABLE_FAIL,
        best_effort: bool = False,
    ) -> MembershipResult:
        """Add the worker to every gateway that does not list it; with ``wait``, until every one says healthy.

        A gateway that cannot be reached is set aside with ``unreachable=WARN``, and one that cannot be used for any
        reason with ``best_effort`` (the others still get the worker); otherwise it stops the add (before any change
        when the read finds it). Those set aside are the result's ``skipped``.
        """
        worker_url = normalize_url(worker_url, "worker_url")
        self._check_unreachable(unreachable)

        def tolerated(error: GatewayError) -> bool:
            return best_effort or (unreachable == UNREACHABLE_WARN and error.unreachable)

        views = self._views(worker_url, tolerated)
        result = MembershipResult(worker_url, "present", views, check_mode, self._warnings(views))
        usable = [view for view in views if view.usable]
        missing = [view for view in usable if view.find() is None]
        # A removal still in progress (the worker left with until=OUT_OF_ROTATION): the gateway takes the URL
        # again once its old entry is gone.
        leaving = [view for view in usable if view.draining]
        if check_mode:
            for view in missing + leaving:
                view.action = "would add"
                view.changed = True
                view.after = [*view.before, Worker(worker_url, status="would add")]
            return result
        deadline = self._clock() + self.wait_timeout
        if leaving:
            self._wait(result, deadline, self._left, "done draining", tolerated)
            missing += [view for view in leaving if view.usable]
        for view in missing:
            remaining = max(deadline - self._clock(), view.client.timeout)
            try:
                outcome, job_id = view.client.add(worker_url, self.worker_api_key, timeout=remaining)
            except GatewayError as exc:
                if not tolerated(exc):
                    message = self._incomplete(result, f"adding {worker_url} failed: {exc}")
                    raise MembershipIncomplete(message, result) from None
                view.error = exc
                continue
            view.job_id = job_id
            view.action = {"accepted": "added", "added": "added", "in_progress": "add pending"}.get(outcome, "none")
            view.changed = outcome in ("accepted", "added")
        if wait:
            self._wait(result, deadline, self._added, "healthy", tolerated)
        else:
            self._refresh(result)
        return result

    def remove(
        self,
        worker_url: str,
        *,
        min_healthy: int = 1,
        wait: bool = True,
        check_mode: bool = False,
        until: str = GONE,
        unreachable: str = UNREACHABLE_FAIL,
    ) -> MembershipResult:
        """Remove the worker from every gateway that lists it, unless that leaves a gateway with fewer than
        ``min_healthy`` other healthy workers of the worker's model (then nothing is removed anywhere). With
        ``wait``, wait until it is ``until`` (GONE or OUT_OF_ROTATION) on every gateway.

        A gateway that cannot be reached stops the removal before any change, or with ``unreachable=WARN`` is set
        aside. One that stops answering after the removal was asked (or that did not list the worker) is set aside
        either way: it routes nothing to the worker any more.
        """
        worker_url = normalize_url(worker_url, "worker_url")
        if isinstance(min_healthy, bool) or not isinstance(min_healthy, int) or min_healthy < 0:
            raise ValueError(f"min_healthy must be an integer >= 0, got {min_healthy!r}")
        if until not in (GONE, OUT_OF_ROTATION):
            raise ValueError(f"until must be {GONE!r} or {OUT_OF_ROTATION!r}, got {until!r}")
        self._check_unreachable(unreachable)
        warn = unreachable == UNREACHABLE_WARN

        def unreached(error: GatewayError) -> bool:
            return error.unreachable

        views = self._views(worker_url, unreached if warn else None)
        result = MembershipResult(worker_url, "absent", views, check_mode, self._warnings(views))
        refusals = [refusal for refusal in (self._refusal(view, min_healthy) for view in views) if refusal]
        if refusals:
            raise RemovalRefused(worker_url, refusals, min_healthy)
        listed = [view for view in views if view.usable and view.find() is not None]
        if check_mode:
            for view in listed:
                view.action = "would remove"
                view.changed = True
                view.after = [worker for worker in view.before if not same_worker(worker.url, worker_url)]
            return result
        deadline = self._clock() + self.wait_timeout
        for view in listed:
            worker = view.find()
            if worker.status != DRAINING:
                try:
                    view.client.remove(worker)
                except GatewayError as exc:
                    if not (warn and exc.unreachable):
                        message = self._incomplete(result, f"removing {worker_url} failed: {exc}")
                        raise MembershipIncomplete(message, result) from None
                    view.error = exc
                    continue
                view.changed = True
            view.action = "removed" if view.changed else "removal pending"
        if wait:
            pending = self._gone if until == GONE else self._out_of_rotation
            self._wait(result, deadline, pending, until, unreached)
        else:
            self._refresh(result)
        return result

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
            if self._clock() >= deadline:
                for view in result.views:
                    view.problem = waiting.get(view.url)
                details = "; ".join(f"gateway {url}: {reason}" for url, reason in waiting.items())
                message = f"{result.worker_url} is not {goal} on every gateway after {self.wait_timeout:g} s: {details}"
                raise MembershipIncomplete(self._incomplete(result, message), result)
            self._sleep(min(self.poll_interval, max(deadline - self._clock(), 0.0)))

    @staticmethod
    def _incomplete(result: MembershipResult, message: str) -> str:
        done = [view.url for view in result.views if view.changed]
        if done:
            return f"{message} (changed so far: {', '.join(done)})"
        return f"{message} (nothing was changed)"
