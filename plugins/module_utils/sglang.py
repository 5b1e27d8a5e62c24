# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""HTTP client for an SGLang server's native API: readiness, health, model/server info, models, generate, metrics.

Private to the llmops.inference collection; not a public API. Uses Ansible's ``urls.Request`` (what
``open_url`` wraps) so targets need nothing beyond Python. Every failure is raised as :class:`SglangError`
with a one-line message an operator can act on (which endpoint, what happened).
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from urllib.error import HTTPError, URLError
from urllib.parse import urlparse

from ansible.module_utils.urls import Request, make_context

DEFAULT_URL = "http://127.0.0.1:30000"
READY_PATH = "/ready"
HEALTH_PATH = "/health"
STREAM_DONE = "[DONE]"
ERROR_BODY_CHARS = 200
# One sample of the Prometheus text exposition: name, optional {labels}, value (a timestamp may follow).
METRIC_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')
METRIC_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
LABEL_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def server_argument_spec() -> dict:
    """Argument spec of the options that reach the server: ``url``, ``api_key``, ``validate_certs``.

    A module documents them with the ``llmops.inference.sglang_server`` doc fragment.
    """
    return {
        "url": {"type": "str", "default": DEFAULT_URL},
        "api_key": {"type": "str", "no_log": True},
        "validate_certs": {"type": "bool", "default": True},
    }


class SglangError(Exception):
    """Any failure talking to the server; ``str()`` is a one-line reason."""


class SglangHTTPError(SglangError):
    """The server answered with a non-2xx status."""

    def __init__(self, path: str, status: int, body: str = ""):
        self.path = path
        self.status = status
        self.body = body
        detail = f": {body}" if body else ""
        super().__init__(f"{path} returned HTTP {status}{detail}")


class SglangTimeout(SglangError):
    """No (complete) answer within the deadline."""


def validate_url(url: str) -> str:
    """Return ``url`` without a trailing slash; raise ValueError unless it is an absolute http(s) URL."""
    parsed = urlparse(url or "")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"url must be an absolute http:// or https:// URL such as {DEFAULT_URL}, got {url!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        raise ValueError(f"url has an invalid port: {url!r}") from None
    if parsed.query or parsed.fragment:
        raise ValueError(f"url must not carry a query or fragment, got {url!r}")
    return url.rstrip("/")


def _label_value(raw: str) -> str:
    return re.sub(r'\\[\\"n]', lambda match: LABEL_ESCAPES[match.group(0)], raw)


def _sample_value(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def parse_metrics(text: str, names=None) -> dict:
    """``{name: [(labels, value), ...]}`` from Prometheus text exposition, for ``names`` only when given.

    Comments, blank lines, unparsable lines and NaN values are left out.
    """
    wanted = set(names) if names is not None else None
    samples = {}
    for line in text.splitlines():
        match = METRIC_SAMPLE.match(line.strip())
        if not match or (wanted is not None and match.group(1) not in wanted):
            continue
        value = _sample_value(match.group(3))
        if value is None:
            continue
        labels = {key: _label_value(raw) for key, raw in METRIC_LABEL.findall(match.group(2) or "")}
        samples.setdefault(match.group(1), []).append((labels, value))
    return samples


class GenerationResult:
    """One /generate answer, with client-side timings."""

    def __init__(self, text: str, meta_info: dict, latency_s: float, ttft_s: float | None = None, chunks: int = 0):
        self.text = text
        self.meta_info = meta_info or {}
        self.latency_s = latency_s
        self.ttft_s = ttft_s
        self.chunks = chunks

    @property
    def completion_tokens(self) -> int | None:
        value = self.meta_info.get("completion_tokens")
        return int(value) if isinstance(value, (int, float)) else None

    @property
    def accept_length(self) -> float | None:
        value = self.meta_info.get("spec_accept_length")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def tokens_per_s(self) -> float | None:
        """Decode throughput: tokens after the first over the time after the first (end to end if unknown)."""
        tokens = self.completion_tokens
        if not tokens or self.latency_s <= 0:
            return None
        if self.ttft_s is not None and tokens > 1 and self.latency_s > self.ttft_s:
            return (tokens - 1) / (self.latency_s - self.ttft_s)
        return tokens / self.latency_s


def stream_text(chunk_texts: list) -> str:
    """Join streamed ``text`` fields.

    SGLang streams the cumulative text by default and only the new piece with
    ``--incremental-streaming-output``. A stream is taken as cumulative when every chunk extends the one
    before and the text grew overall; otherwise the pieces are concatenated.
    """
    if not chunk_texts:
        return ""
    extends = all(later.startswith(earlier) for earlier, later in zip(chunk_texts, chunk_texts[1:]))
    if extends and (len(chunk_texts) == 1 or len(chunk_texts[-1]) > len(chunk_texts[0])):
        return chunk_texts[-1]
    return "".join(chunk_texts)


def _set_read_timeout(response, seconds: float) -> None:
    """Shorten the socket timeout of an open response to what is left of a deadline (best effort).

    urllib has no per-read deadline; http.client reads through ``fp.raw`` (a SocketIO) whose socket is
    ``_sock``. Where that is not reachable, each read may take up to the timeout the request was opened with.
    """
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.001))


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return True
    return isinstance(exc, URLError) and isinstance(exc.reason, (socket.timeout, TimeoutError))


