"""A bounded load generator for zero-downtime tests: N concurrent streaming clients against one URL.

Standard library only, so it runs unchanged on a lab host (``python3 loadgen.py ...``) or on the controller.
Each client sends streamed requests one after another, a new connection each, until the duration is over or
the request budget is spent; the run always ends by itself. Every request is recorded: start and end (wall
clock), HTTP status, bytes, whether the stream ended with ``data: [DONE]``, and the completion tokens against
the expected count. A request counts as ok only with HTTP 200, ``[DONE]`` and every expected token: a stream
cut short is ``truncated``, anything else ``failed``.

Targets are limited to loopback and the lab's networks (10.213.0.0/16 unless ``--allow-network`` adds one).

    python3 loadgen.py --url http://10.213.0.2:30080 --concurrency 16 --duration 60 --out load.json
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import socket
import sys
import threading
import time
from urllib.parse import urlparse

LAB_NETWORKS = ("127.0.0.0/8", "::1/128", "10.213.0.0/16")
MAX_DURATION_S = 3600
MAX_REQUESTS = 1_000_000
ENDPOINTS = ("generate", "chat")
PROMPT = "Write one sentence about rolling restarts."
ERROR_CHARS = 200


class LoadError(ValueError):
    """A refused setting (the message names it)."""


def check_target(url: str, networks=LAB_NETWORKS) -> tuple:
    """(host, port) of ``url``; refuse anything that is not an http URL on an allowed network."""
    parsed = urlparse(url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise LoadError(f"--url must be an http://host:port URL, got {url!r}")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(parsed.hostname, parsed.port or 80)}
    except socket.gaierror as exc:
        raise LoadError(f"--url host {parsed.hostname!r} does not resolve: {exc}") from None
    allowed = [ipaddress.ip_network(network) for network in networks]
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if not any(ip.version == network.version and ip in network for network in allowed):
            raise LoadError(
                f"--url {url} resolves to {address}, outside the allowed networks {', '.join(networks)} "
                "(load tests target loopback or lab hosts only; --allow-network adds one)"
            )
    return parsed.hostname, parsed.port or 80


def percentile(values: list, share: float):
    """Linear-interpolation percentile (numpy's default) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * share
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class LoadSettings:
    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 16,
        duration: float | None = None,
        requests: int | None = None,
        max_new_tokens: int = 32,
        endpoint: str = "generate",
        model: str = "default",
        api_key: str | None = None,
        timeout: float = 60.0,
        networks=LAB_NETWORKS,
        stop_file: str | None = None,
    ):
        if concurrency < 1 or concurrency > 1024:
            raise LoadError(f"--concurrency must be from 1 to 1024, got {concurrency}")
        if duration is None and requests is None:
            raise LoadError("give --duration or --requests (or both): the run must end by itself")
        if duration is not None and not 0 < duration <= MAX_DURATION_S:
            raise LoadError(f"--duration must be more than 0 and at most {MAX_DURATION_S} s, got {duration:g}")
        if requests is not None and not 0 < requests <= MAX_REQUESTS:
            raise LoadError(f"--requests must be from 1 to {MAX_REQUESTS}, got {requests}")
        if max_new_tokens < 1:
            raise LoadError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
        if endpoint not in ENDPOINTS:
            raise LoadError(f"--endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        if timeout <= 0:
            raise LoadError(f"--timeout must be more than 0, got {timeout:g}")
        self.url = url.rstrip("/")
        self.host, self.port = check_target(self.url, networks)
        self.concurrency = concurrency
        self.duration = duration if duration is not None else float(MAX_DURATION_S)
        self.requests = requests if requests is not None else MAX_REQUESTS
        self.max_new_tokens = max_new_tokens
        self.endpoint = endpoint
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.stop_file = stop_file

    def request(self, number: int) -> tuple:
        """(path, body) of request ``number``; SGLang stops early only at a stop string, ignore_eos keeps lengths."""
        if self.endpoint == "generate":
            sampling = {"max_new_tokens": self.max_new_tokens, "temperature": 0, "ignore_eos": True}
            return "/generate", {"text": f"{PROMPT} ({number})", "sampling_params": sampling, "stream": True}
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"{PROMPT} ({number})"}],
            "max_tokens": self.max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return "/v1/chat/completions", body


def _completion_tokens(event: dict):
    """Completion tokens an event reports: /generate's meta_info, or an OpenAI chunk's usage."""
    meta = event.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("completion_tokens"), int):
        return meta["completion_tokens"]
    usage = event.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    return None


def one_request(settings: LoadSettings, number: int, client: int) -> dict:
    path, body = settings.request(number)
    record = {
        "id": number,
        "client": client,
        "start": time.time(),
        "end": None,
        "status": None,
        "bytes": 0,
        "chunks": 0,
        "done": False,
        "completion_tokens": None,
        "expected_tokens": settings.max_new_tokens,
        "ttft_s": None,
        "latency_s": None,
        "outcome": "failed",
        "error": None,
    }
    started = time.monotonic()
    connection = http.client.HTTPConnection(settings.host, settings.port, timeout=settings.timeout)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    try:
        connection.request("POST", path, body=json.dumps(body), headers=headers)
        response = connection.getresponse()
        record["status"] = response.status
        if response.status != 200:
            payload = response.read()
            record["bytes"] = len(payload)
            record["error"] = payload.decode("utf-8", "replace")[:ERROR_CHARS]
            return record
        while True:
            line = response.readline()
            if not line:
                break
            record["bytes"] += len(line)
            text = line.decode("utf-8", "replace").strip()
            if not text.startswith("data:"):
                continue
            data = text[len("data:") :].strip()
            if data == "[DONE]":
                record["done"] = True
                break
            if record["ttft_s"] is None:
                record["ttft_s"] = time.monotonic() - started
            record["chunks"] += 1
            try:
                event = json.loads(data)
            except ValueError:
                record["error"] = f"not JSON: {data[:ERROR_CHARS]}"
                continue
            if isinstance(event, dict) and event.get("error"):
                record["error"] = str(event["error"])[:ERROR_CHARS]
            tokens = _completion_tokens(event) if isinstance(event, dict) else None
            if tokens is not None:
                record["completion_tokens"] = tokens
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
    finally:
        connection.close()
        record["end"] = time.time()
        record["latency_s"] = time.monotonic() - started
    if record["status"] == 200:
        complete = record["done"] and record["error"] is None
        full = record["completion_tokens"] is not None and record["completion_tokens"] >= settings.max_new_tokens
        record["outcome"] = "ok" if complete and full else "truncated"
    return record


