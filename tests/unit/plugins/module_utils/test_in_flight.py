"""in_flight: one reading of what an SGLang engine has in flight, for the gateway drain and the unit's stop."""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.in_flight import (
    SOURCE_HTTP,
    SOURCE_SCHEDULER,
    InFlight,
    count_in_flight,
    in_flight_of_text,
    is_probe_endpoint,
    parse_metrics,
)

# What SGLang 0.5.23 exports with --enable-metrics while one stream runs, a scrape is answered and a health check
# is under way (observability/http_request_metrics.py: labels endpoint and method, livesum across processes).
BUSY = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.0
# HELP sglang:http_requests_active Number of currently active HTTP requests
# TYPE sglang:http_requests_active gauge
sglang:http_requests_active{endpoint="/generate",method="POST"} 2.0
sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST"} 1.0
sglang:http_requests_active{endpoint="/metrics",method="GET"} 1.0
sglang:http_requests_active{endpoint="/health",method="GET"} 1.0
sglang:http_requests_active{endpoint="/health_generate",method="GET"} 1.0
sglang:http_requests_active{endpoint="/ready",method="GET"} 1.0
sglang:http_requests_active{endpoint="/ping",method="GET"} 1.0
sglang:http_requests_active{endpoint="/v1/models/{model:path}",method="GET"} 0.0
"""


def test_http_requests_active_is_summed_over_every_endpoint_but_the_probes():
    """The scheduler's gauges read 0 here (requests still in the tokenizer, or admitted since the last publication);
    the HTTP gauge counts the three requests and leaves out the scrape and the health checks."""
    assert in_flight_of_text(BUSY) == InFlight(SOURCE_HTTP, 3, 0, 0)
    assert not in_flight_of_text(BUSY).idle


def test_an_idle_engine_reads_idle_although_its_own_scrape_is_active():
    idle = "\n".join(
        [
            'sglang:http_requests_active{endpoint="/generate",method="POST"} 0.0',
            'sglang:http_requests_active{endpoint="/metrics",method="GET"} 1.0',
        ]
    )
    reading = in_flight_of_text(idle)
    assert reading == InFlight(SOURCE_HTTP, 0, None, None)
    assert reading.idle and reading.live
    assert reading.describe() == "0 HTTP request(s) active (sglang:http_requests_active)"


def test_without_the_http_gauge_the_scheduler_gauges_are_the_documented_fallback():
    text = "\n".join(
        [
            'sglang:num_running_reqs{tp_rank="0"} 2.0',
            'sglang:num_running_reqs{tp_rank="1"} 2.0',
            'sglang:num_queue_reqs{tp_rank="0"} 1.0',
        ]
    )
    reading = in_flight_of_text(text)
    assert reading == InFlight(SOURCE_SCHEDULER, 5, 4, 1)
    assert not reading.live
    assert reading.describe() == "4 running, 1 queued (scheduler gauges; sglang:http_requests_active not exported)"


def test_no_figure_at_all_is_none():
    assert in_flight_of_text("sglang:gen_throughput 3.0\n") is None
    assert count_in_flight({}) is None


def test_probe_endpoints():
    for endpoint in ("/metrics", "/metrics/", "/health", "/health_generate", "/ready", "/ping"):
        assert is_probe_endpoint(endpoint), endpoint
    for endpoint in ("/generate", "/v1/completions", "/healthcheck-not-a-probe/../generate", "/readyz"):
        assert is_probe_endpoint(endpoint) == endpoint.startswith("/health"), endpoint


def test_parse_metrics_unescapes_labels_and_drops_nan():
    text = 'x{a="q\\"u\\\\o\\nte"} 1\ny 2 1700000000\nz NaN\n# comment\n'
    assert parse_metrics(text) == {"x": [({"a": 'q"u\\o\nte'}, 1.0)], "y": [({}, 2.0)]}
