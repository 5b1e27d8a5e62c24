# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Load generator for an SGLang server: N streamed /generate requests at concurrency C, and their statistics.

Private to the llmops.inference collection; not a public API. Standard library plus the collection's
HTTP client (sglang.py).

Metric names and definitions follow SGLang's own benchmark (``sglang.bench_serving``, 0.5.x) where they mean
the same thing:

- ``duration`` is the wall time from the first request's start to the last request's end;
  ``output_throughput`` = completion tokens of the completed requests / duration (tok/s),
  ``request_throughput`` = completed / duration, ``concurrency`` = sum of E2E latencies / duration.
- TTFT is the time from sending a request to its first chunk with text; ITL is, for each later chunk that
  brings new tokens, the time since the previous such chunk divided evenly over those tokens (so a
  speculative step that emits 3 tokens counts 3 inter-token gaps); TPOT is (E2E - TTFT) / (tokens - 1).
- Statistics over all completed requests (ITL over all their gaps): mean, median, ``std`` (population
  standard deviation), ``p90``/``p95``/``p99`` percentiles by linear interpolation between the closest
  ranks (Hyndman and Fan type 7, numpy's default, which bench_serving uses), ``max_itl_ms``. An empty sample
  gives ``None`` rather than bench_serving's 0.
- ``output_throughput_per_user`` is what one user sees while its request runs: the mean over the completed
  requests of completion tokens / E2E latency (TTFT included); ``output_throughput`` is the server's.
- ``accept_length`` is this run's own: sum of completion tokens / sum of verify steps over the completed
  requests, the verify steps being each request's ``meta_info.spec_verify_ct`` or, where only
  ``spec_accept_length`` is reported, completion tokens / ``spec_accept_length``. That is the average
  accepted length per verify step, SGLang's own definition, without the server's lifetime history
  (bench_serving reads the server-wide ``avg_spec_accept_length`` instead).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.bench_prompts import builtin_prompts, random_prompts
from ansible_collections.llmops.inference.plugins.module_utils.module_support import (
    OptionSet,
    PrefixedOptionError,
    refused_as,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang import (
    DEFAULT_URL,
    SglangClient,
    SglangError,
    validate_url,
)

PROMPT_SETS = ("builtin", "random")
ERRORS_SHOWN = 5
SUMMED_METRICS = (
    "completed",
    "failed_requests",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "accept_length_requests",
)


class BenchInputError(PrefixedOptionError):
    """A bad option; ``option`` names it."""


@dataclass(eq=False)
class RequestResult:
    """One request as the client saw it; times in seconds, ``start_s`` relative to the run's start."""

    success: bool
    start_s: float = 0.0
    latency_s: float = 0.0
    ttft_s: float | None = None
    itls_s: list = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    error: str | None = None

    @property
    def verify_steps(self) -> float | None:
        """Verify steps this request took (see the module docstring), or None when the server did not say."""
        if not self.success or self.completion_tokens <= 0:
            return None
        if self.spec_verify_ct:
            return float(self.spec_verify_ct)
        if self.spec_accept_length:
            return self.completion_tokens / self.spec_accept_length
        return None


def _number(value, kind=float):
    return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class StreamingBenchClient(SglangClient):
    """The collection's SGLang client plus a streamed /generate that keeps the time of every chunk.

    ``SglangClient.generate`` reports only the first-token and end times; ITL needs each chunk's arrival
    and token count, so this times the stream's chunks itself, read with the client's transport, auth and
    error mapping.
    """

    def prepare(self, like: StreamingBenchClient | None = None) -> StreamingBenchClient:
        """Build the HTTP session now (its TLS context takes tens of ms), not inside the first measured request;
        with ``like``, share that client's session, so a pool of clients builds one context, not one each."""
        if like is not None and like._session is not None:
            self._session = like._session
        self._ensure_session()
        return self

    def timed_generate(
        self, prompt: str, max_new_tokens: int, timeout: float, ignore_eos: bool = True, temperature: float = 0.0
    ) -> RequestResult:
        payload = {
            "text": prompt,
            "sampling_params": {
                "temperature": temperature,
                "max_new_tokens": max_new_tokens,
                "ignore_eos": ignore_eos,
            },
            "stream": True,
        }
        started = self._clock()
        try:
            response = self._request("/generate", payload, timeout=timeout)
            try:
                return self._read_timed_stream(response, started, timeout)
            finally:
                response.close()
        except SglangError as exc:
            return RequestResult(False, latency_s=self._clock() - started, error=str(exc))

    def _read_timed_stream(self, response, started: float, timeout: float) -> RequestResult:
        deadline = started + timeout
        ttft = None
        itls = []
        last_at = started
        last_tokens = 0
        meta = {}
        timed_out = f"/generate did not finish within {timeout:.1f} s"
        for chunk in self._stream_chunks(response, deadline, timeout_message=lambda: timed_out):
            now = self._clock()
            meta = chunk.get("meta_info") or meta
            if not chunk.get("text"):
                continue
            tokens = _number(meta.get("completion_tokens"), int)
            tokens = last_tokens + 1 if tokens is None else tokens
            if ttft is None:
                ttft = now - started
            else:
                new_tokens = tokens - last_tokens
                if new_tokens <= 0:
                    continue
                itls.extend([(now - last_at) / new_tokens] * new_tokens)
            last_at = now
            last_tokens = tokens
        completion = _number(meta.get("completion_tokens"), int)
        return RequestResult(
            True,
            latency_s=self._clock() - started,
            ttft_s=ttft,
            itls_s=itls,
            prompt_tokens=_number(meta.get("prompt_tokens"), int),
            completion_tokens=last_tokens if completion is None else completion,
            spec_accept_length=_number(meta.get("spec_accept_length")),
            spec_verify_ct=_number(meta.get("spec_verify_ct"), int),
        )


def percentile(values: list, q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: list) -> dict:
    """mean, median, std (population), p90, p95, p99 and max of ``values``; all None when it is empty."""
    if not values:
        return dict.fromkeys(("mean", "median", "std", "p90", "p95", "p99", "max"))
    mean = sum(values) / len(values)
    return {
        "mean": mean,
        "median": percentile(values, 50),
        "std": math.sqrt(sum((value - mean) ** 2 for value in values) / len(values)),
        "p90": percentile(values, 90),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def aggregate_accept_length(results: list) -> tuple:
    """(accept length over this run's completed requests, how many requests reported it); (None, 0) if none."""
    steps = [(result.completion_tokens, result.verify_steps) for result in results]
    steps = [(tokens, verify) for tokens, verify in steps if verify]
    if not steps:
        return None, 0
    return sum(tokens for tokens, _verify in steps) / sum(verify for _tokens, verify in steps), len(steps)


def _latency_samples(completed: list) -> dict:
    return {
        "ttft": [result.ttft_s for result in completed if result.ttft_s is not None],
        "tpot": [
            (result.latency_s - result.ttft_s) / (result.completion_tokens - 1)
            for result in completed
            if result.ttft_s is not None and result.completion_tokens > 1
        ],
        "itl": [gap for result in completed for gap in result.itls_s],
        "e2e_latency": [result.latency_s for result in completed],
    }


def _per_user(completed: list) -> float | None:
    rates = [result.completion_tokens / result.latency_s for result in completed if result.latency_s > 0]
    return sum(rates) / len(rates) if rates else None


def error_summary(results: list) -> list:
    """The most frequent failure messages, most frequent first: [{"error": ..., "count": ...}]."""
    counts = Counter(result.error or "unknown error" for result in results if not result.success)
    return [{"error": error, "count": count} for error, count in counts.most_common(ERRORS_SHOWN)]


def compute_metrics(results: list, duration: float) -> dict:
    """bench_serving's metrics (plus ``failed_requests``, ``errors`` and our accept length) from request results."""
    completed = [result for result in results if result.success]
    output_tokens = sum(result.completion_tokens for result in completed)
    input_tokens = sum(result.prompt_tokens or 0 for result in completed)
    per_s = (lambda amount: amount / duration) if duration > 0 else (lambda amount: None)
    accept_length, accept_requests = aggregate_accept_length(completed)
    metrics = {
        "completed": len(completed),
        # Not "failed": Ansible reads a truthy "failed" in a module's result as the task failing.
        "failed_requests": len(results) - len(completed),
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_s(len(completed)),
        "input_throughput": per_s(input_tokens),
        "output_throughput": per_s(output_tokens),
        "total_throughput": per_s(input_tokens + output_tokens),
        "concurrency": per_s(sum(result.latency_s for result in completed)),
        "output_throughput_per_user": _per_user(completed),
        "accept_length": accept_length,
        "accept_length_requests": accept_requests,
        "errors": error_summary(results),
    }
    for name, samples in _latency_samples(completed).items():
        stats = distribution([sample * 1000.0 for sample in samples])
        for stat in ("mean", "median", "std", "p90", "p95", "p99"):
            metrics[f"{stat}_{name}_ms"] = stats[stat]
        if name == "itl":
            metrics["max_itl_ms"] = stats["max"]
    return metrics


def combine_runs(runs: list) -> dict:
    """One set of metrics for several runs of the same requests: counts, token totals and durations summed,
    error counts merged, the first start and the last end, every other number the median over the runs (None
    when a run has none)."""
    if len(runs) == 1:
        return dict(runs[0])
    combined = {}
    for key in runs[0]:
        values = [run[key] for run in runs]
        if key in SUMMED_METRICS:
            combined[key] = sum(values)
        elif key == "started_at":
            combined[key] = min(values)
        elif key == "ended_at":
            combined[key] = max(values)
        elif key == "errors":
            counts = Counter()
            for errors in values:
                counts.update({entry["error"]: entry["count"] for entry in errors})
            combined[key] = [{"error": error, "count": count} for error, count in counts.most_common(ERRORS_SHOWN)]
        else:
            combined[key] = None if any(value is None for value in values) else percentile(values, 50)
    return combined


def run_requests(send, prompts: list, concurrency: int, clock=time.monotonic, stop_on_failure: bool = False) -> tuple:
    """Send every prompt with at most ``concurrency`` in flight; return (results in prompt order, duration).

    ``send(prompt) -> RequestResult`` is called from worker threads; each worker should own its connection.
    With ``stop_on_failure`` no request is sent after the first one that failed (those in flight still run to
    their end or their timeout), and the results hold only the requests sent. ``send`` returns None to decline a
    prompt (a budget ran out): no later prompt is sent either, and the results leave it out.
    """
    results = [None] * len(prompts)
    next_index = iter(range(len(prompts)))
    lock = threading.Lock()
    failed = threading.Event()
    declined = threading.Event()
    started = clock()

    def worker():
        while True:
            with lock:
                stopped = (stop_on_failure and failed.is_set()) or declined.is_set()
                index = None if stopped else next(next_index, None)
            if index is None:
                return
            begun = clock()
            try:
                result = send(prompts[index])
            except Exception as exc:  # a worker must never die silently and leave a hole in the results
                result = RequestResult(False, latency_s=clock() - begun, error=f"{type(exc).__name__}: {exc}")
            if result is None:
                declined.set()
                return
            result.start_s = begun - started
            results[index] = result
            if not result.success:
                failed.set()

    threads = [threading.Thread(target=worker, daemon=True) for _number in range(min(concurrency, len(prompts)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [result for result in results if result is not None], clock() - started


class BenchSettings(OptionSet):
    """The benchmark's inputs, validated; ``validate()`` raises BenchInputError naming the option."""

    DEFAULTS = {
        "url": DEFAULT_URL,
        "num_prompts": 32,
        "concurrency": 8,
        "max_new_tokens": 128,
        "prompt_set": "builtin",
        "random_input_len": 256,
        "seed": 0,
        "request_timeout": 120.0,
        "warmup_requests": 1,
        "repeats": 1,
        "ignore_eos": True,
        "temperature": 0.0,
        "stop_on_failure": False,
    }

    def validate(self) -> BenchSettings:
        with refused_as("url", BenchInputError):
            self.url = validate_url(self.url)
        for option, minimum in (
            ("num_prompts", 1),
            ("concurrency", 1),
            ("max_new_tokens", 1),
            ("random_input_len", 1),
            ("warmup_requests", 0),
            ("repeats", 1),
        ):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise BenchInputError(option, f"must be an integer >= {minimum}, got {value!r}")
        if self.prompt_set not in PROMPT_SETS:
            raise BenchInputError("prompt_set", f"must be one of {', '.join(PROMPT_SETS)}, got {self.prompt_set!r}")
        if self.request_timeout <= 0:
            raise BenchInputError("request_timeout", f"must be a number of seconds > 0, got {self.request_timeout!r}")
        if self.temperature < 0:
            raise BenchInputError("temperature", f"must be >= 0, got {self.temperature!r}")
        return self

    def prompts(self, count: int, seed_offset: int = 0) -> list:
        if self.prompt_set == "random":
            return random_prompts(count, self.random_input_len, self.seed + seed_offset)
        return builtin_prompts(count)


class RequestSender:
    """Sends one request on a client of a pool prepared up front, within ``request_timeout`` and what is left of
    ``budget_s`` (counted from this object's creation); once the budget has run out it declines (returns None)."""

    def __init__(self, settings: BenchSettings, client_factory, clock=time.monotonic, budget_s: float | None = None):
        self.settings = settings
        self.clock = clock
        self.budget_s = budget_s
        self.deadline = None if budget_s is None else clock() + budget_s
        self.cut = threading.Event()
        # At most `concurrency` requests are in flight, so a pool of that many clients never runs dry.
        self.idle_clients = queue.SimpleQueue()
        previous = None
        for _number in range(min(settings.concurrency, max(settings.warmup_requests, settings.num_prompts))):
            previous = client_factory().prepare(like=previous)
            self.idle_clients.put(previous)

    def expired(self) -> bool:
        """Whether the budget has run out (and something was left out because of it)."""
        if self.deadline is None or self.clock() < self.deadline:
            return False
        self.cut.set()
        return True

    def __call__(self, prompt: str) -> RequestResult | None:
        settings = self.settings
        timeout = settings.request_timeout
        if self.deadline is not None:
            left = self.deadline - self.clock()
            if left <= 0:
                self.cut.set()
                return None
            timeout = min(timeout, left)
        client = self.idle_clients.get()
        try:
            result = client.timed_generate(
                prompt, settings.max_new_tokens, timeout, settings.ignore_eos, settings.temperature
            )
        finally:
            self.idle_clients.put(client)
        if not result.success and timeout < settings.request_timeout and self.expired():
            result.error = f"stopped when the budget of {self.budget_s:g} s ran out: {result.error}"
        return result


def run_benchmark(
    settings: BenchSettings, client_factory, clock=time.monotonic, wall=time.time, budget_s: float | None = None
) -> dict:
    """Warm up, then run the measured requests ``repeats`` times; return the metrics plus what was run.

    ``client_factory()`` gives a new StreamingBenchClient; each request in flight uses one of its own, prepared
    before any request is timed. Each run records when its requests started and ended (``started_at``,
    ``ended_at``: seconds since the epoch, this host's clock). With ``stop_on_failure`` the first failed
    request ends the benchmark: no later request and no later run is sent (``stopped_early``, ``unsent_requests``).
    With ``budget_s`` the whole benchmark, warm-up included, ends that many seconds after it began: no request is
    sent later, a request still running then fails with the budget in its error, and ``out_of_budget`` says
    whether the budget cut anything short.
    """
    send = RequestSender(settings, client_factory, clock, budget_s)
    began = clock()
    stop = settings.stop_on_failure
    unsent = 0
    warmup = {"requests": settings.warmup_requests, "failed_requests": 0, "duration": 0.0, "errors": []}
    if settings.warmup_requests:
        # Not measured. Random warm-up prompts come from another seed than the measured ones, so the
        # server's prefix cache does not make the measured requests look faster than they are.
        warm_prompts = settings.prompts(settings.warmup_requests, seed_offset=1)
        warm_results, warm_duration = run_requests(send, warm_prompts, settings.concurrency, clock, stop)
        unsent += len(warm_prompts) - len(warm_results)
        warmup.update(
            failed_requests=sum(1 for result in warm_results if not result.success),
            duration=warm_duration,
            errors=error_summary(warm_results),
        )
    prompts = settings.prompts(settings.num_prompts)
    runs = []
    for _repeat in range(settings.repeats):
        failed_before = warmup["failed_requests"] or any(run["failed_requests"] for run in runs)
        if (stop and failed_before) or send.expired():
            unsent += len(prompts)
            continue
        started_at = wall()
        results, duration = run_requests(send, prompts, settings.concurrency, clock, stop)
        unsent += len(prompts) - len(results)
        runs.append(dict(compute_metrics(results, duration), started_at=started_at, ended_at=wall()))
    metrics = combine_runs(runs) if runs else compute_metrics([], 0.0)
    metrics.update(
        runs=runs,
        repeats=settings.repeats,
        num_prompts=settings.num_prompts,
        max_concurrency=settings.concurrency,
        max_new_tokens=settings.max_new_tokens,
        prompt_set=settings.prompt_set,
        warmup=warmup,
        elapsed_s=clock() - began,
        stopped_early=unsent > 0,
        unsent_requests=unsent,
    )
    if budget_s is not None:
        metrics["out_of_budget"] = send.cut.is_set()
    return metrics
