"""Generation: the scheduler's batch (running and waiting requests), each request's text and timing (plain or
speculative decoding, slower as the batch grows), SGLang's meta_info, and the faults that stop progress.

Timing: a request waits for a running slot (--max-running-requests), pays its prefill, then decodes one step
after another; a step takes --sim-token-latency-ms times the cost at the current batch size (specmodel), so
every request slows down while others run and speeds up when they finish. Requests sleep on one condition
variable that wakes them when the batch changes.

With --speculative-adaptive the steps come from the slot the running batch routes to (adaptive.py): every verify
step feeds that slot the batch's mean accepted drafts, a slot's switch wakes every request, and a request's pace is
the step cost over the accept length of the steps in force.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

from . import adaptive as adaptive_mod
from . import faults, lm, specmodel, textgen
from .metrics import FinishedRequest, Stats
from .spec_args import SpecConfig

DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_TEMPERATURE = 1.0
PREFIX_CACHE_ENTRIES = 4096
# TokenizerManager polls a waiting client every SGLANG_REQUEST_STATE_WAIT_TIMEOUT (4 s) for a disconnect.
CLIENT_POLL_S = 4.0
# How often a decoding request looks at the adaptive slots between batch changes (the scheduler switches steps
# between verify steps; the sim applies a switch to the requests' pace at this granularity).
ADAPTIVE_TICK_S = 0.05


class ClientGone(Exception):
    """The client disconnected while its request waited.

    `kept`: the stuck scheduler never acknowledges the abort, so the request stays in rid_to_state.
    """

    def __init__(self, kept: bool):
        super().__init__("client disconnected")
        self.kept = kept


class _AbortedWaiting(Exception):
    """The request was aborted while in the scheduler's waiting queue."""


# FINISH_ABORT().to_json() (managers/schedule_batch.py), what the scheduler's abort_request gives a request.
ABORT_FINISH_REASON = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


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
    max_running_requests: int
    context_length: int
    stream_interval: int
    incremental_streaming: bool
    spec: SpecConfig
    spec_params: specmodel.SpecParams | None
    faults: dict
    decode_log_interval: int = 40
    adaptive: adaptive_mod.AdaptiveParams | None = None
    model: str = ""  # the model's path: what the greedy tokens are a function of, with the ids and the numerics


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
    warmup: bool = False
    input_ids: tuple = ()
    logprobs: Logprobs | None = None


@dataclass(frozen=True)
class Logprobs:
    """return_logprob and its companions (io_struct.py GenerateReqInput; -1: SGLang's default start)."""

    start: int = -1
    return_text: bool = False


def new_request(
    prompt: str,
    prompt_tokens: int | None,
    sampling: Sampling,
    stream: bool,
    rid: str | None = None,
    warmup: bool = False,
    input_ids: list | None = None,
    logprobs: Logprobs | None = None,
) -> Request:
    ids = tuple(input_ids) if input_ids else tuple(lm.tokenize(prompt))
    tokens = textgen.count_tokens(prompt) if prompt_tokens is None else max(1, prompt_tokens)
    return Request(prompt, tokens, sampling, stream, rid or uuid.uuid4().hex, warmup, ids, logprobs)


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


NORMAL, STUCK, STALLED = "normal", "stuck", "stalled"


