"""gateway_client.py: worker and gateway URLs as the gateways are told them, and one replica's dialect, detected
once, against fake gateways over real HTTP."""

from __future__ import annotations

import pytest
from fake_gateway import started_gateways

from ansible_collections.llmops.inference.plugins.module_utils.gateway_client import (
    DIALECT_LEGACY,
    DIALECT_SMG,
    GatewayClient,
    GatewayError,
    normalize_url,
)


@pytest.fixture
def gateways():
    with started_gateways() as make:
        yield make


# -- URLs -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://10.0.0.5:30000", "http://10.0.0.5:30000"),
        ("HTTP://Worker-1.Example:30000/", "http://worker-1.example:30000"),
        ("https://[FD00::5]:8443", "https://[fd00::5]:8443"),
        ("http://gpu7", "http://gpu7"),
    ],
)
def test_worker_urls_are_normalized(given, expected):
    assert normalize_url(given, "worker_url") == expected


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("", "must be a URL"),
        ("10.0.0.5:30000", "absolute http:// or https:// URL"),
        ("ftp://10.0.0.5", "absolute http:// or https:// URL"),
        ("http://10.0.0.5:99999", "invalid port"),
        ("http://10.0.0.5:30000/v1", "without a path"),
        ("http://10.0.0.5:30000?x=1", "without a path"),
        ("http://10.0.0.5:30000\nExecStart=/bin/sh", "control characters"),
        ("http://10.0.0.5 :30000", "spaces"),
    ],
)
def test_malformed_worker_urls_are_refused_naming_the_option(given, words):
    with pytest.raises(ValueError) as raised:
        normalize_url(given, "worker_url")
    assert "worker_url" in str(raised.value)
    assert words in str(raised.value)


# -- detection --------------------------------------------------------------------------------------------------------
def test_dialect_is_detected_once_per_gateway(gateways):
    smg, legacy = gateways("smg"), gateways("legacy")
    assert GatewayClient(smg.url).detect() == DIALECT_SMG
    smg.requests.clear()
    client = GatewayClient(legacy.url)
    assert client.detect() == DIALECT_LEGACY
    client.workers()
    client.workers()
    # The listing read while detecting serves the first workers() call.
    assert [request[1] for request in legacy.requests] == ["/workers", "/list_workers", "/list_workers"]
    smg_client = GatewayClient(smg.url)
    smg_client.detect()
    smg_client.workers()
    smg_client.workers()
    assert [request[1] for request in smg.requests] == ["/workers", "/workers"]


def test_a_server_that_is_not_a_gateway_is_named(gateways):
    other = gateways("other")
    with pytest.raises(GatewayError) as raised:
        GatewayClient(other.url).detect()
    assert str(raised.value).startswith(f"gateway {other.url}: answers neither smg's GET /workers (HTTP 404)")
