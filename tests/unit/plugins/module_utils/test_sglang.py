"""SglangClient against a scripted local HTTP server: endpoints, alias fallback, streaming, timeouts, auth."""

from __future__ import annotations

import socket
import time

import pytest
from fake_sglang_server import (
    SLOW_DAY_S,
    FakeSglang,
    generation_chunks,
    hang_route,
    json_route,
    stream_route,
)

from ansible_collections.llmops.inference.plugins.module_utils.sglang import (
    GenerationResult,
    SglangClient,
    SglangError,
    SglangHTTPError,
    SglangTimeout,
    stream_text,
    validate_url,
)


@pytest.fixture
def server():
    fake = FakeSglang().start()
    yield fake
    fake.stop()


def client_for(server, **kwargs) -> SglangClient:
    return SglangClient(server.url, **kwargs)


def test_health_returns_the_status_code(server):
    assert client_for(server).health() == 200
    server.routes["/health"] = json_route({}, status=503)
    assert client_for(server).health() == 503


def test_ready_reads_the_ready_endpoint(server):
    client = client_for(server)
    assert client.ready() == ("/ready", 200)
    server.routes["/ready"] = json_route({}, status=503)
    assert client.ready() == ("/ready", 503)
    assert server.paths() == ["/ready", "/ready"], "/health (a generation in SGLang 0.5.23) is never asked"


def test_ready_falls_back_to_health_on_a_404_and_keeps_to_it(server):
    del server.routes["/ready"]
    client = client_for(server)
    assert client.ready() == ("/health", 200)
    server.routes["/health"] = json_route({}, status=503)
    assert client.ready() == ("/health", 503)
    assert server.paths() == ["/ready", "/health", "/health"]


def test_ready_does_not_fall_back_on_other_errors(server):
    server.routes["/ready"] = json_route({"detail": "internal"}, status=500)
    assert client_for(server).ready() == ("/ready", 500)
    assert server.paths() == ["/ready"]


def test_model_info_uses_the_current_endpoint_first(server):
    info = client_for(server).model_info()
    assert info["served_model_name"] == "Qwen/Qwen3-8B"
    assert server.paths() == ["/model_info"]


def test_model_info_falls_back_to_the_deprecated_alias_on_404(server):
    server.routes["/get_model_info"] = server.routes.pop("/model_info")
    info = client_for(server).model_info()
    assert info["model_path"] == "/models/Qwen/Qwen3-8B"
    assert server.paths() == ["/model_info", "/get_model_info"]


def test_model_info_does_not_fall_back_on_a_server_error(server):
    server.routes["/model_info"] = json_route({"error": "boom"}, status=500)
    with pytest.raises(SglangHTTPError) as raised:
        client_for(server).model_info()
    assert raised.value.status == 500
    assert str(raised.value) == '/model_info returned HTTP 500: {"error": "boom"}'
    assert server.paths() == ["/model_info"]


def test_server_info_falls_back_to_the_deprecated_alias(server):
    server.routes["/get_server_info"] = server.routes.pop("/server_info")
    assert client_for(server).server_info()["speculative_num_steps"] == 3


def test_model_ids_come_from_v1_models(server):
    assert client_for(server).model_ids() == ["Qwen/Qwen3-8B"]
    server.routes["/v1/models"] = json_route({"object": "list"})
    with pytest.raises(SglangError, match="without a 'data' list"):
        client_for(server).model_ids()


def test_non_json_answer_is_reported_with_a_snippet(server):
    server.routes["/model_info"] = json_route("<html>proxy error</html>")
    with pytest.raises(SglangError, match=r"/model_info did not return JSON: '<html>proxy error</html>'"):
        client_for(server).model_info()


def test_metrics_returns_the_text(server):
    assert "sglang:gen_throughput 42.0" in client_for(server).metrics()


def test_generate_streams_cumulative_text_and_measures_ttft(server):
    text = "2, 3, 5, 7, 11"
    server.routes["/generate"] = stream_route(
        generation_chunks(text, meta_info={"completion_tokens": 8, "spec_accept_length": 2.5}), gap=0.05
    )
    result = client_for(server).generate("primes?", max_new_tokens=8, timeout=5)
    assert result.text == text
    assert result.completion_tokens == 8
    assert result.accept_length == 2.5
    assert 0.04 <= result.ttft_s < result.latency_s
    assert result.chunks == 4
    request = server.requests[0]
    assert request["method"] == "POST"
    assert request["body"] == {
        "text": "primes?",
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 8},
        "stream": True,
    }


