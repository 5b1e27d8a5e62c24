"""The load generator: statistics as bench_serving computes them, accept length of the run, streaming timings."""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import pytest
from fake_sglang_server import SLOW_DAY_S, FakeSglang, callable_route, hang_route, json_route, stream_route

from ansible_collections.llmops.inference.plugins.module_utils import bench_levels
from ansible_collections.llmops.inference.plugins.module_utils.bench import (
    BenchInputError,
    BenchSettings,
    RequestResult,
    StreamingBenchClient,
    aggregate_accept_length,
    combine_runs,
    compute_metrics,
    distribution,
    percentile,
    run_benchmark,
    run_requests,
)
from ansible_collections.llmops.inference.plugins.module_utils.bench_levels import (
    BenchLevel,
    BenchProgress,
    EngineWatch,
    check_progress_path,
    parse_levels,
    run_levels,
)


@pytest.fixture
def server():
    fake = FakeSglang({}).start()
    yield fake
    fake.stop()


def chunks(*token_counts, text="word ", meta=None) -> list:
    """Cumulative streamed chunks whose meta_info reports the given completion tokens; ``meta`` on the last."""
    out = []
    for number, tokens in enumerate(token_counts, start=1):
        info = {"prompt_tokens": 7, "completion_tokens": tokens}
        if number == len(token_counts):
            info.update(meta or {})
        out.append({"text": text * tokens, "meta_info": info})
    return out


