"""tests/e2e/loadgen.py: against the simulated engine on loopback, and servers that fail or cut streams short."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
import loadgen  # noqa: E402 - tests/e2e is not a package


class Scripted:
    """A loopback server whose /generate answers with a status, a stream cut after some chunks, or a full stream."""

    def __init__(self, mode: str, tokens: int = 4):
        self.mode = mode
        self.tokens = tokens
        self.count = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.count += 1
                if server.mode == "503":
                    body = b'{"error": "no workers"}'
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                sent = server.tokens if server.mode in ("full", "short") else server.tokens - 2
                reported = server.tokens - 1 if server.mode == "short" else sent
                for number in range(1, sent + 1):
                    meta = {"completion_tokens": min(number, reported)}
                    self.wfile.write(f"data: {json.dumps({'text': 'x' * number, 'meta_info': meta})}\n\n".encode())
                if server.mode in ("full", "short"):
                    self.wfile.write(b"data: [DONE]\n\n")

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        self.http.server_close()


def test_streams_through_the_real_simulated_engine_all_succeed(start):
    sim = start("--sim-load-time", "0.3", "--sim-warmup-time", "0.1")
    settings = loadgen.LoadSettings(sim.url, concurrency=4, requests=12, max_new_tokens=16, timeout=20)
    result = loadgen.run_load(settings)
    chat = loadgen.run_load(
        loadgen.LoadSettings(
            sim.url, concurrency=2, requests=4, max_new_tokens=8, endpoint="chat", model="org/sim-model"
        )
    )
    summary = result["summary"]
    assert (summary["requests"], summary["ok"], summary["failed"], summary["truncated"]) == (12, 12, 0, 0)
    assert summary["statuses"] == {"200": 12}
    assert summary["latency_s"]["p50"] > 0
    assert {record["completion_tokens"] for record in result["records"]} == {16}
    assert all(record["done"] and record["end"] >= record["start"] for record in result["records"])
    assert {record["client"] for record in result["records"]} == {0, 1, 2, 3}
    assert (chat["summary"]["ok"], chat["summary"]["failed"], chat["summary"]["truncated"]) == (4, 0, 0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("503", (0, 5, 0)), ("cut", (0, 0, 5)), ("short", (0, 0, 5)), ("full", (5, 0, 0))],
)
def test_failed_and_truncated_streams_are_counted(mode, expected):
    with Scripted(mode) as server:
        result = loadgen.run_load(loadgen.LoadSettings(server.url, concurrency=1, requests=5, max_new_tokens=4))
    summary = result["summary"]
    assert (summary["ok"], summary["failed"], summary["truncated"]) == expected
    if mode == "503":
        assert summary["statuses"] == {"503": 5}
        assert summary["errors"][0]["error"] == '{"error": "no workers"}'


def test_a_duration_bounds_the_run():
    with Scripted("full") as server:
        began = time.monotonic()
        result = loadgen.run_load(loadgen.LoadSettings(server.url, concurrency=3, duration=0.5, max_new_tokens=4))
        elapsed = time.monotonic() - began
    assert elapsed < 5
    assert result["summary"]["requests"] == server.count > 3
    assert result["summary"]["failed"] == 0


def test_a_stop_file_ends_the_run_before_its_duration(tmp_path):
    stop = tmp_path / "stop"
    with Scripted("full") as server:
        settings = loadgen.LoadSettings(server.url, concurrency=2, duration=60, max_new_tokens=4, stop_file=str(stop))
        threading.Timer(0.5, stop.touch).start()
        began = time.monotonic()
        result = loadgen.run_load(settings)
        elapsed = time.monotonic() - began
    assert elapsed < 10
    assert result["summary"]["requests"] == server.count > 2
    assert result["summary"]["failed"] == 0


def test_an_unreachable_target_is_a_failure_not_a_crash():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    summary = loadgen.run_load(loadgen.LoadSettings(url, concurrency=2, requests=4))["summary"]
    assert (summary["failed"], summary["statuses"]) == (4, {"no answer": 4})
    assert "ConnectionRefusedError" in summary["errors"][0]["error"]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"url": "http://192.0.2.10:30080", "requests": 1}, "outside the allowed networks"),
        ({"url": "https://127.0.0.1:1", "requests": 1}, "http://host:port"),
        ({"url": "http://127.0.0.1:1"}, "must end by itself"),
        ({"url": "http://127.0.0.1:1", "duration": 7200}, "at most 3600"),
        ({"url": "http://127.0.0.1:1", "requests": 1, "concurrency": 0}, "--concurrency"),
        ({"url": "http://127.0.0.1:1", "requests": 1, "endpoint": "x"}, "--endpoint"),
    ],
)
def test_bad_settings_are_refused_naming_them(kwargs, words):
    url = kwargs.pop("url")
    with pytest.raises(loadgen.LoadError, match=words):
        loadgen.LoadSettings(url, **kwargs)


def test_another_network_can_be_allowed_explicitly():
    settings = loadgen.LoadSettings("http://192.0.2.10:30080", requests=1, networks=("192.0.2.0/24",))
    assert (settings.host, settings.port) == ("192.0.2.10", 30080)


def test_the_command_line_writes_every_record_and_exits_non_zero_on_failures(tmp_path):
    with Scripted("cut") as server:
        out = tmp_path / "load.json"
        proc = subprocess.run(
            [sys.executable, str(REPO / "tests" / "e2e" / "loadgen.py"), "--url", server.url,
             "--concurrency", "2", "--requests", "3", "--max-new-tokens", "4", "--out", str(out)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 1
    summary = json.loads(proc.stdout)
    assert summary["truncated"] == 3
    assert len(json.loads(out.read_text())["records"]) == 3
    refused = subprocess.run(
        [sys.executable, str(REPO / "tests" / "e2e" / "loadgen.py"), "--url", "http://192.0.2.1:1", "--requests", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "outside the allowed networks" in refused.stderr