class SglangClient:
    """Talks to one SGLang server."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        validate_certs: bool = True,
        clock=time.monotonic,
    ):
        self.url = validate_url(url)
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs
        self._clock = clock
        self._session = None
        self._readiness_path = READY_PATH

    def _ensure_session(self) -> Request:
        if self._session is None:
            # open_url() builds a TLS context (loading the CA store, about 50 ms) on every call; one session
            # with one context serves all of a probe's requests.
            context = make_context(validate_certs=self.validate_certs)
            self._session = Request(validate_certs=self.validate_certs, follow_redirects="safe", context=context)
        return self._session

    def _open(self, url: str, **kwargs):
        return self._ensure_session().open(kwargs.pop("method"), url, **kwargs)

    def _headers(self, body: bool = False) -> dict:
        headers = {"Accept": "application/json"}
        if body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _request(self, path: str, payload: dict | None = None, timeout: float | None = None):
        """Open ``path``; map every transport failure to SglangError. The caller closes the response."""
        timeout = self.timeout if timeout is None else timeout
        data = json.dumps(payload).encode("utf-8") if payload is not None else None
        try:
            return self._open(
                self.url + path,
                data=data,
                headers=self._headers(body=data is not None),
                method="POST" if data is not None else "GET",
                timeout=timeout,
            )
        except HTTPError as exc:
            raise SglangHTTPError(path, exc.code, _error_body(exc)) from None
        except Exception as exc:
            if _is_timeout(exc):
                raise SglangTimeout(f"no response from {path} within {timeout:.1f} s") from None
            reason = exc.reason if isinstance(exc, URLError) else exc
            raise SglangError(f"cannot reach {self.url}{path}: {reason}") from None

    def _read_body(self, response, path: str, timeout: float) -> bytes:
        try:
            return response.read()
        except Exception as exc:
            if _is_timeout(exc):
                raise SglangTimeout(f"no complete response from {path} within {timeout:.1f} s") from None
            raise SglangError(f"reading {path} failed: {exc}") from None
        finally:
            response.close()

    def get_json(self, path: str, timeout: float | None = None):
        timeout = self.timeout if timeout is None else timeout
        body = self._read_body(self._request(path, timeout=timeout), path, timeout)
        try:
            return json.loads(body.decode("utf-8"))
        except ValueError:
            raise SglangError(f"{path} did not return JSON: {_snippet(body)!r}") from None

    def _get_json_with_alias(self, path: str, alias: str):
        """GET ``path``; on 404 (older servers) GET its deprecated alias."""
        try:
            return self.get_json(path)
        except SglangHTTPError as exc:
            if exc.status != 404:
                raise
        return self.get_json(alias)

    def _status(self, path: str, timeout: float | None = None) -> int:
        """HTTP status of a GET of ``path``; connection problems raise."""
        timeout = self.timeout if timeout is None else timeout
        try:
            self._read_body(self._request(path, timeout=timeout), path, timeout)
        except SglangHTTPError as exc:
            return exc.status
        return 200

    def health(self, timeout: float | None = None) -> int:
        """HTTP status of /health (200 healthy, 503 starting, draining or unhealthy); connection problems raise.

        SGLang 0.5.23 answers /health with a one-token generation (``health_generate``), so it takes a second
        or more; :meth:`ready` is the cheap readiness signal.
        """
        return self._status(HEALTH_PATH, timeout)

    def ready(self, timeout: float | None = None) -> tuple:
        """``(path, HTTP status)`` of the server's readiness endpoint: /ready, or /health on a server without one.

        /ready (``sglang/srt/entrypoints/http_server.py`` ``ready``) is 200 once the warm-up answered and while
        the server is neither paused, draining nor unhealthy (``tokenizer_manager.py`` ``is_ready``), and runs no
        generation. A server that answers 404 there (SGLang before /ready existed) is asked /health instead, and
        so is every later call of this client.
        """
        if self._readiness_path == READY_PATH:
            status = self._status(READY_PATH, timeout)
            if status != 404:
                return READY_PATH, status
            self._readiness_path = HEALTH_PATH
        return HEALTH_PATH, self.health(timeout)

    def model_info(self) -> dict:
        return self._get_json_with_alias("/model_info", "/get_model_info")

    def server_info(self) -> dict:
        return self._get_json_with_alias("/server_info", "/get_server_info")

    def model_ids(self) -> list:
        """Model ids from the OpenAI-compatible /v1/models."""
        answer = self.get_json("/v1/models")
        entries = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(entries, list):
            raise SglangError(f"/v1/models answered without a 'data' list: {_snippet(json.dumps(answer))!r}")
        return [entry.get("id") for entry in entries if isinstance(entry, dict) and entry.get("id")]

    def metrics(self) -> str:
        """Prometheus text from /metrics (needs ``--enable-metrics`` on the server)."""
        return self._read_body(self._request("/metrics"), "/metrics", self.timeout).decode("utf-8", "replace")

    def metric_samples(self, names=None) -> dict:
        """``{name: [(labels, value), ...]}`` from /metrics (see :func:`parse_metrics`); a server without
        ``--enable-metrics`` answers 404 (SglangHTTPError)."""
        return parse_metrics(self.metrics(), names)

    def generate(
        self, prompt: str, max_new_tokens: int, timeout: float, temperature: float = 0.0, stream: bool = True
    ) -> GenerationResult:
        """Run one /generate within ``timeout`` seconds overall; stream to measure time to first token."""
        payload = {
            "text": prompt,
            "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens},
            "stream": stream,
        }
        started = self._clock()
        deadline = started + timeout
        response = self._request("/generate", payload, timeout=timeout)
        if not stream:
            answer = self._decode_generate(self._read_body(response, "/generate", timeout))
            return GenerationResult(answer.get("text") or "", answer.get("meta_info"), self._clock() - started)
        try:
            return self._read_stream(response, started, deadline, timeout)
        finally:
            response.close()

    def _decode_generate(self, body: bytes) -> dict:
        try:
            answer = json.loads(body.decode("utf-8"))
        except ValueError:
            raise SglangError(f"/generate did not return JSON: {_snippet(body)!r}") from None
        if isinstance(answer, list) and answer:
            answer = answer[0]
        if not isinstance(answer, dict):
            raise SglangError(f"/generate returned an unexpected answer: {_snippet(json.dumps(answer))!r}")
        _raise_stream_error(answer)
        return answer

    def _stream_chunks(self, response, deadline: float, timeout_message, ended_detail=lambda: ""):
        """Yield each decoded chunk of a /generate stream until ``data: [DONE]``, every read bounded by ``deadline``.

        ``timeout_message()`` words the SglangTimeout, and ``ended_detail()`` is added to the SglangError for a
        stream that ends early; both are called only then, so they can tell how far the caller got.
        """
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise SglangTimeout(timeout_message())
            _set_read_timeout(response, remaining)
            try:
                raw = response.readline()
            except Exception as exc:
                if _is_timeout(exc):
                    raise SglangTimeout(timeout_message()) from None
                raise SglangError(f"reading the /generate stream failed: {exc}") from None
            if not raw:
                raise SglangError(f"/generate stream ended without 'data: {STREAM_DONE}'{ended_detail()}")
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == STREAM_DONE:
                return
            yield self._decode_generate(data.encode("utf-8"))

    def _read_stream(self, response, started: float, deadline: float, timeout: float) -> GenerationResult:
        texts = []
        meta_info = {}
        ttft = None
        chunks = self._stream_chunks(
            response,
            deadline,
            timeout_message=lambda: _stream_timeout_message(timeout, len(texts), ttft),
            ended_detail=lambda: f" after {len(texts)} chunks",
        )
        for chunk in chunks:
            if ttft is None:
                ttft = self._clock() - started
            texts.append(chunk.get("text") or "")
            meta_info = chunk.get("meta_info") or meta_info
        return GenerationResult(stream_text(texts), meta_info, self._clock() - started, ttft, len(texts))


def _stream_timeout_message(timeout: float, chunks: int, ttft: float | None) -> str:
    if ttft is None:
        return f"no response from /generate within {timeout:.1f} s"
    return f"/generate did not finish within {timeout:.1f} s ({chunks} chunks, first after {ttft:.2f} s)"


def _raise_stream_error(answer: dict) -> None:
    error = answer.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        raise SglangError(f"/generate reported an error: {message}")


def _error_body(exc: HTTPError) -> str:
    try:
        body = exc.read() if exc.fp is not None else b""
    except Exception:
        body = b""
    return _snippet(body)


def _snippet(body) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    text = " ".join(text.split())
    return text if len(text) <= ERROR_BODY_CHARS else text[:ERROR_BODY_CHARS] + "..."