# numpy.percentile(values, q) with its default (linear) method gives these; bench_serving uses it.
@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4], 90, 3.7),
        ([1, 2, 3, 4], 99, 3.97),
        ([10, 1, 7], 50, 7),
        ([5.0], 99, 5.0),
        (list(range(101)), 90, 90.0),
    ],
)
def test_percentile_interpolates_linearly_between_closest_ranks(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_and_distribution_of_nothing_are_none():
    assert percentile([], 50) is None
    assert set(distribution([]).values()) == {None}


def test_distribution_uses_the_population_standard_deviation():
    stats = distribution([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert stats["mean"] == 5.0
    assert stats["std"] == 2.0
    assert stats["median"] == 4.5
    assert stats["max"] == 9.0


def test_accept_length_is_tokens_over_verify_steps_of_this_run():
    results = [
        RequestResult(True, completion_tokens=100, spec_verify_ct=50, spec_accept_length=2.0),
        RequestResult(True, completion_tokens=30, spec_verify_ct=10, spec_accept_length=3.0),
    ]
    value, requests = aggregate_accept_length(results)
    # 130 tokens in 60 verify steps, not the plain mean of 2.0 and 3.0
    assert value == pytest.approx(130 / 60)
    assert requests == 2


def test_accept_length_falls_back_to_tokens_over_the_reported_accept_length():
    results = [
        RequestResult(True, completion_tokens=90, spec_accept_length=3.0),
        RequestResult(True, completion_tokens=10, spec_accept_length=1.0),
        RequestResult(False, completion_tokens=0, spec_accept_length=4.0, error="x"),
    ]
    value, requests = aggregate_accept_length(results)
    assert value == pytest.approx(100 / (30 + 10))
    assert requests == 2


def test_accept_length_is_none_without_speculative_meta_info():
    assert aggregate_accept_length([RequestResult(True, completion_tokens=10)]) == (None, 0)


def test_compute_metrics_follows_bench_serving():
    results = [
        RequestResult(True, latency_s=1.0, ttft_s=0.1, itls_s=[0.1, 0.2], prompt_tokens=5, completion_tokens=10),
        RequestResult(True, latency_s=2.0, ttft_s=0.3, itls_s=[0.3], prompt_tokens=7, completion_tokens=18),
        RequestResult(False, latency_s=0.5, error="/generate returned HTTP 503"),
    ]
    metrics = compute_metrics(results, duration=4.0)
    assert metrics["completed"] == 2
    assert metrics["failed_requests"] == 1
    assert metrics["errors"] == [{"error": "/generate returned HTTP 503", "count": 1}]
    assert metrics["total_output_tokens"] == 28
    assert metrics["total_input_tokens"] == 12
    assert metrics["output_throughput"] == pytest.approx(7.0)
    assert metrics["request_throughput"] == pytest.approx(0.5)
    assert metrics["concurrency"] == pytest.approx(0.75)
    assert metrics["mean_ttft_ms"] == pytest.approx(200.0)
    assert metrics["median_e2e_latency_ms"] == pytest.approx(1500.0)
    assert metrics["mean_itl_ms"] == pytest.approx(200.0)
    assert metrics["max_itl_ms"] == pytest.approx(300.0)
    # TPOT: (1.0 - 0.1) / 9 and (2.0 - 0.3) / 17
    assert metrics["mean_tpot_ms"] == pytest.approx(100.0)
    assert metrics["accept_length"] is None


def test_metrics_of_a_run_where_everything_failed_are_none_not_zero():
    metrics = compute_metrics([RequestResult(False, error="boom")], duration=1.0)
    assert metrics["completed"] == 0
    assert metrics["mean_ttft_ms"] is None
    assert metrics["p99_itl_ms"] is None
    assert metrics["output_throughput"] == 0.0


def test_combine_runs_sums_counts_and_takes_medians():
    runs = [
        {"completed": 4, "failed_requests": 0, "duration": 2.0, "output_throughput": 100.0, "accept_length": None,
         "errors": []},
        {"completed": 3, "failed_requests": 1, "duration": 3.0, "output_throughput": 80.0, "accept_length": 2.0,
         "errors": [{"error": "e", "count": 1}]},
        {"completed": 4, "failed_requests": 0, "duration": 2.5, "output_throughput": 90.0, "accept_length": 2.2,
         "errors": []},
    ]  # fmt: skip
    combined = combine_runs(runs)
    assert combined["completed"] == 11
    assert combined["failed_requests"] == 1
    assert combined["duration"] == 7.5
    assert combined["output_throughput"] == 90.0
    assert combined["accept_length"] is None
    assert combined["errors"] == [{"error": "e", "count": 1}]
    assert combine_runs(runs[:1]) == runs[0]


def test_run_requests_keeps_at_most_concurrency_in_flight_and_the_prompt_order():
    lock = threading.Lock()
    state = {"now": 0, "most": 0}

    def send(prompt):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.01)  # simulated work, so that requests overlap
        with lock:
            state["now"] -= 1
        return RequestResult(True, completion_tokens=len(prompt))

    prompts = ["x" * size for size in range(1, 13)]
    results, duration = run_requests(send, prompts, concurrency=3)
    assert state["most"] == 3
    assert [result.completion_tokens for result in results] == list(range(1, 13))
    assert duration > 0
    assert all(result.start_s >= 0 for result in results)


def test_run_requests_turns_an_exception_into_a_failed_request():
    def send(prompt):
        raise RuntimeError("socket exploded")

    results, _wall = run_requests(send, ["a", "b"], concurrency=4)
    assert [result.success for result in results] == [False, False]
    assert results[0].error == "RuntimeError: socket exploded"


def test_timed_generate_measures_ttft_and_spreads_each_chunk_over_its_new_tokens(server):
    meta = {"spec_accept_length": 2.5, "spec_verify_ct": 2, "e2e_latency": 0.2}
    server.routes["/generate"] = stream_route(chunks(1, 3, 5, meta=meta), gap=0.05)
    result = StreamingBenchClient(server.url).timed_generate("hi", max_new_tokens=5, timeout=10)
    assert result.success, result.error
    assert result.completion_tokens == 5
    assert result.prompt_tokens == 7
    assert result.spec_accept_length == 2.5
    assert result.spec_verify_ct == 2
    assert result.ttft_s >= 0.05
    # chunk 2 brings 2 tokens, chunk 3 another 2: four gaps of about 0.05 / 2 s each
    assert len(result.itls_s) == 4
    assert all(0.015 < gap < 0.2 for gap in result.itls_s)
    assert result.latency_s >= result.ttft_s + 0.09
    body = server.requests[0]["body"]
    assert body["stream"] is True
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}


def test_timed_generate_reports_failures_instead_of_raising(server):
    server.routes["/generate"] = json_route({"error": "overloaded"}, status=503)
    refused = StreamingBenchClient(server.url).timed_generate("hi", 4, timeout=5)
    assert not refused.success
    assert "/generate returned HTTP 503" in refused.error

    server.routes["/generate"] = stream_route([{"error": {"message": "context too long"}}])
    error = StreamingBenchClient(server.url).timed_generate("hi", 4, timeout=5)
    assert error.error == "/generate reported an error: context too long"

    server.routes["/generate"] = hang_route()
    hung = StreamingBenchClient(server.url).timed_generate("hi", 4, timeout=0.3)
    assert not hung.success
    assert "0.3 s" in hung.error

    server.routes["/generate"] = stream_route(chunks(1, 2), done=False)
    cut = StreamingBenchClient(server.url).timed_generate("hi", 4, timeout=5)
    assert cut.error == "/generate stream ended without 'data: [DONE]'"

    server.routes["/generate"] = stream_route(chunks(*range(1, 40)), gap=0.1)
    trickled = StreamingBenchClient(server.url).timed_generate("hi", 40, timeout=0.5)
    assert trickled.error == "/generate did not finish within 0.5 s"


def test_run_benchmark_warms_up_then_repeats_the_measured_requests(server):
    server.routes["/generate"] = stream_route(chunks(2, 4, meta={"spec_verify_ct": 2}))
    settings = BenchSettings(
        url=server.url, num_prompts=5, concurrency=2, max_new_tokens=4, warmup_requests=2, repeats=3
    )
    result = run_benchmark(settings.validate(), lambda: StreamingBenchClient(settings.url))
    assert len(server.requests) == 2 + 3 * 5
    assert result["warmup"]["requests"] == 2
    assert result["warmup"]["failed_requests"] == 0
    assert len(result["runs"]) == 3
    assert [run["completed"] for run in result["runs"]] == [5, 5, 5]
    assert result["completed"] == 15
    assert result["total_output_tokens"] == 60
    assert result["accept_length"] == pytest.approx(2.0)
    assert result["repeats"] == 3
    assert result["elapsed_s"] >= result["duration"]


def test_run_benchmark_prepares_one_client_per_request_in_flight(server):
    server.routes["/generate"] = stream_route(chunks(2))
    made = []

    def factory():
        client = StreamingBenchClient(server.url)
        made.append(client)
        return client

    settings = BenchSettings(url=server.url, num_prompts=6, concurrency=3, warmup_requests=1, repeats=2).validate()
    result = run_benchmark(settings, factory)
    assert result["completed"] == 12
    assert len(made) == 3
    assert all(client._session is not None for client in made)
    assert len({id(client._session) for client in made}) == 1  # one TLS context for the pool, not one each


def test_run_benchmark_counts_failures_per_run(server):
    served = {"count": 0}
    lock = threading.Lock()

    def every_other(request):
        with lock:
            served["count"] += 1
            odd = served["count"] % 2
        return stream_route(chunks(3)) if odd else json_route({"detail": "busy"}, status=503)

    server.routes["/generate"] = callable_route(every_other)
    settings = BenchSettings(url=server.url, num_prompts=4, concurrency=1, warmup_requests=0).validate()
    result = run_benchmark(settings, lambda: StreamingBenchClient(settings.url))
    assert result["completed"] == 2
    assert result["failed_requests"] == 2
    assert result["errors"][0]["count"] == 2
    assert "HTTP 503" in result["errors"][0]["error"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_prompts": 0}, "num_prompts: must be an integer >= 1, got 0"),
        ({"concurrency": -2}, "concurrency: must be an integer >= 1"),
        ({"max_new_tokens": True}, "max_new_tokens: must be an integer >= 1"),
        ({"warmup_requests": -1}, "warmup_requests: must be an integer >= 0"),
        ({"repeats": 0}, "repeats: must be an integer >= 1"),
        ({"prompt_set": "sharegpt"}, "prompt_set: must be one of builtin, random"),
        ({"request_timeout": 0}, "request_timeout: must be a number of seconds > 0"),
        ({"url": "localhost:30000"}, "url: url must be an absolute http:// or https:// URL"),
    ],
)
def test_bad_settings_name_the_option(options, message):
    with pytest.raises(BenchInputError, match=message):
        BenchSettings(**options).validate()


