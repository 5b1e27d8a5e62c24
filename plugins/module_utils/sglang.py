# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""HTTP client for an SGLang server's native API: readiness, health, model/server info, models, generate, metrics.

Private to the llmops.inference collection; not a public API. The transport is http_client.py's (Ansible's
``urls.Request``, so targets need nothing beyond Python). Every failure is raised as :class:`SglangError` with a
one-line message an operator can act on (which endpoint, what happened).
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlparse

from ansible_collections.llmops.inference.plugins.module_utils.http_client import (
    HttpClient,
    HttpStatusError,
    HttpUnreachable,
    decode_json,
    is_timeout,
    set_read_timeout,
    snippet,
)
from ansible_collections.llmops.inference.plugins.module_utils.in_flight import parse_metrics

DEFAULT_URL = "http://127.0.0.1:30000"
READY_PATH = "/ready"
HEALTH_PATH = "/health"
STREAM_DONE = "[DONE]"


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
        self.path, self.status, self.body = path, status, body
        super().__init__(f"{path} returned HTTP {status}" + (f": {body}" if body else ""))


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


class SglangClient(HttpClient):
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
        super().__init__(validate_url(url), api_key=api_key, timeout=timeout, validate_certs=validate_certs)
        self._clock = clock
        self._readiness_path = READY_PATH

    def _failure(self, exc: HttpUnreachable) -> SglangError:
        if exc.timed_out:
            answer = "no complete response" if exc.reading else "no response"
            return SglangTimeout(f"{answer} from {exc.path} within {exc.timeout:.1f} s")
        if exc.reading:
            return SglangError(f"reading {exc.path} failed: {exc.reason}")
        return SglangError(f"cannot reach {self.url}{exc.path}: {exc.reason}")

    def _request(self, path: str, payload: dict | None = None, timeout: float | None = None):
        """Open ``path`` (POST ``payload`` when given); every failure is an SglangError. The caller closes it."""
        try:
            return self.open("POST" if payload is not None else "GET", path, payload, timeout)
        except HttpStatusError as exc:
            raise SglangHTTPError(path, exc.status, snippet(exc.body)) from None
        except HttpUnreachable as exc:
            raise self._failure(exc) from None

    def _read_body(self, response, path: str, timeout: float) -> bytes:
        try:
            return self.read(response, "GET", path, timeout)
        except HttpUnreachable as exc:
            raise self._failure(exc) from None

    def get_json(self, path: str, timeout: float | None = None):
        timeout = self.timeout if timeout is None else timeout
        body = self._read_body(self._request(path, timeout=timeout), path, timeout)
        try:
            return decode_json(body)
        except ValueError:
            raise SglangError(f"{path} did not return JSON: {snippet(body)!r}") from None

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
            raise SglangError(f"/v1/models answered without a 'data' list: {snippet(json.dumps(answer))!r}")
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
            answer = decode_json(body)
        except ValueError:
            raise SglangError(f"/generate did not return JSON: {snippet(body)!r}") from None
        if isinstance(answer, list) and answer:
            answer = answer[0]
        if not isinstance(answer, dict):
            raise SglangError(f"/generate returned an unexpected answer: {snippet(json.dumps(answer))!r}")
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
            set_read_timeout(response, remaining)
            try:
                raw = response.readline()
            except Exception as exc:
                if is_timeout(exc):
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
