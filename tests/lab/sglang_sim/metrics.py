"""Server statistics and their Prometheus exposition under SGLang's metric names (sglang:...).

Names, labels and kinds follow sglang/srt/observability/metrics_collector.py: the scheduler's gauges
(SchedulerMetricsCollector: num_running_reqs, num_queue_reqs, gen_throughput, ...) carry model_name,
engine_type, tp_rank, pp_rank, moe_ep_rank; the tokenizer's counters (TokenizerMetricsCollector) carry
model_name and engine_type, prompt_tokens_total and generation_tokens_total also is_streaming, and
are counted when a request finishes (observe_one_finished_request), not per token.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

THROUGHPUT_WINDOW_S = 10.0
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)


@dataclass
class Histogram:
    buckets: tuple
    counts: list = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1


@dataclass(frozen=True)
class FinishedRequest:
    streaming: bool
    prompt_tokens: int
    completion_tokens: int
    first_token_at: float
    finished_at: float
    ttft: float
    e2e: float
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0


class Stats:
    """Counters shared by the HTTP threads; every method takes the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = {"true": 0, "false": 0}
        self.prompt_tokens = {"true": 0, "false": 0}
        self.generation_tokens = {"true": 0, "false": 0}
        self.verify_ct = 0
        self.spec_tokens = 0
        self.correct_drafts = 0
        self.proposed_drafts = 0
        self.ttft = {"true": Histogram(TTFT_BUCKETS), "false": Histogram(TTFT_BUCKETS)}
        self.e2e = {"true": Histogram(E2E_BUCKETS), "false": Histogram(E2E_BUCKETS)}
        self._recent: deque = deque()

    def finished(self, request: FinishedRequest) -> None:
        key = "true" if request.streaming else "false"
        with self._lock:
            self.requests[key] += 1
            self.prompt_tokens[key] += request.prompt_tokens
            self.generation_tokens[key] += request.completion_tokens
            if request.verify_ct:
                self.verify_ct += request.verify_ct
                self.spec_tokens += request.completion_tokens
                self.correct_drafts += request.correct_drafts
                self.proposed_drafts += request.proposed_drafts
            self.ttft[key].observe(request.ttft)
            self.e2e[key].observe(request.e2e)
            self._recent.append((request.first_token_at, request.finished_at, request.completion_tokens))

    def gen_throughput(self, now: float | None = None) -> float:
        """Output tokens per second over the last THROUGHPUT_WINDOW_S, decode time of finished requests pro-rated."""
        now = time.monotonic() if now is None else now
        window_start = now - THROUGHPUT_WINDOW_S
        with self._lock:
            while self._recent and self._recent[0][1] < window_start:
                self._recent.popleft()
            if not self._recent:
                return 0.0
            tokens = 0.0
            for start, end, count in self._recent:
                span = max(end - start, 1e-9)
                overlap = min(end, now) - max(start, window_start)
                tokens += count * max(0.0, min(1.0, overlap / span))
            earliest = max(window_start, min(start for start, _end, _count in self._recent))
        return tokens / max(now - earliest, 1e-3)

    def avg_accept_length(self) -> float | None:
        with self._lock:
            return self.spec_tokens / self.verify_ct if self.verify_ct else None

    def avg_accept_rate(self) -> float | None:
        with self._lock:
            return self.correct_drafts / self.proposed_drafts if self.proposed_drafts else None