def run_load(settings: LoadSettings) -> dict:
    """Run the clients until the duration ends or the budget is spent; return the summary and every record."""
    lock = threading.Lock()
    records = []
    issued = [0]
    began = time.monotonic()
    stop_at = began + settings.duration

    def take_number():
        with lock:
            if issued[0] >= settings.requests or time.monotonic() >= stop_at:
                return None
            if settings.stop_file and os.path.exists(settings.stop_file):
                return None
            issued[0] += 1
            return issued[0]

    def client(index: int):
        while True:
            number = take_number()
            if number is None:
                return
            record = one_request(settings, number, index)
            with lock:
                records.append(record)

    threads = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(settings.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        # A request already running when the duration ends is bounded by its own timeout.
        thread.join(timeout=settings.duration + settings.timeout + 30)
    wall = time.monotonic() - began
    records.sort(key=lambda record: record["id"])
    return {"summary": summarize(records, settings, wall), "records": records}


def summarize(records: list, settings: LoadSettings, wall_s: float) -> dict:
    ok = [record for record in records if record["outcome"] == "ok"]
    latencies = [record["latency_s"] for record in ok]
    ttfts = [record["ttft_s"] for record in ok if record["ttft_s"] is not None]
    statuses = {}
    for record in records:
        key = str(record["status"]) if record["status"] is not None else "no answer"
        statuses[key] = statuses.get(key, 0) + 1
    errors = {}
    for record in records:
        if record["outcome"] != "ok":
            reason = record["error"] or ("no [DONE]" if not record["done"] else "short stream")
            errors[reason] = errors.get(reason, 0) + 1
    return {
        "url": settings.url,
        "endpoint": settings.endpoint,
        "concurrency": settings.concurrency,
        "requests": len(records),
        "ok": len(ok),
        "failed": sum(1 for record in records if record["outcome"] == "failed"),
        "truncated": sum(1 for record in records if record["outcome"] == "truncated"),
        "statuses": statuses,
        "errors": [{"error": error, "count": count} for error, count in sorted(errors.items(), key=lambda e: -e[1])][
            :10
        ],
        "wall_s": round(wall_s, 3),
        "started": min((record["start"] for record in records), default=None),
        "ended": max((record["end"] for record in records), default=None),
        "latency_s": {
            name: (round(value, 4) if value is not None else None)
            for name, value in (
                ("p50", percentile(latencies, 0.5)),
                ("p90", percentile(latencies, 0.9)),
                ("p99", percentile(latencies, 0.99)),
                ("max", max(latencies) if latencies else None),
            )
        },
        "ttft_s": {
            "p50": round(percentile(ttfts, 0.5), 4) if ttfts else None,
            "p99": round(percentile(ttfts, 0.99), 4) if ttfts else None,
        },
        "requests_per_s": round(len(records) / wall_s, 3) if wall_s > 0 else None,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="base URL of the gateway or engine (loopback or lab address)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, help="seconds to keep sending (at most 3600)")
    parser.add_argument("--requests", type=int, help="requests to send in all")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens each stream must deliver")
    parser.add_argument("--endpoint", choices=ENDPOINTS, default="generate")
    parser.add_argument("--model", default="default", help="model name for --endpoint chat")
    parser.add_argument("--api-key-file", help="file holding the bearer key (not given on the command line)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one request may take")
    parser.add_argument("--allow-network", action="append", default=[], help="another allowed CIDR (repeatable)")
    parser.add_argument("--out", help="write the summary and every record to this JSON file")
    parser.add_argument("--ready-file", help="write the start time to this file when the run starts")
    parser.add_argument("--stop-file", help="send no new request once this file exists (the run then ends early)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        api_key = None
        if args.api_key_file:
            with open(args.api_key_file, encoding="utf-8") as key_file:
                api_key = key_file.read().strip() or None
        settings = LoadSettings(
            args.url,
            concurrency=args.concurrency,
            duration=args.duration,
            requests=args.requests,
            max_new_tokens=args.max_new_tokens,
            endpoint=args.endpoint,
            model=args.model,
            api_key=api_key,
            timeout=args.timeout,
            networks=(*LAB_NETWORKS, *args.allow_network),
            stop_file=args.stop_file,
        )
    except (LoadError, OSError, ValueError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    if args.ready_file:
        with open(args.ready_file, "w", encoding="utf-8") as ready:
            ready.write(f"{time.time()}\n")
    result = run_load(settings)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump(result, out)
    print(json.dumps(result["summary"]))
    summary = result["summary"]
    return 0 if summary["failed"] == 0 and summary["truncated"] == 0 and summary["requests"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
