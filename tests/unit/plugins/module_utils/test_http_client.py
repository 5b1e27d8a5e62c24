"""http_client.py against a scripted local HTTP server: JSON in and out, the bearer token, HTTP errors as answers or
exceptions, timeouts and refused connections mapped to HttpUnreachable, error bodies on one line."""

from __future__ import annotations

import socket
import time
from urllib.error import URLError

import pytest
from fake_sglang_server import SLOW_DAY_S, FakeSglang, hang_route, json_route, stream_route

from ansible_collections.llmops.inference.plugins.module_utils.http_client import (
    ERROR_BODY_CHARS,
    Answer,
    HttpClient,
    HttpStatusError,
    HttpUnreachable,
    error_text,
    is_timeout,
    snippet,
)


@pytest.fixture
def server():
    fake = FakeSglang({"/thing": json_route({"answer": 42}), "/echo": json_route({"ok": True}, status=201)}).start()
    yield fake
    fake.stop()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_exchange_reads_the_status_and_the_json_body(server):
    answer = HttpClient(server.url).exchange("GET", "/thing")
    assert (answer.status, answer.json()) == (200, {"answer": 42})
    assert server.requests[0]["headers"]["Accept"] == "application/json"
    assert "Content-Type" not in server.requests[0]["headers"]


def test_a_payload_is_sent_as_json(server):
    answer = HttpClient(server.url).exchange("POST", "/echo", {"url": "http://10.0.0.5:30000"})
    assert answer.status == 201
    request = server.requests[0]
    assert request["body"] == {"url": "http://10.0.0.5:30000"}
    assert request["headers"]["Content-Type"] == "application/json"


def test_api_key_is_sent_as_bearer_header(server):
    HttpClient(server.url, api_key="s3cret").exchange("GET", "/thing")
    HttpClient(server.url).exchange("GET", "/thing")
    assert server.requests[0]["headers"]["Authorization"] == "Bearer s3cret"
    assert "Authorization" not in server.requests[1]["headers"]


def test_an_http_error_is_an_answer_to_exchange_and_an_exception_to_open(server):
    server.routes["/thing"] = json_route({"error": {"message": "worker not found"}}, status=404)
    client = HttpClient(server.url)
    answer = client.exchange("GET", "/thing")
    assert (answer.status, answer.text) == (404, "worker not found")
    with pytest.raises(HttpStatusError) as caught:
        client.open("GET", "/thing")
    assert (caught.value.method, caught.value.path, caught.value.status) == ("GET", "/thing", 404)
    assert str(caught.value) == 'GET /thing answered HTTP 404: {"error": {"message": "worker not found"}}'


def test_no_answer_within_the_timeout_is_unreachable_and_timed_out(server):
    server.routes["/thing"] = hang_route()
    started = time.monotonic()
    with pytest.raises(HttpUnreachable) as caught:
        HttpClient(server.url, timeout=0.2).exchange("GET", "/thing")
    assert time.monotonic() - started < 0.2 + SLOW_DAY_S
    error = caught.value
    assert (error.timed_out, error.reading, error.timeout) == (True, False, 0.2)
    assert str(error) == "GET /thing: no answer within 0.2 s"


def test_a_body_that_stops_coming_is_unreachable_while_reading(server):
    server.routes["/thing"] = stream_route([{"text": "late"}], gap=2)
    client = HttpClient(server.url, timeout=0.3)
    response = client.open("GET", "/thing")
    with pytest.raises(HttpUnreachable) as caught:
        client.read(response, "GET", "/thing")
    assert (caught.value.timed_out, caught.value.reading) == (True, True)


def test_a_refused_connection_is_unreachable_with_its_reason():
    with pytest.raises(HttpUnreachable) as caught:
        HttpClient(closed_port_url()).exchange("GET", "/thing")
    assert caught.value.timed_out is False
    assert "refused" in str(caught.value.reason).lower()


def test_the_session_and_its_tls_context_are_built_once(server):
    client = HttpClient(server.url)
    client.exchange("GET", "/thing")
    session = client._ensure_session()
    client.exchange("GET", "/thing")
    assert client._ensure_session() is session


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'{"error": {"message": "bad  key"}}', "bad key"),
        (b'{"error": "already exists"}', "already exists"),
        (b'{"detail": "Not Found"}', '{"detail": "Not Found"}'),
        (b"<html>\n proxy error\n</html>", "<html> proxy error </html>"),
    ],
)
def test_error_text_takes_the_message_of_an_error_body(body, text):
    assert error_text(body) == text


def test_snippet_keeps_one_line_of_at_most_the_limit():
    long = snippet("x" * (ERROR_BODY_CHARS + 50))
    assert long == "x" * ERROR_BODY_CHARS + "..."
    assert snippet(b"a\nb\tc") == "a b c"


def test_an_answer_that_is_not_json_decodes_to_none():
    assert Answer(200, b"<html>").json() is None
    assert Answer(200, b"\xff\xfe").json() is None


def test_is_timeout_knows_the_socket_and_urllib_forms():
    assert is_timeout(socket.timeout("timed out"))
    assert is_timeout(TimeoutError())
    assert is_timeout(URLError(socket.timeout("timed out")))
    assert not is_timeout(URLError(ConnectionRefusedError()))
