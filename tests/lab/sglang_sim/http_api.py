"""The HTTP server: SGLang 0.5.23's native and OpenAI endpoints on a ThreadingHTTPServer."""

from __future__ import annotations

import json
import secrets
import select
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from . import health, info, metrics, openai_api
from .engine import ClientGone, GenerationError, Logprobs, new_request, parse_sampling
from .state import ServerState

OPEN_PATHS = ("/health", "/ready", "/metrics")
GENERATION_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: ServerState

    def version_string(self) -> str:
        return "uvicorn"

    # -- plumbing ---------------------------------------------------------------------------------------------
    def log_message(self, format: str, *args) -> None:
        return

    def log_request(self, code="-", size="-") -> None:
        status = code.value if isinstance(code, HTTPStatus) else code
        try:
            phrase = HTTPStatus(int(status)).phrase
        except ValueError:
            phrase = ""
        sys.stderr.write(
            f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {status} {phrase}\n'
        )

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _empty(self, status: int) -> None:
        self._send(status, b"", "text/plain; charset=utf-8")

    def _read_body(self) -> bytes:
        """Read the whole body first, so an early answer (401, 404, 503) leaves the connection reusable."""
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            self.close_connection = True
            return b""
        return self.rfile.read(length) if length > 0 else b""

    def _body(self):
        return json.loads(self._raw) if self._raw else {}

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, obj) -> None:
        self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    def _end_stream(self) -> None:
        self._event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """The client closed its end (Starlette's request.is_disconnected)."""
        try:
            readable, _w, _x = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _authorized(self, path: str) -> bool:
        key = self.state.ns.api_key
        if not key or self.command == "OPTIONS" or path.startswith(OPEN_PATHS):
            return True
        parts = (self.headers.get("authorization") or "").split(" ", 1)
        return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], key)

    # -- dispatch ---------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        self.server.track(+1)
        # sglang:http_requests_active (observability/http_request_metrics.py `track_http_status_code`): up before the
        # handler runs, down once the whole response, a streamed body included, has been sent; only with
        # --enable-metrics (http_server.py `lifespan` calls init_http_request_metrics then).
        label = self._endpoint_label(method) if self.state.ns.enable_metrics else None
        if label is not None:
            self.server.http_active.change(label, +1)
        try:
            self._dispatch_request(method)
        finally:
            if label is not None:
                self.server.http_active.change(label, -1)
            self.server.track(-1)

    def _endpoint_label(self, method: str) -> tuple[str, str]:
        """(endpoint, method): the matched route's path template, else the raw path (`_get_fastapi_request_path`)."""
        path = self.path.split("?", 1)[0]
        if path.startswith("/v1/models/"):
            return ("/v1/models/{model:path}", method)
        return (path, method)

    def _dispatch_request(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        self._raw = self._read_body()
        if not self._authorized(path):
            self._json(401, {"error": "Unauthorized"})
            return
        route = self._route(method, path)
        if route is None:
            allowed = any(self._route(m, path) for m in ("GET", "POST", "PUT") if m != method)
            self._json(405 if allowed else 404, {"detail": "Method Not Allowed" if allowed else "Not Found"})
            return
        if path in GENERATION_PATHS:
            self._generation(route)
        else:
            route()

    def _route(self, method: str, path: str) -> Callable[[], None] | None:
        get = {
            "/health": self.health,
            "/health_generate": self.health_generate,
            "/ready": self.ready,
            "/model_info": self.model_info,
            "/get_model_info": self.model_info,
            "/server_info": self.server_info,
            "/get_server_info": self.server_info,
            "/v1/models": self.models,
            "/flush_cache": self.flush_cache,
        }
        if self.state.ns.enable_metrics:
            get["/metrics"] = self.metrics
        post = {
            "/generate": self.generate,
            "/v1/chat/completions": self.chat,
            "/v1/completions": self.completions,
            "/flush_cache": self.flush_cache,
            "/abort_request": self.abort_request,
        }
        if method == "GET":
            if path.startswith("/v1/models/"):
                return self.model_card
            return get.get(path)
        if method == "PUT" and path == "/generate":
            return self.generate
        if method == "POST":
            return post.get(path)
        return None

    def _generation(self, route: Callable[[], None]) -> None:
        """Generation requests are admitted while the server drains, as SGLang's are (it never checks)."""
        try:
            route()
        except GenerationError as exc:
            self._json(exc.status, {"error": {"message": str(exc)}})
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._json(400, {"error": {"message": f"Invalid JSON body: {exc}"}})
        except (BrokenPipeError, ConnectionResetError, ClientGone):
            self.close_connection = True

    # -- native endpoints -------------------------------------------------------------------------------------
    def health(self) -> None:
        self._empty(health.health_generate(self.state, "/health"))

    def health_generate(self) -> None:
        self._empty(health.health_generate(self.state, "/health_generate"))

    def ready(self) -> None:
        self._empty(200 if self.state.is_healthy() else 503)

    def model_info(self) -> None:
        self._json(200, info.model_info(self.state.ns, self.state.model))

    def server_info(self) -> None:
        self.state.start_handle_loop()
        try:
            self.state.engine.wait_scheduler(self._client_gone)  # GetInternalStateReq needs a live scheduler
        except ClientGone:
            self.close_connection = True
            return
        self._json(200, self.state.server_info())

    def models(self) -> None:
        self._json(200, info.model_list(self.state.ns, self.state.model))

    def model_card(self) -> None:
        name = self.path.split("?", 1)[0][len("/v1/models/") :]
        if name != self.state.ns.served_model_name:
            self._json(
                404,
                {
                    "error": {
                        "message": f"The model '{name}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
            )
            return
        self._json(200, info.model_card(name, self.state.model))

    def flush_cache(self) -> None:
        self.state.start_handle_loop()
        try:
            self.state.engine.wait_scheduler(self._client_gone)
        except ClientGone:
            self.close_connection = True
            return
        self._send(
            200,
            b"Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            b"waiting requests, the operation will not be performed.)\n",
            "text/plain; charset=utf-8",
        )

    def abort_request(self) -> None:
        """POST /abort_request (http_server.py `abort_request`, TokenizerManager.abort_request and the scheduler's):
        {"rid": ..., "abort_all": bool}; the aborted requests end with FINISH_ABORT's finish reason; 200, no body."""
        body = self._body() if self._raw else {}
        if not isinstance(body, dict):
            self._json(400, {"error": {"message": "The request body must be a JSON object."}})
            return
        rid = body.get("rid") or ""
        abort_all = bool(body.get("abort_all"))
        if abort_all or rid:
            self.state.engine.abort(str(rid), abort_all)
        self._send(200, b"", "text/plain; charset=utf-8")

    def metrics(self) -> None:
        spec = self.state.spec
        body = metrics.render(
            self.state.engine.stats,
            gauges=self.state.engine.gauges(),
            model_name=self.state.ns.served_model_name,
            spec_steps=spec.num_steps if spec.enabled else None,
            spec_draft_tokens=spec.num_draft_tokens,
            max_total_num_tokens=self.state.max_total_num_tokens,
            used_tokens=0,
            realtime_tokens=self.state.engine.realtime_tokens(),
            http_active=self.server.http_active.samples(),
        )
        self._send(200, body.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def generate(self) -> None:
        body = self._body()
        if not isinstance(body, dict):
            raise GenerationError("The request body must be a JSON object.")
        texts = body.get("text")
        ids = body.get("input_ids")
        if texts is None and ids is None:
            raise GenerationError("Either text, input_ids or input_embeds should be provided.")
        stream = bool(body.get("stream"))
        sampling = parse_sampling(body.get("sampling_params"))
        logprobs = _logprobs(body)
        if isinstance(texts, list) or (ids and isinstance(ids[0], list)):
            if stream:
                raise GenerationError("The simulated server streams single requests only.")
            self._json(200, self._batch(texts, ids, sampling, body.get("rid"), logprobs))
            return
        if ids is not None and not _token_ids(ids):
            raise GenerationError("input_ids must be a non-empty list of token ids (whole numbers 0 or more).")
        prompt = texts if texts is not None else " ".join(str(i) for i in ids)
        prompt_tokens = None if texts is not None else len(ids)
        request = new_request(
            prompt, prompt_tokens, sampling, stream, body.get("rid"), input_ids=ids, logprobs=logprobs
        )
        if not stream:
            self._json(200, self.state.generate(request, client_gone=self._client_gone))
            return
        self.state.validate(request)
        self._start_stream()
        final = self.state.generate(request, self._event, client_gone=self._client_gone)
        self._event(final)
        self._end_stream()

    def _batch(self, texts, ids, sampling, rids, logprobs) -> list:
        prompts = texts if texts is not None else [" ".join(str(i) for i in row) for row in ids]
        results: list = [None] * len(prompts)

        def run(index: int) -> None:
            rid = rids[index] if isinstance(rids, list) and index < len(rids) else None
            tokens = None if texts is not None else len(ids[index])
            try:
                row = None if texts is not None else ids[index]
                request = new_request(prompts[index], tokens, sampling, False, rid, input_ids=row, logprobs=logprobs)
                results[index] = self.state.generate(request, client_gone=self._client_gone)
            except ClientGone as exc:
                results[index] = exc

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        gone = next((r for r in results if isinstance(r, ClientGone)), None)
        if gone is not None:
            raise gone
        return results

    # -- OpenAI endpoints -------------------------------------------------------------------------------------
    def chat(self) -> None:
        self._openai(chat=True)

    def completions(self) -> None:
        self._openai(chat=False)

    def _openai(self, chat: bool) -> None:
        body = self._body()
        if not isinstance(body, dict):
            raise GenerationError("The request body must be a JSON object.")
        if not body.get("stream"):
            name = self.state.ns.served_model_name
            answer = openai_api.complete(self.state, body, name, chat, None, self._client_gone)
            self._json(200, answer)
            return
        started = {"yes": False}

        def send(obj: dict) -> None:
            if not started["yes"]:
                self._start_stream()
                started["yes"] = True
            self._event(obj)

        openai_api.complete(self.state, body, self.state.ns.served_model_name, chat, send, self._client_gone)
        self._end_stream()


def _token_ids(ids) -> bool:
    return (
        isinstance(ids, list)
        and bool(ids)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
    )


def _logprobs(body: dict) -> Logprobs | None:
    """return_logprob, logprob_start_len (default -1) and return_text_in_logprobs (io_struct.py GenerateReqInput);
    SGLang ignores logprob_start_len without return_logprob (scheduler.py)."""
    if not body.get("return_logprob"):
        return None
    start = body.get("logprob_start_len")
    start = -1 if start is None else start
    if not isinstance(start, int) or isinstance(start, bool) or start < -1:
        raise GenerationError(f"logprob_start_len must be -1 or a whole number, got {start!r}.")
    return Logprobs(start, bool(body.get("return_text_in_logprobs")))


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._active = 0
        self._active_lock = threading.Condition()
        self.http_active = metrics.LabelledGauge()

    def track(self, change: int) -> None:
        with self._active_lock:
            self._active += change
            self._active_lock.notify_all()

    def active_requests(self) -> int:
        with self._active_lock:
            return self._active

    def wait_idle(self, poll_s: float = 0.1) -> None:
        """uvicorn's shutdown: wait (no limit) until every request being answered is done."""
        with self._active_lock:
            while self._active:
                self._active_lock.wait(poll_s)


def make_server(state: ServerState) -> SimHTTPServer:
    """Bind now (a taken port fails before any GPU memory is claimed); listen later with server_activate()."""
    handler = type("BoundHandler", (Handler,), {"state": state})
    return SimHTTPServer((state.ns.host, state.ns.port), handler, bind_and_activate=False)
