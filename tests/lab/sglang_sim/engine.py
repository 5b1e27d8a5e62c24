"""Generation: the text, its timing (plain or speculative decoding) and SGLang's meta_info."""

from __future__ import annotations

import hashlib
import itertools
import math
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from . import faults, specmodel, textgen
from .metrics import FinishedRequest, Stats
from .spec_args import SpecConfig

DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_TEMPERATURE = 1.0
PREFIX_CACHE_ENTRIES = 4096
ABORT_MESSAGE = "The server is shutting down."


class GenerationError(Exception):
    """A request SGLang would refuse; carries the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class EngineConfig:
    token_latency_s: float
    prefill_s_per_token: float
    seed: int
    noise: float
    batch_slowdown: float
    context_length: int
    stream_interval: int
    incremental_streaming: bool
    spec: SpecConfig
    spec_params: specmodel.SpecParams | None
    faults: frozenset


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    stops: tuple


def parse_sampling(params: dict | None) -> Sampling:
    params = params or {}
    if not isinstance(params, dict):
        raise GenerationError("sampling_params must be a JSON object.")
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new is None:
        max_new = DEFAULT_MAX_NEW_TOKENS
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise GenerationError(f"max_new_tokens must be at least 0, got {max_new}.")
    temperature = params.get("temperature", DEFAULT_TEMPERATURE)
    if temperature is None:
        temperature = DEFAULT_TEMPERATURE
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise GenerationError(f"temperature must be a non-negative finite number, got {temperature}.")
    stop = params.get("stop") or ()
    stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop if isinstance(s, str) and s)
    return Sampling(max_new, float(temperature), stops)


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_tokens: int
    sampling: Sampling
    stream: bool
    rid: str


def new_request(
    prompt: str, prompt_tokens: int | None, sampling: Sampling, stream: bool, rid: str | None = None
) -> Request:
    tokens = textgen.count_tokens(prompt) if prompt_tokens is None else max(1, prompt_tokens)
    return Request(prompt, tokens, sampling, stream, rid or uuid.uuid4().hex)


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


class Engine:
    """Thread-safe; one call of generate() per request, each on its own HTTP thread."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.stats = Stats()
        self.abort = threading.Event()
        self._seen_prompts: OrderedDict = OrderedDict()
        self._seen_lock = threading.Lock()
        self.mean_accept_length = None
        if config.spec.enabled and config.spec_params is not None:
            spec = config.spec
            self.mean_accept_length = specmodel.accept_length(
                spec.num_steps, spec.eagle_topk, spec.num_draft_tokens, config.spec_params
            )
            self.step_cost = specmodel.step_cost(
                spec.num_steps, spec.eagle_topk, spec.num_draft_tokens, config.spec_params
            )

    @property
    def hangs(self) -> bool:
        return bool(self.config.faults & {faults.GENERATE_HANG, faults.NEVER_LOAD})

    def _cached_tokens(self, request: Request) -> int:
        key = hashlib.sha256(request.prompt.encode("utf-8", "replace")).digest()
        with self._seen_lock:
            seen = key in self._seen_prompts
            self._seen_prompts[key] = True
            self._seen_prompts.move_to_end(key)
            while len(self._seen_prompts) > PREFIX_CACHE_ENTRIES:
                self._seen_prompts.popitem(last=False)
        return request.prompt_tokens - 1 if seen else 0

    def _pieces(self, request: Request) -> tuple[list[str], dict]:
        count = request.sampling.max_new_tokens
        if faults.DEGENERATE in self.config.faults:
            return textgen.degenerate_pieces(count), {"type": "length", "length": count}
        key = textgen.generation_key(request.prompt, request.sampling.temperature, self.config.seed, request.rid)
        pieces = textgen.pieces(key, count)
        text = ""
        for index, piece in enumerate(pieces):
            text += piece
            for stop in request.sampling.stops:
                if stop in text:
                    return pieces[: index + 1], {"type": "stop", "matched": stop}
        return pieces, {"type": "length", "length": count}

    def _steps(self, request: Request, tokens: int) -> tuple[list[int], float, dict]:
        """Tokens emitted per decode step, the time of one step, and the speculative meta_info."""
        running = max(1, self.stats.running)
        slowdown = 1.0 + self.config.batch_slowdown * (running - 1)
        if self.mean_accept_length is None or tokens == 0:
            return [1] * tokens, self.config.token_latency_s * slowdown, {}
        draft_tokens = self.config.spec.num_draft_tokens
        accept = specmodel.noisy_accept_length(
            self.mean_accept_length, draft_tokens, self.config.noise, self.config.seed, request.rid
        )
        verify_ct = specmodel.verify_count(tokens, accept, draft_tokens)
        proposed = verify_ct * (draft_tokens - 1)
        correct = tokens - verify_ct
        spec_meta = {
            "spec_accept_rate": correct / proposed if proposed else 0.0,
            "spec_accept_length": tokens / verify_ct,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": verify_ct,
        }
        return _split(tokens, verify_ct), self.config.token_latency_s * self.step_cost * slowdown, spec_meta

    def _meta(self, request: Request, finish_reason, completion_tokens: int, cached: int) -> dict:
        return {
            "id": request.rid,
            "finish_reason": finish_reason,
            "prompt_tokens": request.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached,
        }

    def generate(self, request: Request, emit: Callable[[dict], None] | None = None) -> dict:
        """Run one request to its end; `emit` gets each streaming chunk. Returns the final output."""
        arrived = time.monotonic()
        self.stats.started()
        try:
            return self._generate(request, emit, arrived)
        finally:
            self.stats.stopped()

    def _hang(self, request: Request, cached: int, arrived: float) -> dict:
        self.abort.wait()
        meta = self._meta(request, {"type": "abort", "message": ABORT_MESSAGE}, 0, cached)
        meta["e2e_latency"] = time.monotonic() - arrived
        return {"text": "", "output_ids": [], "meta_info": meta}

    def validate(self, request: Request) -> None:
        """Raise GenerationError for a request SGLang refuses before generating (call before streaming starts)."""
        total = request.prompt_tokens + request.sampling.max_new_tokens
        if total > self.config.context_length:
            raise GenerationError(
                f"Requested token count exceeds the model's maximum context length of {self.config.context_length} "
                f"tokens. You requested a total of {total} tokens: {request.prompt_tokens} tokens from the input "
                f"messages and {request.sampling.max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )

    def _generate(self, request: Request, emit, arrived: float) -> dict:
        self.validate(request)
        cached = self._cached_tokens(request)
        if self.hangs:
            return self._hang(request, cached, arrived)
        pieces, finish_reason = self._pieces(request)
        per_step, step_s, spec_meta = self._steps(request, len(pieces))
        prefill_s = (request.prompt_tokens - cached) * self.config.prefill_s_per_token
        ends = list(itertools.accumulate(per_step))
        emitted = 0
        last_chunk_at = 0
        aborted = False
        first_token_at = arrived + prefill_s + (step_s if per_step else 0.0)
        for index, end in enumerate(ends):
            last = index == len(ends) - 1
            if emit is None and not last:
                continue
            if self.abort.wait(max(0.0, arrived + prefill_s + (index + 1) * step_s - time.monotonic())):
                aborted = True
                break
            emitted = end
            if emit is not None and not last and end - last_chunk_at >= self.config.stream_interval:
                emit(self._chunk(request, pieces, start=last_chunk_at, end=end, finish_reason=None, cached=cached))
                last_chunk_at = end
        if not ends:
            aborted = self.abort.wait(max(0.0, arrived + prefill_s - time.monotonic()))
        finished_at = time.monotonic()
        if aborted:
            finish_reason = {"type": "abort", "message": ABORT_MESSAGE}
            steps_done = int((finished_at - arrived - prefill_s) // step_s) if step_s > 0 else 0
            emitted = ends[min(steps_done, len(ends)) - 1] if steps_done > 0 and ends else 0
            spec_meta = {}
        final = self._chunk(
            request, pieces, start=last_chunk_at if emit else 0, end=emitted, finish_reason=finish_reason, cached=cached
        )
        final["meta_info"]["e2e_latency"] = finished_at - arrived
        final["meta_info"].update(spec_meta)
        self.stats.finished(
            FinishedRequest(
                streaming=request.stream,
                prompt_tokens=request.prompt_tokens,
                completion_tokens=emitted,
                first_token_at=min(first_token_at, finished_at),
                finished_at=finished_at,
                ttft=min(first_token_at, finished_at) - arrived,
                e2e=finished_at - arrived,
                verify_ct=spec_meta.get("spec_verify_ct", 0),
                correct_drafts=spec_meta.get("spec_num_correct_drafts", 0),
                proposed_drafts=spec_meta.get("spec_num_proposed_drafts", 0),
            )
        )
        return final

    def _chunk(self, request: Request, pieces: list, *, start: int, end: int, finish_reason, cached: int) -> dict:
        """An output dict; streamed chunks carry everything so far unless --incremental-streaming-output."""
        if request.stream and self.config.incremental_streaming:
            chosen = pieces[start:end]
        else:
            chosen = pieces[:end]
        return {
            "text": "".join(chosen),
            "output_ids": [textgen.token_id(p) for p in chosen],
            "meta_info": self._meta(request, finish_reason, end, cached),
        }
