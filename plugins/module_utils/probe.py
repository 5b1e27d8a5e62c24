# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Does an SGLang host serve? Tiered checks (unit, gpu, health, model, generate, floors), optionally
repeated until ready, each with a status, a reason and its time.

Private to the llmops.inference collection; not a public API. The systemd, process and GPU readers are
injected so every tier can be exercised without a host.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager

from ansible_collections.llmops.inference.plugins.module_utils.gpu import query_gpus, select_gpus
from ansible_collections.llmops.inference.plugins.module_utils.procs import pids_of_unit
from ansible_collections.llmops.inference.plugins.module_utils.sglang import (
    DEFAULT_URL,
    SglangError,
    SglangTimeout,
    validate_url,
)
from ansible_collections.llmops.inference.plugins.module_utils.systemd import (
    SHOW_PROPERTIES,
    normalize_unit_name,
    show_unit,
)

TIER_NAMES = ("unit", "gpu", "health", "model", "generate", "floors")
OK, FAILED, SKIPPED = "ok", "failed", "skipped"
EARLIER_FAILED = "earlier tier failed"
MAX_POLL_INTERVAL = 0.5
DEFAULT_PROMPT = "List the first five prime numbers."
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_MIN_GPU_MEMORY_MIB = 1024
DEFAULT_MIN_DISTINCT_RATIO = 0.25
TEXT_SAMPLE_CHARS = 200
DEAD_STATES = ("failed", "inactive")
SPECULATIVE_FIELDS = {
    "algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "eagle_topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
}

# Degenerate-output detection. A run of one character needs MIN_CHAR_REPEATS, a longer unit (up to
# MAX_PERIOD chars) MIN_UNIT_REPEATS, and the run must cover MIN_TAIL_SHARE of the text ("Hello!!!!!!!!"
# counts, "Wow!!" does not). Below MIN_WORDS_FOR_RATIO words a distinct-word ratio says nothing; it is taken
# over the last RATIO_WINDOW words because the ratio of any long text falls with its length.
QUOTE_CHARS = 20
MAX_PERIOD = 16
MIN_CHAR_REPEATS = 5
MIN_UNIT_REPEATS = 4
MIN_TAIL_SHARE = 0.5
MIN_WORDS_FOR_SAME_WORD = 4
MIN_WORDS_FOR_RATIO = 12
RATIO_WINDOW = 100
WORD = re.compile(r"\w+", re.UNICODE)


