# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The HTTP the collection's clients share: an SGLang engine's (sglang.py) and a gateway replica's (gateway_client.py).

Private to the llmops.inference collection; not a public API. Uses Ansible's ``urls.Request`` (what ``open_url``
wraps) so targets need nothing beyond Python. :class:`HttpClient` holds one base URL, the bearer token, the
timeout and the TLS verification, with one session (one TLS context) for all its requests; it sends and reads JSON
and maps every failure to one of two exceptions, which each client words for its operator:

- :class:`HttpStatusError` - the server answered with a non-2xx status (its body kept);
- :class:`HttpUnreachable` - no (complete) answer: no connection, a reset, or nothing within the timeout.

:meth:`HttpClient.exchange` treats an HTTP error as an :class:`Answer` like any other, for callers that decide by
status.
"""

from __future__ import annotations

import json
import socket
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import Request, make_context

ERROR_BODY_CHARS = 200


class HttpStatusError(Exception):
    """The server answered ``status`` (not 2xx) to ``method path``; ``body`` is what it said (bytes)."""

    def __init__(self, method: str, path: str, status: int, body: bytes):
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        super().__init__(f"{method} {path} answered HTTP {status}: {snippet(body)}")


class HttpUnreachable(Exception):
    """No (complete) answer to ``method path`` within ``timeout`` seconds, because of ``cause`` (what urllib or the
    socket raised): ``timed_out``, or ``reason`` (a URLError's own reason, else the exception).

    ``reading``: the answer had begun (status and headers came) when it failed.
    """

    def __init__(self, method: str, path: str, timeout: float, cause: BaseException, reading: bool = False):
        self.method = method
        self.path = path
        self.timeout = timeout
        self.reason = cause.reason if isinstance(cause, URLError) else cause
        self.timed_out = is_timeout(cause)
        self.reading = reading
        what = f"no answer within {timeout:g} s" if self.timed_out else str(self.reason)
        super().__init__(f"{method} {path}: {what}")


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (raised by urllib or a socket) is a timeout."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return True
    return isinstance(exc, URLError) and isinstance(exc.reason, (socket.timeout, TimeoutError))


def snippet(body) -> str:
    """``body`` (bytes or text) on one line, at most ERROR_BODY_CHARS characters."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    text = " ".join(text.split())
    return text if len(text) <= ERROR_BODY_CHARS else text[:ERROR_BODY_CHARS] + "..."


def error_text(body: bytes) -> str:
    """The message of an error body: ``{"error": {"message"}}`` or ``{"error": "..."}``, else the text."""
    try:
        answer = json.loads(body.decode("utf-8"))
    except ValueError:
        return snippet(body)
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return snippet(str(error["message"]))
    if isinstance(error, str):
        return snippet(error)
    return snippet(body)


def decode_json(body: bytes):
    """``body`` decoded as JSON; ValueError when it is not JSON (or not UTF-8)."""
    return json.loads(body.decode("utf-8"))


def set_read_timeout(response, seconds: float) -> None:
    """Shorten the socket timeout of an open response to what is left of a deadline (best effort).

    urllib has no per-read deadline; http.client reads through ``fp.raw`` (a SocketIO) whose socket is
    ``_sock``. Where that is not reachable, each read may take up to the timeout the request was opened with.
    """
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.001))


class Answer:
    """One HTTP answer: status and body (HTTP errors are answers too)."""

    def __init__(self, status: int, body: bytes):
        self.status = status
        self.body = body

    def json(self):
        """The body as JSON, or None when it is not JSON."""
        try:
            return decode_json(self.body)
        except ValueError:
            return None

    @property
    def text(self) -> str:
        return error_text(self.body)


def _error_body(exc: HTTPError) -> bytes:
    try:
        return exc.read() if exc.fp is not None else b""
    except Exception:
        return b""


class HttpClient:
    """Requests to one base URL (already validated by the caller), with JSON bodies and an optional bearer token."""

    def __init__(self, url: str, *, api_key=None, timeout: float = 10.0, validate_certs: bool = True):
        self.url = url
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs
        self._session = None

    def _ensure_session(self) -> Request:
        if self._session is None:
            # open_url() builds a TLS context (loading the CA store, about 50 ms) on every call; one session
            # with one context serves all of a client's requests.
            context = make_context(validate_certs=self.validate_certs)
            self._session = Request(validate_certs=self.validate_certs, follow_redirects="safe", context=context)
        return self._session

    def headers(self, body: bool = False) -> dict:
        headers = {"Accept": "application/json"}
        if body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def open(self, method: str, path: str, payload=None, timeout=None):
        """Send ``payload`` (JSON, when not None) to ``path``; the caller reads and closes the response.

        Raises HttpStatusError for a non-2xx answer and HttpUnreachable for no answer.
        """
        timeout = self.timeout if timeout is None else timeout
        data = json.dumps(payload).encode("utf-8") if payload is not None else None
        headers = self.headers(body=data is not None)
        try:
            return self._ensure_session().open(method, self.url + path, data=data, headers=headers, timeout=timeout)
        except HTTPError as exc:
            raise HttpStatusError(method, path, exc.code, _error_body(exc)) from None
        except Exception as exc:
            raise HttpUnreachable(method, path, timeout, exc) from None

    def read(self, response, method: str, path: str, timeout=None) -> bytes:
        """The whole body of an open response, which is closed; HttpUnreachable when it cannot be read."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return response.read()
        except Exception as exc:
            raise HttpUnreachable(method, path, timeout, exc, reading=True) from None
        finally:
            response.close()

    def exchange(self, method: str, path: str, payload=None, timeout=None) -> Answer:
        """One request and its whole answer; an HTTP error is an Answer too, no answer raises HttpUnreachable."""
        try:
            response = self.open(method, path, payload, timeout)
        except HttpStatusError as exc:
            return Answer(exc.status, exc.body)
        return Answer(response.getcode(), self.read(response, method, path, timeout))
