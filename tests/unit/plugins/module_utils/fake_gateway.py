"""A stand-in for an SGLang gateway replica over real HTTP, in either dialect, for unit tests of gateway.py.

``FakeGateway("smg")`` answers like smg 1.13.0 (as observed on the real binary): ``GET /workers`` lists
registered workers with ``id``, ``url``, ``model_id``, ``is_healthy`` and ``status``; ``POST /workers``
answers 202 with a ``worker_id`` and registers the worker after ``add_delay`` seconds (until then it is not
listed and ``GET /workers/{id}`` shows ``status: pending`` with a ``job_status``); a second POST of the same
URL answers 409 ``WORKER_ALREADY_EXISTS`` or ``WORKER_CREATE_IN_PROGRESS``; ``DELETE /workers/{id}`` answers
202, lists the worker as ``draining`` with ``is_healthy: false`` for ``drain_time`` seconds (the real binary: about
5 s), then drops it; a worker URL in ``keeps_routing`` stays listed as it was (a removal that does not take). With
``api_key`` every
control-plane call needs ``Authorization: Bearer <key>`` (401 otherwise).

``FakeGateway("legacy")`` answers like sglang-router 0.1.9: ``GET /list_workers`` -> ``{"urls": [...]}``,
``POST /add_worker?url=`` -> 200 once "healthy" (400 ``Worker ... already exists`` for a listed one, 400
``Timeout ...`` for a worker in ``unhealthy``), ``POST /remove_worker?url=`` -> 200 (also for unknown URLs);
``GET /workers`` -> 404.

``FakeGateway("other")`` answers 404 to everything (a server that is not a gateway).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse


class FakeGateway:
    def __init__(
        self,
        dialect: str = "smg",
        *,
        api_key: str | None = None,
        add_delay: float = 0.0,
        drain_time: float = 0.0,
        model: str = "org/model",
    ):
        self.dialect = dialect
        self.api_key = api_key
        self.add_delay = add_delay
        self.drain_time = drain_time
        self.model = model
        self.models = {}  # worker URL -> model id it serves (default: self.model)
        self.unhealthy = set()  # worker URLs whose health check fails
        self.failing_adds = {}  # worker URL -> message of a failed add job
        self.keeps_routing = set()  # worker URLs whose removal is accepted but never happens
        self.clock = time.monotonic  # what add_delay and drain_time are measured on (a test may give its own)
        self.requests = []
        self.lock = threading.Lock()
        self.workers = {}  # id -> entry
        self.pending = {}  # id -> (url, ready_at, api_key)
        self.draining = {}  # id -> gone_at
        self.jobs = {}  # id -> job_status of the last job
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeGateway:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- state ----------------------------------------------------------------------------------------------------
    def register(self, worker_url: str, healthy: bool = True, status: str = "ready", model: str | None = None) -> str:
        """Put a worker in the registry directly (as if added earlier)."""
        worker_id = str(uuid.uuid4())
        with self.lock:
            self.workers[worker_id] = {
                "id": worker_id,
                "url": worker_url,
                "model_id": model or self.models.get(worker_url, self.model),
                "worker_type": "regular",
                "is_healthy": healthy,
                "status": status,
            }
        return worker_id

    def listed(self) -> list:
        with self.lock:
            self._advance()
            if self.dialect == "legacy":
                return [entry["url"] for entry in self.workers.values()]
            return sorted(entry["url"] for entry in self.workers.values())

    def mutations(self) -> list:
        """The requests that could change the registry."""
        return [(r[0], r[1]) for r in self.requests if r[0] in ("POST", "DELETE", "PUT", "PATCH")]

    def _advance(self) -> None:
        now = self.clock()
        for worker_id, (url, ready_at, _key) in list(self.pending.items()):
            if url in self.failing_adds:
                self.jobs[worker_id] = {
                    "job_type": "AddWorker",
                    "worker_url": url,
                    "status": "failed",
                    "message": self.failing_adds[url],
                }
                continue
            if now >= ready_at:
                del self.pending[worker_id]
                self.workers[worker_id] = {
                    "id": worker_id,
                    "url": url,
                    "model_id": self.models.get(url, self.model),
                    "worker_type": "regular",
                    "is_healthy": url not in self.unhealthy,
                    "status": "ready" if url not in self.unhealthy else "not_ready",
                }
        for worker_id, gone_at in list(self.draining.items()):
            if now >= gone_at:
                del self.draining[worker_id]
                self.workers.pop(worker_id, None)

    # -- HTTP -----------------------------------------------------------------------------------------------------
    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                return json.loads(raw) if raw else None

            def _send(self, status: int, body, content_type: str = "application/json"):
                data = body if isinstance(body, bytes) else (json.dumps(body) if not isinstance(body, str) else body)
                data = data.encode() if isinstance(data, str) else data
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                body = self._body()
                fake.requests.append((self.command, self.path, body, self.headers.get("Authorization")))
                parsed = urlparse(self.path)
                with fake.lock:
                    fake._advance()
                    if fake.dialect == "smg":
                        status, answer = fake._smg(self.command, parsed.path, body, self.headers)
                    elif fake.dialect == "other":
                        status, answer = 404, {"detail": "Not Found"}
                    else:
                        status, answer = fake._legacy(self.command, parsed.path, parse_qs(parsed.query))
                self._send(status, answer, "text/plain" if isinstance(answer, str) else "application/json")

            do_GET = do_POST = do_DELETE = _handle

        return Handler

    def _authorized(self, headers) -> tuple:
        if not self.api_key:
            return None
        auth = headers.get("Authorization")
        if not auth:
            return 401, {"error": {"message": "Missing API key", "code": "invalid_api_key"}}
        if auth != f"Bearer {self.api_key}":
            return 401, {"error": {"message": "Invalid API key", "code": "invalid_api_key"}}
        return None

    def _smg(self, method: str, path: str, body, headers) -> tuple:
        if path in ("/health", "/liveness"):
            return 200, "OK"
        refused = self._authorized(headers)
        if refused:
            return refused
        if path == "/workers" and method == "GET":
            workers = list(self.workers.values())
            return 200, {"workers": workers, "total": len(workers), "stats": {"regular_count": len(workers)}}
        if path == "/workers" and method == "POST":
            url = (body or {}).get("url", "")
            if not url.startswith(("http://", "https://", "grpc://")):
                return 400, {"error": f"Invalid value for field 'worker_url': {url}", "code": "BAD_REQUEST"}
            for worker_id, entry in self.workers.items():
                if entry["url"] == url:
                    return 409, {"error": f"Worker already exists at URL '{url}' with ID {worker_id}.",
                                 "code": "WORKER_ALREADY_EXISTS"}  # fmt: skip
            for worker_id, (pending_url, _ready, _key) in self.pending.items():
                if pending_url == url:
                    return 409, {"error": f"Worker creation already in progress for URL '{url}' with ID "
                                 f"{worker_id}. Poll GET /workers/{worker_id}.",
                                 "code": "WORKER_CREATE_IN_PROGRESS"}  # fmt: skip
            worker_id = str(uuid.uuid4())
            self.pending[worker_id] = (url, self.clock() + self.add_delay, (body or {}).get("api_key"))
            self.jobs[worker_id] = {"job_type": "AddWorker", "worker_url": url, "status": "processing",
                                    "message": None}  # fmt: skip
            self._advance()
            return 202, {"status": "accepted", "worker_id": worker_id, "url": url,
                         "location": f"/workers/{worker_id}"}  # fmt: skip
        if path.startswith("/workers/"):
            worker_id = unquote(path[len("/workers/") :])
            try:
                uuid.UUID(worker_id)
            except ValueError:
                return 400, {"error": f"Invalid worker_id '{worker_id}' (expected UUID).", "code": "BAD_REQUEST"}
            if method == "GET":
                if worker_id in self.workers:
                    return 200, self.workers[worker_id]
                if worker_id in self.pending:
                    url = self.pending[worker_id][0]
                    return 200, {"id": worker_id, "url": url, "is_healthy": False, "status": "pending",
                                 "job_status": self.jobs.get(worker_id)}  # fmt: skip
                return 404, {"error": f"Worker {worker_id} not found", "code": "WORKER_NOT_FOUND"}
            if method == "DELETE":
                if worker_id not in self.workers:
                    return 404, {"error": f"Worker {worker_id} not found", "code": "WORKER_NOT_FOUND"}
                if self.workers[worker_id]["url"] in self.keeps_routing:
                    return 202, {"status": "accepted", "worker_id": worker_id}
                self.workers[worker_id]["status"] = "draining"
                self.workers[worker_id]["is_healthy"] = False
                self.draining[worker_id] = self.clock() + self.drain_time
                self._advance()
                return 202, {"status": "accepted", "worker_id": worker_id}
        return 404, {"error": {"type": "invalid_request_error", "code": "unknown_url",
                               "message": f"Invalid URL ({method} {path})"}}  # fmt: skip

    def _legacy(self, method: str, path: str, query: dict) -> tuple:
        if path == "/health":
            return 200, "All servers healthy"
        if path == "/list_workers" and method == "GET":
            return 200, {"urls": [entry["url"] for entry in self.workers.values()]}
        if path == "/add_worker" and method == "POST":
            url = (query.get("url") or [""])[0]
            if not url:
                return 400, "Worker URL required. Provide 'url' query parameter"
            if any(entry["url"] == url for entry in self.workers.values()):
                return 400, f"Worker {url} already exists"
            if url in self.unhealthy:
                return 400, f"Timeout 5s waiting for worker {url} to become healthy."
            self.workers[url] = {"id": url, "url": url}
            return 200, f"Successfully added worker: {url}"
        if path == "/remove_worker" and method == "POST":
            url = (query.get("url") or [""])[0]
            self.workers = {key: entry for key, entry in self.workers.items() if entry["url"] != url}
            return 200, f"Successfully removed worker: {url}"
        return 404, ""


@contextlib.contextmanager
def started_gateways():
    """``make(dialect="smg", **kwargs)`` starts a FakeGateway; every one started stops when the block ends."""
    started = []

    def make(dialect="smg", **kwargs):
        fake = FakeGateway(dialect, **kwargs).start()
        started.append(fake)
        return fake

    try:
        yield make
    finally:
        for fake in started:
            fake.stop()


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"
