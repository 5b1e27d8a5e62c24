"""A scripted stand-in for an SGLang HTTP server, for unit tests of the client and the probe.

Each path answers from a route: a JSON body with a status, a stream of ``data:`` chunks (with delays),
a hang (until the server stops), or a callable deciding per request. Every request is logged.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEALTHY_TEXT = "2, 3, 5, 7 and 11 are the first five prime numbers."
# How much later than its own deadline a bounded wait may end on a busy machine (the suite runs side by side with
# other parts). Far below the 60 s hang here and the code's default timeouts (10 s and more), so a wait that ignores
# its deadline still fails the test.
SLOW_DAY_S = 3.0


def json_route(body, status: int = 200, delay: float = 0.0) -> dict:
    return {"kind": "json", "body": body, "status": status, "delay": delay}


def stream_route(chunks: list, done: bool = True, gap: float = 0.0) -> dict:
    """``chunks``: dicts sent as ``data: {json}``, ``gap`` seconds apart (the first after ``gap`` too)."""
    return {"kind": "stream", "chunks": chunks, "done": done, "gap": gap}


def hang_route() -> dict:
    return {"kind": "hang"}


def callable_route(function) -> dict:
    """``function(request) -> route``, decided per request (e.g. not ready until some time)."""
    return {"kind": "callable", "function": function}


def generation_chunks(text: str, pieces: int = 4, meta_info: dict | None = None, cumulative: bool = True) -> list:
    """Split ``text`` into streamed chunks the way SGLang sends them (cumulative text by default)."""
    step = max(1, -(-len(text) // pieces))
    cuts = [*list(range(step, len(text), step)), len(text)]
    chunks = []
    previous = 0
    for number, cut in enumerate(cuts, start=1):
        meta = {"prompt_tokens": 9, "completion_tokens": number}
        if number == len(cuts):
            meta.update(meta_info or {})
        chunks.append({"text": text[:cut] if cumulative else text[previous:cut], "meta_info": meta})
        previous = cut
    return chunks


def healthy_routes(text: str = HEALTHY_TEXT, meta_info: dict | None = None) -> dict:
    meta = {"completion_tokens": 16, "e2e_latency": 0.05, **(meta_info or {})}
    return {
        "/ready": json_route({}),
        "/health": json_route({}),
        "/model_info": json_route({"model_path": "/models/Qwen/Qwen3-8B", "served_model_name": "Qwen/Qwen3-8B"}),
        "/v1/models": json_route({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model"}]}),
        "/server_info": json_route(
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
            }
        ),
        "/generate": stream_route(generation_chunks(text, meta_info=meta)),
        "/metrics": json_route("sglang:gen_throughput 42.0\n"),
    }


class FakeSglang:
    def __init__(self, routes: dict | None = None):
        self.routes = dict(routes if routes is not None else healthy_routes())
        self.requests = []
        self.stopping = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def paths(self) -> list:
        return [request["path"] for request in self.requests]

    def start(self) -> FakeSglang:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer(None)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(json.loads(self.rfile.read(length) or b"null"))

            def _answer(self, body):
                request = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                fake.requests.append(request)
                route = fake.routes.get(self.path) or json_route({"detail": "Not Found"}, status=404)
                while route["kind"] == "callable":
                    route = route["function"](request)
                try:
                    getattr(self, "_" + route["kind"])(route)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def _json(self, route):
                if route["delay"] and fake.stopping.wait(route["delay"]):
                    return
                body = route["body"]
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(route["status"])
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, route):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in route["chunks"]:
                    if route["gap"] and fake.stopping.wait(route["gap"]):
                        return
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                if route["done"]:
                    self.wfile.write(b"data: [DONE]\n\n")

            def _hang(self, route):
                fake.stopping.wait(60)

        return Handler


class ReadyAt:
    """A route that answers ``before`` until ``at`` (monotonic time), then ``after``."""

    def __init__(self, at: float, before: dict, after: dict):
        self.at = at
        self.before = before
        self.after = after

    def __call__(self, request) -> dict:
        return self.after if time.monotonic() >= self.at else self.before
