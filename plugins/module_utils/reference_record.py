# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Measuring an engine for its reference: golden outputs, their teacher-forced scores, a performance fingerprint.

Private to the llmops.inference collection; not a public API. Standard library plus the collection's clients.

Everything goes through SGLang's own /generate (0.5.23, ``managers/io_struct.py`` GenerateReqInput):

- golden outputs: each prompt greedy (temperature 0), ``max_new_tokens`` tokens, ``return_logprob`` with
  ``logprob_start_len`` 0, so ``meta_info.input_token_logprobs`` gives the prompt's token ids and
  ``output_token_logprobs`` each output token's (logprob, id, text);
- scoring: the prompt's ids plus the golden continuation as ``input_ids``, ``max_new_tokens`` 0 (prefill only;
  1 when speculation is on, which serves no prefill-only request), ``logprob_start_len`` = prompt length - 1:
  the input logprobs from the second entry on are the continuation's, teacher-forced (the first is None);
- the fingerprint: streamed requests (sglang_bench's load generator) at each concurrency, ``repeats`` times:
  output tok/s per level, and at the lowest level the TTFT and ITL medians and the accept length.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.bench import (
    StreamingBenchClient,
    compute_metrics,
    percentile,
    run_requests,
)
from ansible_collections.llmops.inference.plugins.module_utils.bench_prompts import builtin_prompts
from ansible_collections.llmops.inference.plugins.module_utils.http_client import decode_json


class ReferenceMeasureError(Exception):
    """The engine did not answer a reference request as SGLang does."""


def post_generate(client, payload: dict, timeout: float) -> dict:
    response = client._request("/generate", payload, timeout=timeout)
    try:
        answer = decode_json(client._read_body(response, "/generate", timeout))
    except ValueError as exc:
        raise ReferenceMeasureError(f"/generate did not return JSON: {exc}") from None
    finally:
        response.close()
    if isinstance(answer, list) and answer:
        answer = answer[0]
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
        raise ReferenceMeasureError(f"/generate returned no meta_info: {str(answer)[:200]!r}")
    return answer


def _triples(meta: dict, key: str) -> list:
    entries = meta.get(key)
    if not isinstance(entries, list):
        raise ReferenceMeasureError(
            f"/generate answered without meta_info.{key}: the server does not return logprobs (return_logprob)"
        )
    return entries


def golden(client, prompt: str, max_new_tokens: int, timeout: float) -> dict:
    """One golden output: the prompt's ids, the greedy output ids and their logprobs."""
    answer = post_generate(
        client,
        {
            "text": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
        timeout,
    )
    meta = answer["meta_info"]
    outputs = _triples(meta, "output_token_logprobs")
    return {
        "prompt": prompt,
        "prompt_ids": [entry[1] for entry in _triples(meta, "input_token_logprobs")],
        "output_ids": [entry[1] for entry in outputs],
        "logprobs": [entry[0] for entry in outputs],
        "text": answer.get("text") or "",
    }


def score(client, entry: dict, speculative: bool, timeout: float) -> dict:
    """The golden continuation's teacher-forced logprobs now, and the free-running greedy output ids now."""
    prompt_ids, output_ids = entry["prompt_ids"], entry["output_ids"]
    answer = post_generate(
        client,
        {
            "input_ids": prompt_ids + output_ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": 1 if speculative else 0},
            "return_logprob": True,
            "logprob_start_len": len(prompt_ids) - 1,
        },
        timeout,
    )
    forced = [item[0] for item in _triples(answer["meta_info"], "input_token_logprobs")[1:]]
    free = post_generate(
        client,
        {"input_ids": prompt_ids, "sampling_params": {"temperature": 0, "max_new_tokens": len(output_ids)}},
        timeout,
    )
    return {"teacher_forced": forced, "output_ids": list(free.get("output_ids") or [])}


def spread(samples: list) -> dict:
    values = [value for value in samples if value is not None]
    if not values:
        return {"median": None, "low": None, "high": None, "samples": samples}
    return {"median": percentile(values, 50), "low": min(values), "high": max(values), "samples": values}


def _sender(pool: list, client_factory, options: dict):
    """A request sender that takes an idle client from ``pool`` (a new one when none is idle) and gives it back."""

    def send(prompt: str):
        client = pool.pop() if pool else client_factory()
        try:
            return client.timed_generate(prompt, options["perf_max_new_tokens"], options["timeout"])
        finally:
            pool.append(client)

    return send


def fingerprint(client_factory, options: dict, speculative: bool) -> dict:
    """tok/s per concurrency, TTFT and ITL medians (and the accept length) at the lowest one; each over repeats."""
    samples: dict = {}
    lowest = options["concurrency"][0]
    for level in options["concurrency"]:
        prompts = builtin_prompts(level * options["requests_per_user"])
        clients = [client_factory() for _index in range(level)]
        for client in clients[1:]:
            client.prepare(clients[0])
        send = _sender(list(clients), client_factory, options)
        send(prompts[0])  # a warm-up the figures leave out
        for _repeat in range(options["repeats"]):
            results, duration = run_requests(send, prompts, level)
            metrics = compute_metrics(results, duration)
            if metrics["failed_requests"]:
                raise ReferenceMeasureError(
                    f"{metrics['failed_requests']} of {len(results)} requests at concurrency {level} failed: "
                    f"{metrics['errors'][0]['error'] if metrics['errors'] else 'unknown error'}"
                )
            samples.setdefault(f"tok_s_c{level}", []).append(metrics["output_throughput"])
            if level == lowest:
                samples.setdefault("ttft_ms", []).append(metrics["median_ttft_ms"])
                samples.setdefault("itl_ms", []).append(metrics["median_itl_ms"])
                if speculative:
                    samples.setdefault("accept_length", []).append(metrics["accept_length"])
    return {name: spread(values) for name, values in samples.items()}


def measurement_settings(options: dict) -> dict:
    keys = ("prompts", "max_new_tokens", "concurrency", "requests_per_user", "repeats", "perf_max_new_tokens")
    return {key: options[key] for key in keys}


def new_client(url: str, api_key, validate_certs: bool, timeout: float):
    return StreamingBenchClient(url, api_key=api_key, timeout=timeout, validate_certs=validate_certs)


class ReferenceEngine:
    """One engine measured for its reference (over HTTP, with the chain's URL and key)."""

    def __init__(self, url: str, api_key, validate_certs: bool, options: dict):
        self.options = options
        self._factory = lambda: new_client(url, api_key, validate_certs, options["timeout"])

    def client(self):
        return self._factory()

    def record(self, speculative: bool) -> dict:
        client = self._factory()
        options = self.options
        golden_outputs = [
            golden(client, prompt, options["max_new_tokens"], options["timeout"]) for prompt in options["prompts"]
        ]
        return {"golden": golden_outputs, "fingerprint": fingerprint(self._factory, options, speculative)}

    def observe(self, golden_outputs: list, speculative: bool, performance: bool = True) -> dict:
        client = self._factory()
        scores = [score(client, entry, speculative, self.options["timeout"]) for entry in golden_outputs]
        figures = fingerprint(self._factory, self.options, speculative) if performance else {}
        return {"scores": scores, "fingerprint": figures}