def test_run_requests_stops_sending_after_the_first_failure():
    sent = []

    def send(prompt):
        sent.append(prompt)
        if prompt == "c":
            return RequestResult(False, error="timed out")
        time.sleep(0.01)
        return RequestResult(True, completion_tokens=1)

    results, _duration = run_requests(send, list("abcdefgh"), concurrency=1, stop_on_failure=True)
    assert sent == ["a", "b", "c"]
    assert [result.success for result in results] == [True, True, False]
    everything, _duration = run_requests(send, list("abcd"), concurrency=1)
    assert len(everything) == 4


def test_a_hanging_server_costs_one_request_timeout_with_stop_on_failure(server):
    server.routes["/generate"] = hang_route()
    settings = BenchSettings(
        url=server.url, num_prompts=6, concurrency=2, warmup_requests=0, repeats=3, request_timeout=0.4,
        stop_on_failure=True,
    ).validate()  # fmt: skip
    result = run_benchmark(settings, lambda: StreamingBenchClient(settings.url))
    # without stopping: 3 runs x 3 waves x 0.4 s; stopping: the first wave's two requests time out together
    assert server.paths().count("/generate") == 2
    assert (result["failed_requests"], result["unsent_requests"], result["stopped_early"]) == (2, 4 + 2 * 6, True)
    assert len(result["runs"]) == 1
    assert "0.4 s" in result["errors"][0]["error"]