def quote_sample(text: str, limit: int = QUOTE_CHARS) -> str:
    """``'the first 20 chars'`` with escapes, followed by ``...`` when cut."""
    text = text.strip()
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _repeated_tail(text: str) -> tuple:
    """Longest tail of ``text`` repeating one unit of at most MAX_PERIOD chars: ``(unit, repeats, length)``."""
    best = ("", 0, 0)
    size = len(text)
    for period in range(1, min(MAX_PERIOD, size // 2) + 1):
        start = size - period - 1
        while start >= 0 and text[start] == text[start + period]:
            start -= 1
        length = size - start - 1
        repeats = length // period
        needed = MIN_CHAR_REPEATS if period == 1 else MIN_UNIT_REPEATS
        if repeats >= needed and length > best[2] and text[-period:].strip():
            best = (text[-period:], repeats, length)
    return best


def degenerate_reason(text: str, min_distinct_ratio: float = DEFAULT_MIN_DISTINCT_RATIO) -> str | None:
    """Why ``text`` looks like a broken engine's output, or None when it reads like an answer.

    Flags one character or one short unit repeated over most of the text, one word repeated, and text
    whose distinct-word ratio is below ``min_distinct_ratio``. Short answers and ordinary repetitive
    text (numbered lists, recipes) pass.
    """
    stripped = text.strip()
    if not stripped:
        return None
    unit, repeats, length = _repeated_tail(stripped)
    if repeats and length >= MIN_TAIL_SHARE * len(stripped):
        what = "one character" if len(unit) == 1 else repr(unit)
        return f"degenerate output: {quote_sample(stripped)} ({what} repeated {repeats} times)"
    words = [word.lower() for word in WORD.findall(stripped)]
    if len(words) >= MIN_WORDS_FOR_SAME_WORD and len(set(words)) == 1:
        return f"degenerate output: {quote_sample(stripped)} (one word repeated {len(words)} times)"
    window = words[-RATIO_WINDOW:]
    if len(window) >= MIN_WORDS_FOR_RATIO:
        distinct = len(set(window))
        ratio = distinct / len(window)
        if ratio < min_distinct_ratio:
            where = f"of the last {len(window)} words" if len(words) > len(window) else f"of {len(window)} words"
            return (
                f"degenerate output: {quote_sample(stripped)} "
                f"({distinct} distinct {where}, ratio {ratio:.2f} < {min_distinct_ratio})"
            )
    return None


def parse_expected_gpus(value) -> tuple:
    """``(count, selectors)`` from an int (or digit string) count or a list of GPU indices/UUIDs."""
    if value is None or value == []:
        return None, None
    if isinstance(value, bool):
        raise ValueError(f"expected_gpus must be a GPU count or a list of GPU indices or UUIDs, got {value!r}")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        count = int(value)
        if count < 1:
            raise ValueError(f"expected_gpus as a count must be at least 1, got {count}")
        return count, None
    if isinstance(value, (list, tuple)) and all(str(item).strip() for item in value):
        return None, [str(item).strip() for item in value]
    raise ValueError(f"expected_gpus must be a GPU count or a list of GPU indices or UUIDs, got {value!r}")


class ProbeSettings:
    """The probe's options with their defaults; :meth:`validate` names any option that is wrong."""

    def __init__(
        self,
        *,
        url=DEFAULT_URL,
        unit=None,
        tiers=None,
        prompt=DEFAULT_PROMPT,
        max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
        timeout=10.0,
        generate_timeout=60.0,
        expected_model=None,
        expect_regex=None,
        min_gpu_memory_mib=DEFAULT_MIN_GPU_MEMORY_MIB,
        expected_gpus=None,
        tp_size=None,
        min_tokens_per_s=None,
        min_accept_length=None,
        min_distinct_ratio=DEFAULT_MIN_DISTINCT_RATIO,
        stability_window=0.0,
        wait_timeout=0.0,
        poll_interval=MAX_POLL_INTERVAL,
    ):
        self.url = url
        self.unit = unit or None
        self.tiers = list(TIER_NAMES) if tiers is None else list(tiers)
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.timeout = timeout
        self.generate_timeout = generate_timeout
        self.expected_model = expected_model or None
        self.expect_regex = expect_regex or None
        self.min_gpu_memory_mib = min_gpu_memory_mib
        self.expected_gpus = expected_gpus
        self.tp_size = tp_size
        self.min_tokens_per_s = min_tokens_per_s
        self.min_accept_length = min_accept_length
        self.min_distinct_ratio = min_distinct_ratio
        self.stability_window = stability_window
        self.wait_timeout = wait_timeout
        self.poll_interval = poll_interval
        self.gpu_count = None
        self.gpu_selectors = None
        self.pattern = None

    def validate(self) -> ProbeSettings:
        """Check every option; raise ProbeInputError naming the option and what is accepted."""
        with _option("url"):
            self.url = validate_url(self.url)
        if self.unit:
            self.unit = normalize_unit_name(self.unit)
        unknown = [name for name in self.tiers if name not in TIER_NAMES]
        _require(bool(self.tiers), "tiers", f"tiers must name at least one of {', '.join(TIER_NAMES)}")
        _require(not unknown, "tiers", f"tiers must be a subset of {', '.join(TIER_NAMES)}; unknown: {unknown}")
        for name in ("timeout", "generate_timeout"):
            value = getattr(self, name)
            _require(value > 0, name, f"{name} must be greater than 0 seconds, got {value}")
        for name in ("wait_timeout", "stability_window", "min_gpu_memory_mib", "min_tokens_per_s", "min_accept_length"):
            value = getattr(self, name)
            _require(value is None or value >= 0, name, f"{name} must not be negative, got {value}")
        _require(
            0 < self.poll_interval <= MAX_POLL_INTERVAL,
            "poll_interval",
            f"poll_interval must be greater than 0 and at most {MAX_POLL_INTERVAL} s, got {self.poll_interval}",
        )
        _require(
            self.max_new_tokens >= 1, "max_new_tokens", f"max_new_tokens must be at least 1, got {self.max_new_tokens}"
        )
        _require(
            0 <= self.min_distinct_ratio <= 1,
            "min_distinct_ratio",
            f"min_distinct_ratio must be between 0 and 1, got {self.min_distinct_ratio}",
        )
        _require(
            self.tp_size is None or self.tp_size >= 1, "tp_size", f"tp_size must be at least 1, got {self.tp_size}"
        )
        _require(bool((self.prompt or "").strip()), "prompt", "prompt must not be empty")
        if self.expect_regex:
            try:
                self.pattern = re.compile(self.expect_regex)
            except re.error as exc:
                raise ProbeInputError(
                    "expect_regex", f"expect_regex does not compile: {exc} (pattern {self.expect_regex!r})"
                ) from None
        with _option("expected_gpus"):
            self.gpu_count, self.gpu_selectors = parse_expected_gpus(self.expected_gpus)
        if self.gpu_count is None and self.gpu_selectors is None and self.tp_size:
            self.gpu_count = self.tp_size
        return self


class ProbeInputError(ValueError):
    """An option is wrong; ``option`` names it and the message says what is accepted."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def _require(condition: bool, option: str, message: str) -> None:
    if not condition:
        raise ProbeInputError(option, message)


@contextmanager
def _option(option: str):
    """Re-raise a ValueError from a parser as ProbeInputError for ``option``."""
    try:
        yield
    except ProbeInputError:
        raise
    except ValueError as exc:
        raise ProbeInputError(option, str(exc)) from None


class TierResult:
    def __init__(self, name: str, status: str, reason: str = "", elapsed_s: float = 0.0):
        self.name = name
        self.status = status
        self.reason = reason
        self.elapsed_s = elapsed_s

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "reason": self.reason, "elapsed_s": round(self.elapsed_s, 3)}


class TierFailure(Exception):
    """Raised inside a tier check; ``fatal`` stops a wait (a dead or restarted unit never recovers by waiting)."""

    def __init__(self, reason: str, fatal: bool = False):
        super().__init__(reason)
        self.fatal = fatal


class TierSkip(Exception):
    """The tier does not apply (no unit given, no floors set)."""


def unit_not_active_reason(state) -> str:
    detail = f"ActiveState={state.active_state}, SubState={state.sub_state}"
    if state.result and state.result != "success":
        detail += f", Result={state.result}"
    return f"unit {state.name} not active: {detail}, NRestarts {state.n_restarts}"


def last_main_pid(state) -> int:
    """MainPID, or after the main process exited the PID it had (systemd's ExecMainPID), when read."""
    try:
        return state.main_pid or int(state.properties.get("ExecMainPID") or 0)
    except (AttributeError, ValueError):
        return state.main_pid


def unit_restart_reason(before, after, elapsed_s: float) -> str | None:
    """The restart verdict between two samples of one unit, or None when it stayed put.

    A restart is a new MainPID replacing a live one, or a change of NRestarts (it rises with each automatic
    restart and drops to 0 on a manual start). A MainPID that merely went to 0 is an exit, judged by the
    unit's state instead.
    """
    replaced = bool(before.main_pid and after.main_pid and before.main_pid != after.main_pid)
    if not replaced and after.n_restarts == before.n_restarts:
        return None
    return (
        f"unit restarting: MainPID {last_main_pid(before)} -> {after.main_pid}, "
        f"NRestarts {before.n_restarts} -> {after.n_restarts} within {elapsed_s:.1f} s"
    )


class Attempt:
    """One pass over the tiers and what it learned."""

    def __init__(self):
        self.tiers = {}
        self.fatal = False
        self.unit_state = None
        self.gpu_memory_mib = {}
        self.model = {}
        self.speculative = {}
        self.generation = None

    @property
    def failed_tier(self) -> str | None:
        for name in TIER_NAMES:
            tier = self.tiers.get(name)
            if tier is not None and tier.status == FAILED:
                return name
        return None

    @property
    def healthy(self) -> bool:
        return self.failed_tier is None


class SglangProbe:
    """Runs the tiers against one server (and its systemd unit), once or until ready.

    ``unit_reader(unit) -> UnitState``, ``unit_pids(unit) -> [pid]`` and ``gpu_reader() -> [Gpu]`` are
    the host readers (systemd, /proc, NVML or nvidia-smi); ``client`` is an SglangClient.
    """

    def __init__(
        self,
        settings: ProbeSettings,
        client,
        *,
        unit_reader=None,
        unit_pids=None,
        gpu_reader=None,
        clock=time.monotonic,
        sleep=time.sleep,
    ):
        self.settings = settings
        self.client = client
        self.unit_reader = unit_reader
        self.unit_pids = unit_pids
        self.gpu_reader = gpu_reader
        self.clock = clock
        self.sleep = sleep
        self._baseline = None
        self._baseline_at = None

    @classmethod
    def for_host(cls, settings: ProbeSettings, client, run_command, gpu_backend: str = "auto") -> SglangProbe:
        """A probe reading this host: systemd through ``run_command``, /proc, and NVML or nvidia-smi."""
        return cls(
            settings,
            client,
            unit_reader=lambda unit: show_unit(run_command, unit, (*SHOW_PROPERTIES, "ExecMainPID")),
            unit_pids=pids_of_unit,
            gpu_reader=lambda: query_gpus(gpu_backend, run_command=run_command)[1],
        )

    def run(self) -> dict:
        """Probe once, or with ``wait_timeout`` until every tier passes, the unit dies, or time runs out."""
        settings = self.settings
        started = self.clock()
        deadline = started + settings.wait_timeout
        attempts = 0
        while True:
            attempt_started = self.clock()
            attempt = self._attempt()
            attempts += 1
            if attempt.healthy or attempt.fatal or settings.wait_timeout <= 0:
                break
            next_start = attempt_started + settings.poll_interval
            if next_start > deadline:
                break
            self.sleep(max(0.0, next_start - self.clock()))
        waited = attempt_started - started if settings.wait_timeout > 0 else 0.0
        return self._result(attempt, attempts, waited, self.clock() - started)

    def _attempt(self) -> Attempt:
        attempt = Attempt()
        for name in TIER_NAMES:
            if name not in self.settings.tiers:
                attempt.tiers[name] = TierResult(name, SKIPPED, "not requested")
                continue
            if attempt.failed_tier is not None:
                attempt.tiers[name] = TierResult(name, SKIPPED, EARLIER_FAILED)
                continue
            attempt.tiers[name] = self._run_tier(name, attempt)
        self._finish_unit(attempt)
        return attempt

    def _run_tier(self, name: str, attempt: Attempt) -> TierResult:
        started = self.clock()
        try:
            status, reason = OK, getattr(self, "_check_" + name)(attempt)
        except TierSkip as skip:
            status, reason = SKIPPED, str(skip)
        except TierFailure as failure:
            status, reason = FAILED, str(failure)
            attempt.fatal = attempt.fatal or failure.fatal
        return TierResult(name, status, reason, self.clock() - started)

    # unit -------------------------------------------------------------------------------------------

    def _sample_unit(self, attempt: Attempt):
        try:
            state = self.unit_reader(self.settings.unit)
        except Exception as exc:
            raise TierFailure(f"cannot read unit {self.settings.unit}: {exc}") from None
        attempt.unit_state = state
        now = self.clock()
        if self._baseline is None:
            self._baseline, self._baseline_at = state, now
        return state, now

    def _judge_unit(self, state, now: float) -> None:
        if state.load_state == "not-found":
            raise TierFailure(f"unit {state.name} not found (LoadState=not-found)", fatal=True)
        restart = unit_restart_reason(self._baseline, state, now - self._baseline_at)
        if restart:
            raise TierFailure(restart, fatal=True)
        if state.active_state in DEAD_STATES:
            raise TierFailure(unit_not_active_reason(state), fatal=True)
        if not state.is_active:
            raise TierFailure(unit_not_active_reason(state))

    def _check_unit(self, attempt: Attempt) -> str:
        if not self.settings.unit:
            raise TierSkip("no unit given")
        state, now = self._sample_unit(attempt)
        self._judge_unit(state, now)
        return f"active, MainPID {state.main_pid}, NRestarts {state.n_restarts}"

    def _finish_unit(self, attempt: Attempt) -> None:
        """Sample the unit again after the other tiers, until ``stability_window`` has passed since the first look.

        A probe without waiting holds out the window also when the unit was not active at the start (to catch
        the restart, with its numbers); while waiting for readiness it is held only once the other tiers pass.
        """
        tier = attempt.tiers["unit"]
        single = self.settings.wait_timeout <= 0
        if tier.status == SKIPPED or attempt.fatal or (tier.status == FAILED and not single):
            return
        started = self.clock()
        hold = single or attempt.healthy
        window_end = self._baseline_at + self.settings.stability_window if hold else started
        verdict = None
        while True:
            try:
                state, now = self._sample_unit(attempt)
                self._judge_unit(state, now)
                verdict = None
            except TierFailure as failure:
                verdict, now = failure, self.clock()
                if failure.fatal:
                    break
            if now >= window_end:
                break
            self.sleep(min(self.settings.poll_interval, window_end - now))
        if verdict is not None and (tier.status == OK or verdict.fatal):
            tier.status, tier.reason = FAILED, str(verdict)
            attempt.fatal = verdict.fatal
        elif tier.status == OK:
            tier.reason = (
                f"active, MainPID {state.main_pid}, NRestarts {state.n_restarts}, "
                f"stable for {now - self._baseline_at:.1f} s"
            )
        tier.elapsed_s += self.clock() - started

    # gpu --------------------------------------------------------------------------------------------

    def _held_mib(self, gpu, pids) -> int:
        if pids is None:
            return gpu.used_mib or 0
        mine = [proc for proc in gpu.processes if proc.pid in pids]
        if any(proc.used_mib is None for proc in mine):
            return gpu.used_mib or 0  # per-process figures unavailable (e.g. some containers): best estimate
        return sum(proc.used_mib for proc in mine)

    def _expected_gpus(self, gpus: list) -> tuple:
        """``(gpus that must each hold memory, how many of them must)``."""
        settings = self.settings
        if settings.gpu_selectors:
            try:
                chosen = select_gpus(gpus, settings.gpu_selectors)
            except ValueError as exc:
                raise TierFailure(f"expected_gpus: {exc}") from None
            return chosen, len(chosen)
        if settings.gpu_count:
            if settings.gpu_count > len(gpus):
                raise TierFailure(f"expected {settings.gpu_count} GPUs but the host has {len(gpus)}")
            return list(gpus), settings.gpu_count
        if not gpus:
            raise TierFailure("no GPUs found")
        return list(gpus), len(gpus)

    def _check_gpu(self, attempt: Attempt) -> str:
        try:
            gpus = self.gpu_reader()
        except Exception as exc:
            raise TierFailure(f"cannot list GPUs: {exc}") from None
        unit = self.settings.unit
        pids = set(self.unit_pids(unit)) if unit else None
        held = {gpu.index: self._held_mib(gpu, pids) for gpu in gpus}
        attempt.gpu_memory_mib = {str(index): mib for index, mib in sorted(held.items())}
        candidates, needed = self._expected_gpus(gpus)
        # With a count, the GPUs the unit uses most must do (CUDA_VISIBLE_DEVICES may pick any of them).
        ranked = sorted(candidates, key=lambda gpu: (-held[gpu.index], gpu.index))[:needed]
        minimum = self.settings.min_gpu_memory_mib
        for gpu in sorted(ranked, key=lambda gpu: gpu.index):
            if held[gpu.index] < minimum:
                raise TierFailure(self._gpu_reason(gpu, held[gpu.index], attempt))
        return ", ".join(f"{held[gpu.index]} MiB on GPU {gpu.index}" for gpu in sorted(ranked, key=lambda g: g.index))

    def _gpu_reason(self, gpu, held: int, attempt: Attempt) -> str:
        if not self.settings.unit:
            return f"GPU {gpu.index} has {held} MiB used: model not loaded"
        state = attempt.unit_state
        who = "unit active but its processes" if state is not None and state.is_active else "the unit's processes"
        total = f" ({gpu.used_mib} MiB used on the GPU in all)" if gpu.used_mib not in (None, held) else ""
        return f"{who} hold {held} MiB on GPU {gpu.index}{total}: model not loaded"

    # http -------------------------------------------------------------------------------------------

    def _check_health(self, attempt: Attempt) -> str:
        try:
            status = self.client.health()
        except SglangError as exc:
            raise TierFailure(str(exc)) from None
        if status != 200:
            raise TierFailure(f"/health returned HTTP {status} (starting, draining or unhealthy)")
        return "HTTP 200"

    def _check_model(self, attempt: Attempt) -> str:
        try:
            info = self.client.model_info()
            ids = self.client.model_ids()
        except SglangError as exc:
            raise TierFailure(str(exc)) from None
        if not isinstance(info, dict):
            raise TierFailure(f"/model_info answered {type(info).__name__}, not a JSON object")
        attempt.model = {
            "model_path": info.get("model_path"),
            "served_model_name": info.get("served_model_name"),
            "ids": ids,
        }
        attempt.speculative = self._speculative_settings()
        served = info.get("served_model_name") or info.get("model_path") or (ids[0] if ids else None)
        expected = self.settings.expected_model
        if expected:
            names = [name for name in (info.get("model_path"), info.get("served_model_name"), *ids) if name]
            if not any(name == expected or str(name).rstrip("/").endswith("/" + expected) for name in names):
                raise TierFailure(
                    f"server serves {served!r} (model_path {info.get('model_path')!r}, /v1/models ids {ids}), "
                    f"expected {expected!r}"
                )
        return f"serving {served!r}"

    def _speculative_settings(self) -> dict:
        """Speculative-decoding settings from /server_info; informational, so a failure leaves them empty."""
        try:
            info = self.client.server_info()
        except SglangError:
            return {}
        return {key: info.get(field) for key, field in SPECULATIVE_FIELDS.items()}

    def _check_generate(self, attempt: Attempt) -> str:
        settings = self.settings
        try:
            result = self.client.generate(settings.prompt, settings.max_new_tokens, settings.generate_timeout)
        except SglangTimeout as exc:
            raise TierFailure(f"generation timed out: {exc}") from None
        except SglangError as exc:
            raise TierFailure(f"generation failed: {exc}") from None
        attempt.generation = result
        if not result.text.strip():
            raise TierFailure(f"empty output ({result.completion_tokens or 0} completion tokens)")
        degenerate = degenerate_reason(result.text, settings.min_distinct_ratio)
        if degenerate:
            raise TierFailure(degenerate)
        if settings.pattern is not None and not settings.pattern.search(result.text):
            sample = quote_sample(result.text)
            raise TierFailure(f"output {sample} does not match expect_regex {settings.expect_regex!r}")
        rate = f", {result.tokens_per_s:.1f} tok/s" if result.tokens_per_s else ""
        ttft = f", TTFT {result.ttft_s:.3f} s" if result.ttft_s is not None else ""
        return f"{result.completion_tokens} tokens in {result.latency_s:.3f} s{ttft}{rate}"

    def _check_floors(self, attempt: Attempt) -> str:
        settings = self.settings
        if settings.min_tokens_per_s is None and settings.min_accept_length is None:
            raise TierSkip("no floors set")
        result = attempt.generation
        if result is None:
            raise TierSkip("floors need the generate tier")
        passed = []
        if settings.min_tokens_per_s is not None:
            rate = result.tokens_per_s
            if rate is None or rate < settings.min_tokens_per_s:
                shown = "unknown" if rate is None else f"{rate:.1f}"
                raise TierFailure(f"{shown} tok/s below min_tokens_per_s {settings.min_tokens_per_s}")
            passed.append(f"{rate:.1f} tok/s")
        if settings.min_accept_length is not None:
            accept = result.accept_length
            if accept is None:
                raise TierFailure(
                    f"no spec_accept_length in the response's meta_info (speculative decoding off?), "
                    f"min_accept_length {settings.min_accept_length} not met"
                )
            if accept < settings.min_accept_length:
                raise TierFailure(f"accept length {accept:.2f} below min_accept_length {settings.min_accept_length}")
            passed.append(f"accept length {accept:.2f}")
        return ", ".join(passed)

    # result -----------------------------------------------------------------------------------------

    def _result(self, attempt: Attempt, attempts: int, waited_s: float, elapsed_s: float) -> dict:
        failed = attempt.failed_tier
        state = attempt.unit_state
        return {
            "healthy": failed is None,
            "failed_tier": failed,
            "reason": attempt.tiers[failed].reason if failed else None,
            "tiers": [attempt.tiers[name].as_dict() for name in TIER_NAMES],
            "main_pid": state.main_pid if state is not None else None,
            "n_restarts": state.n_restarts if state is not None else None,
            "active_state": state.active_state if state is not None else None,
            "gpu_memory_mib": attempt.gpu_memory_mib,
            "model": attempt.model,
            "speculative": attempt.speculative,
            "generation": generation_facts(attempt.generation),
            "waited_s": round(waited_s, 3),
            "elapsed_s": round(elapsed_s, 3),
            "attempts": attempts,
        }


def _rounded(value, digits: int = 3):
    return round(value, digits) if isinstance(value, float) else value


def generation_facts(result) -> dict:
    if result is None:
        return {}
    return {
        "text": result.text[:TEXT_SAMPLE_CHARS],
        "completion_tokens": result.completion_tokens,
        "latency_s": _rounded(result.latency_s),
        "ttft_s": _rounded(result.ttft_s),
        "tokens_per_s": _rounded(result.tokens_per_s, 1),
        "accept_length": _rounded(result.accept_length),
    }