class Engine:
    """Thread-safe; one call of generate() per request, each on its own HTTP thread."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.stats = Stats()
        self._cond = threading.Condition()
        self._running = 0
        self._waiting: deque = deque()
        self._served = 0  # user generations admitted (the warm-up and health checks are not counted)
        self.mode = NORMAL
        self._frozen: tuple | None = None  # scheduler gauges when the scheduler got stuck
        # What the scheduler last published to its gauges, and its decode-step counter (forward_ct_decode): the
        # gauges are not live (see gauges()).
        self._published = (0, 0)
        self._decoding = 0  # requests past their prefill: the running batch the scheduler reports
        self._decode_ct = 0.0
        self._decode_ct_at = time.monotonic()
        # sglang:realtime_tokens_total by mode: prefill tokens at each prefill, the batch's tokens at every decode step.
        self._realtime = {"prefill_compute": 0.0, "prefill_cache": 0.0, "decode": 0.0}
        self.last_receive_wall = time.time()  # TokenizerManager.last_receive_tstamp (for the health log)
        self._seen_prompts: OrderedDict = OrderedDict()
        self._seen_lock = threading.Lock()
        self._live: dict[int, Request] = {}  # id(request) -> request, from admission until its output
        self._aborted: set[int] = set()
        self.mean_accept_length = None
        if config.spec.enabled and config.spec_params is not None:
            spec = config.spec
            self.mean_accept_length = specmodel.accept_length(
                spec.num_steps, spec.eagle_topk, spec.num_draft_tokens, config.spec_params
            )
        self._adaptive_rng = random.Random(f"{config.seed}:adaptive")
        self._adaptive_carry = 0.0  # seconds into the verify step under way
        drift = config.faults.get(faults.OUTPUT_DRIFT) if faults.OUTPUT_DRIFT in config.faults else None
        self.lm = lm.LanguageModel(config.model, drift)
        if faults.NEVER_LOAD in config.faults:
            self.mode = STUCK
            self._frozen = (0, 0, 0.0)

    # -- the scheduler's state, as /metrics and the health check see it ------------------------------------------
    def gauges(self) -> tuple[int, int, float]:
        """(num_running_reqs, num_queue_reqs, gen_throughput) as the scheduler last published them.

        As SGLang 0.5.23's SchedulerMetricsReporter: at a prefill, the running batch without the requests just
        admitted and the waiting queue; every ``decode_log_interval`` decode steps of the batch, the batch and the
        queue; when the scheduler goes idle, (0, 0). In between they hold. Frozen while the scheduler is stuck.
        """
        with self._cond:
            if self._frozen is not None:
                return self._frozen
            self._count_decode_steps()
            return self._published[0], self._published[1], self.stats.gen_throughput()

    def _count_decode_steps(self) -> None:
        """Advance forward_ct_decode to now (lock held; call before the batch changes) and publish at each
        multiple of decode_log_interval. Between batch changes the batch and its step time are constant."""
        now = time.monotonic()
        elapsed, self._decode_ct_at = now - self._decode_ct_at, now
        if self._decoding <= 0 or self.mode == STUCK:  # a stalled loop keeps stepping without progress
            return
        before = int(self._decode_ct)
        if self.config.adaptive is not None and self.mode == NORMAL:
            self._decode_ct = self._adaptive_steps(elapsed)
        else:
            step_s = self.config.token_latency_s * self._step_cost(self._running)
            steps = elapsed / step_s if step_s > 0 else 1.0
            self._decode_ct = self._decode_ct + steps
            if self.mode == NORMAL:  # a stalled batch steps without generating
                self._realtime["decode"] += steps * self._decoding * (self.mean_accept_length or 1.0)
        interval = max(1, self.config.decode_log_interval)
        if int(self._decode_ct) // interval > before // interval:
            self._published = (self._decoding, len(self._waiting))

    def _adaptive_steps(self, elapsed: float) -> float:
        """Run the verify steps that fit in `elapsed` (lock held), each at the steps its batch routes to, feeding the
        slot the batch's mean accepted drafts (on_verify_complete); returns forward_ct_decode."""
        adaptive = self.config.adaptive
        running = max(self._running, 1)
        carry = self._adaptive_carry + elapsed
        whole = int(self._decode_ct)
        while True:
            steps = adaptive.steps_for_batch(running)
            step_s = self.config.token_latency_s * self._cost_at(steps, running)
            if step_s <= 0 or carry < step_s:
                break
            carry -= step_s
            whole += 1
            accept = self._accept_at(steps)
            self._realtime["decode"] += self._decoding * accept
            spread = self.config.noise * accept / math.sqrt(max(self._decoding, 1))
            correct = max(0.0, accept - 1.0 + spread * self._adaptive_rng.gauss(0.0, 1.0)) if steps > 0 else 0.0
            if adaptive.on_verify_complete(correct, running) is not None:
                self._cond.notify_all()  # every request's pace changes with the steps
        self._adaptive_carry = carry
        return whole + (carry / step_s if step_s > 0 else 0.0)

    def _cost_at(self, steps: int, running: int) -> float:
        return specmodel.step_cost(steps, 1, steps + 1, self.config.spec_params, running, self.config.batch_slowdown)

    def _accept_at(self, steps: int) -> float:
        return specmodel.accept_length(steps, 1, steps + 1, self.config.spec_params)

    def realtime_tokens(self) -> dict:
        """sglang:realtime_tokens_total by mode, as the scheduler counts them (metrics_reporter.py: every prefill
        batch and every decode step); frozen while the scheduler is stuck. Each running request counts the mean
        accept length of a speculative step, one token of a plain one."""
        with self._cond:
            self._count_decode_steps()
            return {mode: int(count) for mode, count in self._realtime.items()}

    def health_ack_at(self) -> float | None:
        """When a health check sent now gets its answer from the scheduler (monotonic time), or None: never.

        Idle: it runs as a one-token generation. Busy: it is skipped and answered after the next batch
        (scheduler.py: "Skip health check when server is busy"). Stalled: the idle loop answers it.
        Stuck in a forward pass: no answer.
        """
        with self._cond:
            if self.mode == STUCK:
                return None
            running = max(self._running, 1)
        step = self.config.token_latency_s * specmodel.plain_step_cost(running, self.config.batch_slowdown)
        return time.monotonic() + self.config.prefill_s_per_token + step

    def note_receive(self) -> None:
        self.last_receive_wall = time.time()

    @property
    def stuck(self) -> bool:
        return self.mode == STUCK

    def wait_scheduler(self, client_gone) -> None:
        """A request that needs the scheduler's answer (/server_info, /flush_cache): it never comes while stuck."""
        if self.mode == STUCK:
            self._never(client_gone, kept=False)

    def stop(self) -> None:
        """The schedulers are gone (ShutdownReq or killed): nothing runs any more."""
        with self._cond:
            if self.mode != STUCK:
                self._frozen = (self._running, len(self._waiting), self.stats.gen_throughput())
            self.mode = STUCK
            self._cond.notify_all()

    def _fault_mode_for_next(self, request: Request) -> str:
        """Counts a user generation and says how the scheduler treats it (called with the lock held)."""
        if request.warmup:
            return self.mode
        self._served += 1
        hang_after = self.config.faults.get(faults.HANG_AFTER_REQUESTS)
        if faults.GENERATE_HANG in self.config.faults:
            hang_after = 0
        if self.mode == NORMAL and hang_after is not None and self._served > hang_after:
            return STUCK
        stall_after = self.config.faults.get(faults.PROGRESS_STALL, None)
        if self.mode == NORMAL and faults.PROGRESS_STALL in self.config.faults and self._served > stall_after:
            return STALLED
        return self.mode

    # -- one request ------------------------------------------------------------------------------------------
    def _cached_tokens(self, request: Request) -> int:
        key = hashlib.sha256(request.prompt.encode("utf-8", "replace")).digest()
        with self._seen_lock:
            seen = key in self._seen_prompts
            self._seen_prompts[key] = True
            self._seen_prompts.move_to_end(key)
            while len(self._seen_prompts) > PREFIX_CACHE_ENTRIES:
                self._seen_prompts.popitem(last=False)
        return request.prompt_tokens - 1 if seen else 0

    def _pieces(self, request: Request) -> tuple[list[str], dict, list]:
        """The output's pieces, its finish reason, and each output token's logprob."""
        count = request.sampling.max_new_tokens
        if faults.DEGENERATE in self.config.faults:
            return textgen.degenerate_pieces(count), {"type": "length", "length": count}, [-0.01] * count
        salt = ""
        if request.sampling.temperature > 0.0:
            salt = textgen.generation_key(request.prompt, request.sampling.temperature, self.config.seed, request.rid)
        steps = lm.generate(self.lm, list(request.input_ids), count, salt)
        pieces = [step.piece for step in steps]
        logprobs = [step.logprob for step in steps]
        text = ""
        for index, piece in enumerate(pieces):
            text += piece
            for stop in request.sampling.stops:
                if stop in text:
                    return pieces[: index + 1], {"type": "stop", "matched": stop}, logprobs[: index + 1]
        return pieces, {"type": "length", "length": count}, logprobs

    def _step_cost(self, running: int) -> float:
        spec = self.config.spec
        if self.config.adaptive is not None:
            return self._cost_at(self.config.adaptive.steps_for_batch(max(running, 1)), running)
        if self.mean_accept_length is None:
            return specmodel.plain_step_cost(running, self.config.batch_slowdown)
        return specmodel.step_cost(
            spec.num_steps,
            spec.eagle_topk,
            spec.num_draft_tokens,
            self.config.spec_params,
            running,
            self.config.batch_slowdown,
        )

    def _pace(self, running: int) -> float:
        """Seconds per unit of a request's plan: a decode step, or with adaptive steps one token (the step over the
        accept length of the steps in force)."""
        if self.config.adaptive is None:
            return self.config.token_latency_s * self._step_cost(running)
        steps = self.config.adaptive.steps_for_batch(max(running, 1))
        return self.config.token_latency_s * self._cost_at(steps, running) / self._accept_at(steps)

    def _plan(self, request: Request, tokens: int) -> tuple[list[int], dict]:
        """Tokens emitted per decode step, and the speculative meta_info."""
        # With adaptive steps the steps change under the request: one token per unit, spec_meta at its end.
        if self.config.adaptive is not None or self.mean_accept_length is None or tokens == 0:
            return [1] * tokens, {}
        spec_meta = self._spec_meta(request, tokens, self.mean_accept_length, self.config.spec.num_draft_tokens)
        return _split(tokens, spec_meta["spec_verify_ct"]), spec_meta

    def _adaptive_meta(self, request: Request, tokens: int) -> dict:
        """The request's meta_info under adaptive steps: the accept length of the steps its batch runs at now."""
        if self.config.adaptive is None or tokens == 0:
            return {}
        with self._cond:
            steps = self.config.adaptive.steps_for_batch(max(self._running, 1))
        if steps == 0:
            return {
                "spec_accept_rate": 0.0,
                "spec_accept_length": 1.0,
                "spec_num_correct_drafts": 0,
                "spec_num_proposed_drafts": 0,
                "spec_verify_ct": tokens,
            }
        return self._spec_meta(request, tokens, self._accept_at(steps), steps + 1)

    def _spec_meta(self, request: Request, tokens: int, mean_accept: float, draft_tokens: int) -> dict:
        accept = specmodel.noisy_accept_length(
            mean_accept, draft_tokens, self.config.noise, self.config.seed, request.rid
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
        return spec_meta

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

    def validate(self, request: Request) -> None:
        """Raise GenerationError for a request SGLang refuses before generating (call before streaming starts)."""
        if request.sampling.max_new_tokens == 0 and self.config.spec.enabled:
            raise GenerationError(
                "max_new_tokens=0 is a prefill-only request, which speculative decoding does not serve; "
                "ask for max_new_tokens=1 to score a continuation."
            )
        start = request.logprobs.start if request.logprobs is not None else -1
        if start > len(request.input_ids):
            raise GenerationError(
                f"req.logprob_start_len={start} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={len(request.input_ids)}. Please use a smaller logprob_start_len."
            )
        total = request.prompt_tokens + request.sampling.max_new_tokens
        if total > self.config.context_length:
            raise GenerationError(
                f"Requested token count exceeds the model's maximum context length of {self.config.context_length} "
                f"tokens. You requested a total of {total} tokens: {request.prompt_tokens} tokens from the input "
                f"messages and {request.sampling.max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )

    def _wait(self, deadline: float | None) -> None:
        """Sleep (lock held) until the deadline, a batch change, or at most CLIENT_POLL_S."""
        timeout = CLIENT_POLL_S if deadline is None else min(CLIENT_POLL_S, max(0.0, deadline - time.monotonic()))
        self._cond.wait(timeout)

    @staticmethod
    def _poller(client_gone, kept: bool):
        """Checks the client every CLIENT_POLL_S however often the waiter wakes; raises ClientGone."""
        next_check = time.monotonic() + CLIENT_POLL_S

        def check() -> None:
            nonlocal next_check
            now = time.monotonic()
            if client_gone is None or now < next_check:
                return
            next_check = now + CLIENT_POLL_S
            if client_gone():
                raise ClientGone(kept)

        return check

    def abort(self, rid: str, abort_all: bool) -> int:
        """The scheduler's abort_request: every live request (abort_all) or those whose rid starts with `rid` end with
        an abort finish reason, the waiting ones at once, the running ones at their next decode step. A stuck or
        stalled scheduler never reads it. Returns how many requests it marked."""
        with self._cond:
            chosen = [key for key, req in self._live.items() if abort_all or (rid and req.rid.startswith(rid))]
            self._aborted.update(chosen)
            self._cond.notify_all()
            return len(chosen)

    def _is_aborted(self, request: Request) -> bool:
        return id(request) in self._aborted

    def _admit(self, request: Request, client_gone) -> str:
        """Wait for a running slot; returns the mode the request runs in. Holds no lock on return."""
        with self._cond:
            mode = self._fault_mode_for_next(request)
            if mode == STUCK and self.mode != STUCK:
                self._running += 1
                self._frozen = (self._running, len(self._waiting), self.stats.gen_throughput())
                self.mode = STUCK
                self._cond.notify_all()
                return STUCK
            if self.mode == STUCK:
                return STUCK
            if mode == STALLED:
                self.mode = STALLED
            self._count_decode_steps()
            self._waiting.append(request)
            check = self._poller(client_gone, kept=False)
            try:
                while self._waiting[0] is not request or self._running >= self.config.max_running_requests:
                    if self.mode == STUCK:
                        self._waiting.remove(request)
                        return STUCK
                    if self._is_aborted(request):
                        self._waiting.remove(request)
                        self._publish_if_idle()
                        self._cond.notify_all()
                        raise _AbortedWaiting()
                    self._wait(None)
                    check()
            except ClientGone:
                self._count_decode_steps()
                self._waiting.remove(request)
                self._publish_if_idle()
                self._cond.notify_all()
                raise
            self._count_decode_steps()
            self._waiting.popleft()
            # The prefill's report: the running batch, which does not hold the requests still in their prefill.
            self._published = (self._decoding, len(self._waiting))
            self._running += 1
            self._cond.notify_all()
            return self.mode

    def _leave(self, decoding: bool) -> None:
        with self._cond:
            self._count_decode_steps()
            self._running -= 1
            self._decoding -= 1 if decoding else 0
            self._publish_if_idle()
            self._cond.notify_all()

    def _publish_if_idle(self) -> None:
        # The idle loop publishes at once when the gauge disagrees with the (empty) running batch.
        if self._running == 0 and not self._waiting:
            self._published = (0, 0)

    def _never(self, client_gone, kept: bool) -> None:
        """A request that never progresses: wait until the client gives up (raises ClientGone)."""
        check = self._poller(client_gone, kept)
        with self._cond:
            while True:
                self._wait(None)
                check()

    def generate(self, request: Request, emit: Callable[[dict], None] | None = None, client_gone=None) -> dict:
        """Run one request to its end; `emit` gets each streaming chunk. Returns the final output.

        Raises ClientGone when the client disconnected while the request could not progress.
        """
        arrived = time.monotonic()
        with self._cond:  # abort_all reaches a request from its arrival on, as rid_to_state holds it
            self._live[id(request)] = request
        try:
            self.validate(request)
            cached = self._cached_tokens(request)
            return self._generate(request, emit, client_gone, arrived, cached)
        finally:
            with self._cond:
                self._live.pop(id(request), None)
                self._aborted.discard(id(request))

    def _generate(self, request: Request, emit, client_gone, arrived: float, cached: int) -> dict:
        try:
            mode = self._admit(request, client_gone)
        except _AbortedWaiting:
            final = self._chunk(
                request, [], start=0, end=0, finish_reason=dict(ABORT_FINISH_REASON), cached=0, logprobs=[]
            )
            final["meta_info"]["e2e_latency"] = time.monotonic() - arrived
            return final
        phase = {"decoding": False}
        if mode == STUCK:
            self._never(client_gone, kept=True)
        try:
            if mode == STALLED:
                with self._cond:  # it joins the batch, whose steps make no progress
                    self._count_decode_steps()
                    self._decoding += 1
                    phase["decoding"] = True
                self._never(client_gone, kept=False)
            return self._decode(request, emit, arrived, cached, client_gone, phase)
        finally:
            self._leave(phase["decoding"])

    def _decode(self, request: Request, emit, arrived: float, cached: int, client_gone, phase: dict) -> dict:
        pieces, finish_reason, logprobs = self._pieces(request)
        per_step, spec_meta = self._plan(request, len(pieces))
        ends = list(itertools.accumulate(per_step))
        started = time.monotonic()
        prefill_end = started + (request.prompt_tokens - cached) * self.config.prefill_s_per_token
        last_chunk_at = 0
        first_token_at = None
        done = 0.0  # decode steps completed (fractional while one is under way)
        aborted = False
        with self._cond:
            while time.monotonic() < prefill_end:
                self._wait(prefill_end)
            self._count_decode_steps()
            self._realtime["prefill_compute"] += request.prompt_tokens - cached
            self._realtime["prefill_cache"] += cached
            self._decoding += 1  # merged into the running batch after its prefill
            phase["decoding"] = True
            clock = prefill_end
            for index, end in enumerate(ends):
                last = index == len(ends) - 1
                chunk_due = emit is not None and not last and end - last_chunk_at >= self.config.stream_interval
                if not (last or chunk_due):
                    continue
                target = index + 1
                while done < target:
                    if self._is_aborted(request):  # FINISH_ABORT at its next step: the tokens done so far
                        aborted = True
                        break
                    if self.mode != NORMAL:  # the scheduler stopped making progress under this request too
                        self._never(client_gone, kept=self.mode == STUCK)
                    step_s = self._pace(self._running)
                    due = clock + (target - done) * step_s
                    if self.config.adaptive is not None:  # a slot's switch changes the pace: look again soon
                        self._wait(min(due, time.monotonic() + ADAPTIVE_TICK_S))
                        self._count_decode_steps()
                    else:
                        self._wait(due)
                    now = time.monotonic()
                    if now >= due or step_s <= 0:
                        done, clock = float(target), due
                    else:  # woken by a batch change: count what was done at the old pace
                        done, clock = done + (now - clock) / step_s, now
                if aborted:
                    break
                if first_token_at is None:
                    first_token_at = clock if index == 0 else prefill_end + (clock - prefill_end) / target
                self.last_receive_wall = time.time()
                if chunk_due:
                    self._cond.release()
                    try:
                        chunk = self._chunk(
                            request,
                            pieces,
                            start=last_chunk_at,
                            end=end,
                            finish_reason=None,
                            cached=cached,
                            logprobs=logprobs,
                        )
                        emit(chunk)
                    finally:
                        self._cond.acquire()
                    last_chunk_at = end
        finished_at = time.monotonic()
        first_token_at = finished_at if first_token_at is None else first_token_at
        produced = ends[-1] if ends else 0
        if aborted:
            steps = int(done)
            produced = max(ends[steps - 1] if steps else 0, last_chunk_at)
            finish_reason = dict(ABORT_FINISH_REASON)
        final = self._chunk(
            request,
            pieces,
            start=last_chunk_at if emit else 0,
            end=produced,
            finish_reason=finish_reason,
            cached=cached,
            logprobs=logprobs,
        )
        final["meta_info"]["e2e_latency"] = finished_at - arrived
        spec_meta = spec_meta or self._adaptive_meta(request, ends[-1] if ends else 0)
        final["meta_info"].update(spec_meta)
        self.stats.finished(
            FinishedRequest(
                streaming=request.stream,
                prompt_tokens=request.prompt_tokens,
                completion_tokens=produced,
                first_token_at=first_token_at,
                finished_at=finished_at,
                ttft=first_token_at - arrived,
                e2e=finished_at - arrived,
                verify_ct=spec_meta.get("spec_verify_ct", 0),
                correct_drafts=spec_meta.get("spec_num_correct_drafts", 0),
                proposed_drafts=spec_meta.get("spec_num_proposed_drafts", 0),
            )
        )
        return final

    def _chunk(
        self, request: Request, pieces: list, *, start: int, end: int, finish_reason, cached: int, logprobs: list
    ) -> dict:
        """An output dict; streamed chunks carry everything so far unless --incremental-streaming-output."""
        if request.stream and self.config.incremental_streaming:
            chosen = pieces[start:end]
        else:
            chosen = pieces[:end]
        meta = self._meta(request, finish_reason, end, cached)
        if request.logprobs is not None:
            meta.update(self._logprob_meta(request, pieces[:end], logprobs[:end]))
        return {"text": "".join(chosen), "output_ids": [lm.token_id(p) for p in chosen], "meta_info": meta}

    def _logprob_meta(self, request: Request, pieces: list, logprobs: list) -> dict:
        """TokenizerManager.add_logprob_to_meta_info: (logprob, token id, text or None) per token, the input's from
        logprob_start_len (default: none of the input), the first of them None (logprob_result_processor.py)."""
        ids = list(request.input_ids)
        start = len(ids) if request.logprobs.start < 0 else request.logprobs.start
        text = request.logprobs.return_text
        input_values = lm.score(self.lm, ids, start) if start < len(ids) else []
        inputs = [
            [value, token, (lm.piece_of(token) if text else None)] for value, token in zip(input_values, ids[start:])
        ]
        outputs = [[value, lm.token_id(piece), (piece if text else None)] for value, piece in zip(logprobs, pieces)]
        return {
            "input_token_logprobs": inputs,
            "output_token_logprobs": outputs,
            "output_token_logprobs_length": len(outputs),
        }