def test_each_run_records_when_its_requests_started_and_ended_and_the_rate_per_user(server):
    server.routes["/generate"] = stream_route(chunks(2, 4), gap=0.02)
    ticks = iter(range(100, 200))
    settings = BenchSettings(url=server.url, num_prompts=2, concurrency=2, warmup_requests=0, repeats=2).validate()
    result = run_benchmark(settings, lambda: StreamingBenchClient(settings.url), wall=lambda: float(next(ticks)))
    assert [(run["started_at"], run["ended_at"]) for run in result["runs"]] == [(100.0, 101.0), (102.0, 103.0)]
    assert (result["started_at"], result["ended_at"]) == (100.0, 103.0)  # first start, last end
    run = result["runs"][0]
    # each request: 4 tokens over its E2E latency; the server's rate is the sum over the duration
    assert 0 < run["output_throughput_per_user"] < run["output_throughput"]
    assert result["unsent_requests"] == 0 and result["stopped_early"] is False


def test_a_budget_ends_the_benchmark_and_says_so_in_the_errors(server):
    server.routes["/generate"] = hang_route()
    settings = BenchSettings(
        url=server.url, num_prompts=4, concurrency=2, warmup_requests=0, repeats=2, request_timeout=30
    ).validate()
    began = time.monotonic()
    # 3 s: time enough for the first wave to be sent on a crowded machine, and far below the 30 s request timeout
    result = run_benchmark(settings, lambda: StreamingBenchClient(settings.url), budget_s=3.0)
    # the first wave's two requests are cut at the budget, not at their 30 s request timeout
    assert time.monotonic() - began < 3.0 + SLOW_DAY_S
    assert result["out_of_budget"] is True
    assert (result["failed_requests"], result["unsent_requests"], result["stopped_early"]) == (2, 2 + 4, True)
    assert result["errors"][0]["error"].startswith("stopped when the budget of 3 s ran out: ")


def test_run_requests_sends_nothing_after_a_declined_prompt():
    def send(prompt):
        return None if prompt == "c" else RequestResult(True, completion_tokens=1)

    results, _duration = run_requests(send, list("abcdef"), concurrency=1)
    assert [result.completion_tokens for result in results] == [1, 1]