class LabelledGauge:
    """A gauge by label tuple; a label set once seen stays, at 0 when idle (prometheus_client's children)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple, int] = {}

    def change(self, labels: tuple, delta: int) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0) + delta

    def samples(self) -> list[tuple[tuple, int]]:
        with self._lock:
            return sorted(self._values.items())


def _labels(base: dict, **extra) -> str:
    merged = {**base, **extra}
    return "{" + ",".join(f'{key}="{value}"' for key, value in merged.items()) + "}"


def _metric(lines: list, name: str, kind: str, doc: str, samples: list) -> None:
    lines.append(f"# HELP {name} {doc}")
    lines.append(f"# TYPE {name} {kind}")
    for suffix, labels, value in samples:
        lines.append(f"{name}{suffix}{labels} {float(value)!r}")


def _histogram(lines: list, name: str, doc: str, base: dict, by_stream: dict) -> None:
    samples = []
    for streaming, hist in by_stream.items():
        counts = hist.counts or [0] * len(hist.buckets)
        for bound, count in zip(hist.buckets, counts):
            samples.append(("_bucket", _labels(base, is_streaming=streaming, le=f"{float(bound)!r}"), count))
        samples.append(("_bucket", _labels(base, is_streaming=streaming, le="+Inf"), hist.count))
        samples.append(("_count", _labels(base, is_streaming=streaming), hist.count))
        samples.append(("_sum", _labels(base, is_streaming=streaming), hist.total))
    _metric(lines, name, "histogram", doc, samples)


def render(
    stats: Stats,
    *,
    gauges: tuple[int, int, float],
    model_name: str,
    spec_steps: int | None,
    spec_draft_tokens: int | None,
    max_total_num_tokens: int,
    used_tokens: int,
    realtime_tokens: dict | None = None,
    http_active: list | None = None,
) -> str:
    scheduler = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    tokenizer = {"model_name": model_name, "engine_type": "unified"}
    sched = _labels(scheduler)
    lines: list = []
    running, queued, gen_throughput = gauges
    _metric(lines, "sglang:num_running_reqs", "gauge", "The number of running requests.", [("", sched, running)])
    _metric(
        lines, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", [("", sched, queued)]
    )
    _metric(
        lines,
        "sglang:gen_throughput",
        "gauge",
        "The generation throughput (token/s).",
        [("", sched, gen_throughput)],
    )
    _metric(lines, "sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", [("", sched, 0.0)])
    usage = used_tokens / max_total_num_tokens if max_total_num_tokens else 0.0
    _metric(lines, "sglang:token_usage", "gauge", "The token usage.", [("", sched, usage)])
    _metric(
        lines,
        "sglang:max_total_num_tokens",
        "gauge",
        "Maximum total number of tokens in the KV cache pool.",
        [("", sched, max_total_num_tokens)],
    )
    if spec_steps is not None:
        _metric(
            lines,
            "sglang:spec_accept_length",
            "gauge",
            "The average acceptance length of speculative decoding.",
            [("", sched, stats.avg_accept_length() or 0.0)],
        )
        _metric(
            lines,
            "sglang:spec_accept_rate",
            "gauge",
            "The average acceptance rate of speculative decoding.",
            [("", sched, stats.avg_accept_rate() or 0.0)],
        )
        _metric(
            lines,
            "sglang:spec_num_steps",
            "gauge",
            "Currently active speculative_num_steps.",
            [("", sched, spec_steps)],
        )
        _metric(
            lines,
            "sglang:spec_num_draft_tokens",
            "gauge",
            "Currently active speculative_num_draft_tokens.",
            [("", sched, spec_draft_tokens or 0)],
        )
    # A labelled counter has no sample until it first grows.
    _metric(
        lines,
        "sglang:realtime_tokens_total",
        "counter",
        "Total number of tokens processed (updated on each log interval). "
        "mode: prefill_compute, prefill_cache, decode.",
        [("", _labels(scheduler, mode=mode), count) for mode, count in (realtime_tokens or {}).items() if count],
    )
    tok = _labels(tokenizer)
    _metric(
        lines,
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        [("", _labels(tokenizer, is_streaming=key), value) for key, value in stats.prompt_tokens.items()],
    )
    _metric(
        lines,
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        [("", _labels(tokenizer, is_streaming=key), value) for key, value in stats.generation_tokens.items()],
    )
    _metric(
        lines,
        "sglang:spec_verify_calls_total",
        "counter",
        "Number of speculative decoding verification calls.",
        [("", tok, stats.verify_ct)],
    )
    _metric(
        lines,
        "sglang:num_requests_total",
        "counter",
        "Number of requests processed.",
        [("", _labels(tokenizer, is_streaming=key), value) for key, value in stats.requests.items()],
    )
    _histogram(
        lines,
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        tokenizer,
        stats.ttft,
    )
    _histogram(
        lines,
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        tokenizer,
        stats.e2e,
    )
    if http_active is not None:  # observability/http_request_metrics.py, multiprocess_mode livesum: no pid label
        _metric(
            lines,
            "sglang:http_requests_active",
            "gauge",
            "Number of currently active HTTP requests",
            [
                ("", _labels({"endpoint": endpoint, "method": method}), value)
                for (endpoint, method), value in http_active
            ],
        )
    return "\n".join(lines) + "\n"