def test_generate_joins_incremental_stream_pieces(server):
    chunks = [{"text": "!", "meta_info": {"completion_tokens": n}} for n in range(1, 9)]
    server.routes["/generate"] = stream_route(chunks)
    assert client_for(server).generate("Hello", max_new_tokens=8, timeout=5).text == "!!!!!!!!"


def test_generate_without_stream(server):
    server.routes["/generate"] = json_route({"text": "Paris", "meta_info": {"completion_tokens": 2}})
    result = client_for(server).generate("capital?", max_new_tokens=4, timeout=5, stream=False)
    assert (result.text, result.completion_tokens, result.ttft_s) == ("Paris", 2, None)


def test_generate_error_chunk_raises(server):
    server.routes["/generate"] = stream_route([{"error": {"message": "prompt too long", "code": 400}}])
    with pytest.raises(SglangError, match="/generate reported an error: prompt too long"):
        client_for(server).generate("x", max_new_tokens=4, timeout=5)


def test_generate_stream_cut_before_done_raises(server):
    server.routes["/generate"] = stream_route(generation_chunks("partial answer"), done=False)
    with pytest.raises(SglangError, match=r"ended without 'data: \[DONE\]' after 4 chunks"):
        client_for(server).generate("x", max_new_tokens=4, timeout=5)


def test_generate_that_never_answers_times_out_on_time(server):
    server.routes["/generate"] = hang_route()
    started = time.monotonic()
    with pytest.raises(SglangTimeout, match=r"^no response from /generate within 0\.3 s$"):
        client_for(server).generate("x", max_new_tokens=4, timeout=0.3)
    assert time.monotonic() - started < 0.3 + SLOW_DAY_S


def test_generate_that_trickles_past_the_deadline_times_out(server):
    chunks = [{"text": "a" * n, "meta_info": {}} for n in range(1, 100)]
    server.routes["/generate"] = stream_route(chunks, gap=0.1)  # 10 s in all, each chunk well within the timeout
    started = time.monotonic()
    # 2 s: the first chunk arrives in time even on a loaded machine, and the stream still trickles past the deadline
    with pytest.raises(SglangTimeout, match=r"did not finish within 2\.0 s \(\d+ chunks, first after \d\.\d+ s\)"):
        client_for(server).generate("x", max_new_tokens=100, timeout=2.0)
    assert time.monotonic() - started < 2.0 + SLOW_DAY_S


def test_slow_json_endpoint_times_out(server):
    server.routes["/model_info"] = json_route({}, delay=2)
    with pytest.raises(SglangTimeout, match=r"no response from /model_info within 0\.2 s"):
        client_for(server, timeout=0.2).model_info()


def test_connection_refused_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SglangError, match=rf"cannot reach http://127.0.0.1:{port}/health: .*refused"):
        SglangClient(f"http://127.0.0.1:{port}").health()


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:30000", "ftp://host/", "http://", "http://host:99999", "http://host:port", "http://h/?a=1", ""],
)
def test_malformed_urls_are_refused_naming_url(url):
    with pytest.raises(ValueError, match=r"^url "):
        validate_url(url)


def test_valid_url_loses_its_trailing_slash():
    assert validate_url("https://gpu-7.example:30000/") == "https://gpu-7.example:30000"


def test_stream_text_tells_cumulative_from_incremental():
    assert stream_text(["2", "2, 3", "2, 3, 5"]) == "2, 3, 5"
    assert stream_text(["Hel", "lo", " world"]) == "Hello world"
    assert stream_text(["!", "!", "!"]) == "!!!"
    assert stream_text([]) == ""


def test_tokens_per_s_is_decode_rate_after_the_first_token():
    result = GenerationResult("x", {"completion_tokens": 11}, latency_s=1.2, ttft_s=0.2)
    assert result.tokens_per_s == pytest.approx(10.0)
    assert GenerationResult("x", {"completion_tokens": 1}, latency_s=0.5, ttft_s=0.5).tokens_per_s == 2.0
    assert GenerationResult("x", {}, latency_s=0.5).tokens_per_s is None