def test_levels_run_in_order_on_one_server_with_the_warm_up_before_the_first_only(server):
    server.routes["/generate"] = stream_route(chunks(2, 4, meta={"spec_verify_ct": 2}))
    settings = BenchSettings(url=server.url, num_prompts=3, warmup_requests=2, repeats=2).validate()
    levels = parse_levels([{"concurrency": 1, "num_prompts": 2}, {"concurrency": 4, "budget_s": 60}], 3)
    assert levels == [BenchLevel(1, 2), BenchLevel(4, 3, 60.0)]
    result = run_levels(settings, levels, lambda: StreamingBenchClient(settings.url))
    assert len(server.requests) == 2 + 2 * 2 + 2 * 3
    first, second = result["levels"]
    assert (first["concurrency"], first["max_concurrency"], first["num_prompts"]) == (1, 1, 2)
    assert (second["concurrency"], second["max_concurrency"], second["num_prompts"]) == (4, 4, 3)
    assert (first["warmup"]["requests"], second["warmup"]["requests"]) == (2, 0)
    assert [level["completed"] for level in result["levels"]] == [4, 6]
    assert first["level_started_at"] <= first["level_ended_at"] <= second["level_started_at"]
    assert (first["budget_s"], second["budget_s"], second["out_of_budget"]) == (None, 60.0, False)
    assert result["levels_not_run"] == []


def failing_after(requests: int) -> dict:
    """A /generate route that streams for the first ``requests`` requests, then answers 503."""
    served = {"count": 0}
    lock = threading.Lock()

    def route(request):
        with lock:
            served["count"] += 1
            healthy = served["count"] <= requests
        return stream_route(chunks(2)) if healthy else json_route({"detail": "busy"}, status=503)

    return callable_route(route)


def test_a_failed_level_ends_the_benchmark_and_the_heavier_levels_are_not_run(server):
    levels = [BenchLevel(1, 2), BenchLevel(2, 2), BenchLevel(4, 4)]
    server.routes["/generate"] = failing_after(2)
    stopping = BenchSettings(url=server.url, warmup_requests=0, stop_on_failure=True).validate()
    result = run_levels(stopping, levels, lambda: StreamingBenchClient(stopping.url))
    assert [level["concurrency"] for level in result["levels"]] == [1, 2]
    assert result["levels"][1]["failed_requests"] >= 1
    assert result["levels_not_run"] == [4]
    server.routes["/generate"] = failing_after(2)
    going_on = BenchSettings(url=server.url, warmup_requests=0).validate()
    everything = run_levels(going_on, levels, lambda: StreamingBenchClient(going_on.url))
    assert [level["concurrency"] for level in everything["levels"]] == [1, 2, 4]
    assert everything["levels_not_run"] == []


