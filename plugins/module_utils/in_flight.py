# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How many requests an SGLang engine has in flight, read from its /metrics: the one reading of it that the gateway
drain (on the host, under Ansible) and the unit's stop (on the host, outside Ansible) share.

Private to the llmops.inference collection; not a public API. Standard library only: the sglang_service role
installs it on the host beside gpu_gate.py, which systemd runs with the service's Python.

What is read, best first:

- ``sglang:http_requests_active{endpoint,method}`` (SGLang 0.5.23, ``srt/observability/http_request_metrics.py``,
  with ``--enable-metrics``): the HTTP layer counts a request from before its handler runs until the last byte of
  its response, a streamed body included, requests still in the tokenizer too. It is live. Summed over every
  endpoint but the probes' own (:data:`PROBE_ENDPOINTS`: ``/metrics``, ``/health*``, ``/ready``, ``/ping``), which
  would count the scrape itself and the health checks.
- where that gauge is missing (an SGLang older than the HTTP metrics, or a rank >= 1's dummy server), the
  scheduler's gauges ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``: published every
  ``decode_log_interval`` decode steps, without the batch just admitted and without requests still in the
  tokenizer. They say "busy" reliably, never "idle".
- neither (no ``--enable-metrics``): nothing; the caller says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

HTTP_REQUESTS_ACTIVE = "sglang:http_requests_active"
SCHEDULER_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
IN_FLIGHT_METRICS = (HTTP_REQUESTS_ACTIVE, *SCHEDULER_GAUGES)
# Endpoints of probes, not of requests to drain: the scrape of /metrics counts itself, health checks come and go.
PROBE_ENDPOINTS = ("/metrics", "/ready", "/ping")
PROBE_ENDPOINT_PREFIXES = ("/health", "/metrics/")
SOURCE_HTTP = "http_requests_active"
SOURCE_SCHEDULER = "scheduler gauges"

# One sample of the Prometheus text exposition: name, optional {labels}, value (a timestamp may follow).
METRIC_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')
METRIC_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
LABEL_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


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


def is_probe_endpoint(endpoint: str) -> bool:
    return endpoint in PROBE_ENDPOINTS or endpoint.startswith(PROBE_ENDPOINT_PREFIXES)


@dataclass(frozen=True)
class InFlight:
    """What /metrics says is in flight. ``source``: SOURCE_HTTP or SOURCE_SCHEDULER; ``requests``: the total the
    drain waits on (HTTP requests, or running plus queued); ``running`` and ``queued``: the scheduler's gauges where
    exported (None otherwise)."""

    source: str
    requests: int
    running: int | None = None
    queued: int | None = None

    @property
    def idle(self) -> bool:
        return self.requests == 0

    @property
    def live(self) -> bool:
        """True when the count is the HTTP layer's (live); False for the scheduler's lagging gauges."""
        return self.source == SOURCE_HTTP

    def describe(self) -> str:
        if self.live:
            return f"{self.requests} HTTP request(s) active ({HTTP_REQUESTS_ACTIVE})"
        return f"{self.running} running, {self.queued} queued (scheduler gauges; {HTTP_REQUESTS_ACTIVE} not exported)"


def _sum(samples: dict, name: str) -> int:
    return int(sum(value for _labels, value in samples.get(name) or ()))


def count_in_flight(samples: dict) -> InFlight | None:
    """The in-flight reading of ``samples`` (as :func:`parse_metrics` returns them); None when neither the HTTP gauge
    nor the scheduler's gauges are there."""
    scheduler = (_sum(samples, SCHEDULER_GAUGES[0]), _sum(samples, SCHEDULER_GAUGES[1]))
    has_scheduler = any(samples.get(name) for name in SCHEDULER_GAUGES)
    http = samples.get(HTTP_REQUESTS_ACTIVE)
    if http:
        active = sum(value for labels, value in http if not is_probe_endpoint(labels.get("endpoint", "")))
        running, queued = scheduler if has_scheduler else (None, None)
        return InFlight(SOURCE_HTTP, max(int(active), 0), running, queued)
    if has_scheduler:
        return InFlight(SOURCE_SCHEDULER, scheduler[0] + scheduler[1], scheduler[0], scheduler[1])
    return None


def in_flight_of_text(text: str) -> InFlight | None:
    return count_in_flight(parse_metrics(text, IN_FLIGHT_METRICS))