def test_each_level_is_in_the_progress_file_as_soon_as_it_ends(server, tmp_path):
    path = tmp_path / "state" / "bench" / "point.json"
    seen = []
    lock = threading.Lock()

    def generate(request):
        with lock:  # what a reader of the file finds when the second level's first request arrives
            if len(server.requests) > 2 and not seen:
                seen.append(json.loads(path.read_text()))
        return stream_route(chunks(2))

    server.routes["/generate"] = callable_route(generate)
    context = {"run_id": "r1", "note": "launched with --api-key sk-live-1"}
    progress = BenchProgress(str(path), context, [1, 2], secrets=["s3cret"])
    progress.start()
    assert json.loads(path.read_text())["levels"] == []
    settings = BenchSettings(url=server.url, num_prompts=2, warmup_requests=0).validate()
    result = run_levels(settings, [BenchLevel(1, 2), BenchLevel(2, 2)], lambda: StreamingBenchClient(settings.url),
                        progress=progress)  # fmt: skip
    (during,) = seen
    assert [level["concurrency"] for level in during["levels"]] == [1]
    assert during["running"]["concurrency"] == 2 and during["finished"] is False
    after = json.loads(path.read_text())
    assert [level["completed"] for level in after["levels"]] == [level["completed"] for level in result["levels"]]
    assert (after["running"], after["not_run"], after["finished"], after["planned"]) == (None, [], True, [1, 2])
    assert after["context"] == {"run_id": "r1", "note": "launched with --api-key ********"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not [name for name in os.listdir(path.parent) if name != "point.json"]  # no temporary file left


def test_a_level_ends_at_its_budget_and_the_heavier_levels_are_not_run(server):
    hangs = {"after": 2}

    def generate(request):
        hangs["after"] -= 1
        return stream_route(chunks(2)) if hangs["after"] >= 0 else hang_route()

    server.routes["/generate"] = callable_route(generate)
    settings = BenchSettings(url=server.url, warmup_requests=0, request_timeout=30, stop_on_failure=True).validate()
    began = time.monotonic()
    result = run_levels(
        settings, [BenchLevel(1, 2), BenchLevel(2, 2, budget_s=3.0), BenchLevel(4, 4)],
        lambda: StreamingBenchClient(settings.url),
    )  # fmt: skip
    assert time.monotonic() - began < 3.0 + SLOW_DAY_S  # the level's budget, not its requests' 30 s timeout
    cut = result["levels"][1]
    assert (cut["concurrency"], cut["out_of_budget"], cut["failed_requests"]) == (2, True, 2)
    assert "budget of 3 s ran out" in cut["errors"][0]["error"]
    assert result["levels"][0]["out_of_budget"] is False
    assert result["levels_not_run"] == [4]


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        ([], "levels: must list at least one level"),
        ("8", "levels: must list at least one level"),
        ([8], r"levels\[0\]: must be a mapping of concurrency, num_prompts, budget_s"),
        ([{"concurrency": 1, "waves": 3}], r"levels\[0\]: has unknown keys \['waves'\]; accepted: concurrency"),
        ([{"num_prompts": 4}], r"levels\[0\]\.concurrency: must be an integer >= 1, got None"),
        ([{"concurrency": 1}, {"concurrency": 0}], r"levels\[1\]\.concurrency: must be an integer >= 1, got 0"),
        ([{"concurrency": 2, "num_prompts": 0}], r"levels\[0\]\.num_prompts: must be an integer >= 1, got 0"),
        ([{"concurrency": 2, "budget_s": 0}], r"levels\[0\]\.budget_s: must be a number of seconds > 0, got 0"),
        ([{"concurrency": 2, "budget_s": "soon"}], r"levels\[0\]\.budget_s: must be a number of seconds > 0"),
        ([{"concurrency": 8}, {"concurrency": 8}], r"levels\[1\]\.concurrency: 8 is listed twice"),
    ],
)
def test_bad_levels_name_the_entry_and_what_is_accepted(levels, message):
    with pytest.raises(BenchInputError, match=message):
        parse_levels(levels, 32)


def test_a_progress_path_must_be_an_absolute_file_path():
    assert check_progress_path("/var/lib/llmops/sweep/bench/p.json") == "/var/lib/llmops/sweep/bench/p.json"
    for bad in ("bench/p.json", "/var/lib/llmops/", None):
        with pytest.raises(BenchInputError, match="progress_path: must be the absolute path of a file on the host"):
            check_progress_path(bad)


def test_each_level_names_its_engine_and_a_restart_reads_the_engine_again(monkeypatch):
    readings = iter([{"main_pid": 10, "forked_at": 1.0}, {"main_pid": 10, "forked_at": 1.0},
                     {"main_pid": 11, "forked_at": 9.0}, {"main_pid": 11, "forked_at": 9.0}])  # fmt: skip
    full = []

    def engine_times(run, unit, ready=True):
        full.append(ready)
        return dict(next(readings))

    monkeypatch.setattr(bench_levels, "engine_times", engine_times)
    monkeypatch.setattr(bench_levels, "journal_tail", lambda run, unit: ["Killed"])
    watch = EngineWatch(None, "sglang.service")
    first = watch.before()
    assert watch.restarted(first) is False
    assert watch.before() is first  # the same engine: no second full reading (no journal search)
    assert watch.restarted(first) is True
    assert watch.before() == {"main_pid": 11, "forked_at": 9.0}
    assert full == [True, False, False, True]
