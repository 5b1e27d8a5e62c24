# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Does an SGLang host serve? Tiered checks (unit, gpu, progress, health (readiness), model, generate, floors, soak),
optionally repeated until ready, each with a status, a reason and its time; an unhealthy host is also checked
for GPU memory that only a reset frees.

Private to the llmops.inference collection; not a public API. The systemd, process and GPU readers are
injected so every tier can be exercised without a host.
"""

from __future__ import annotations

import time

from ansible_collections.llmops.inference.plugins.module_utils.degenerate import degenerate_reason, quote_sample
from ansible_collections.llmops.inference.plugins.module_utils.gpu import (
    memory_without_live_holder,
    query_gpus,
    runnable_gpus,
    select_gpus,
)
from ansible_collections.llmops.inference.plugins.module_utils.probe_report import (
    EARLIER_FAILED,
    FAILED,
    OK,
    SKIPPED,
    Attempt,
    TierResult,
    probe_result,
)
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import TIER_NAMES, ProbeSettings
from ansible_collections.llmops.inference.plugins.module_utils.procs import pids_of_unit, read_process, wait_for
from ansible_collections.llmops.inference.plugins.module_utils.sglang import (
    HEALTH_PATH,
    READY_PATH,
    SglangError,
    SglangHTTPError,
    SglangTimeout,
)
from ansible_collections.llmops.inference.plugins.module_utils.systemd import SHOW_PROPERTIES, show_unit
from ansible_collections.llmops.inference.plugins.module_utils.unit_verdicts import (
    DEAD_STATES,
    unit_not_active_reason,
    unit_restart_reason,
)

# SGLang 0.5.23's metric names (sglang/srt/observability/metrics_collector.py). The request gauges are set by the
# scheduler at each stats log (every decode_log_interval steps) and again when it goes idle; generation_tokens_total
# grows when a request finishes (tokenizer_manager.py, observe_one_finished_request), realtime_tokens_total at
# every prefill and decode step (metrics_reporter.py, increment_realtime_tokens).
RUNNING_METRIC = "sglang:num_running_reqs"
QUEUED_METRIC = "sglang:num_queue_reqs"
GENERATED_METRIC = "sglang:generation_tokens_total"
PROCESSED_METRIC = "sglang:realtime_tokens_total"
PROGRESS_METRICS = (RUNNING_METRIC, QUEUED_METRIC, GENERATED_METRIC, PROCESSED_METRIC)
PROGRESS_POLL_S = 0.5
# How long memory without a live holder must stay before an unhealthy host is reported as needing a GPU reset:
# it also shows for a moment after a holder exits, until the driver releases it.
UNREAPABLE_CONFIRM_S = 2.0
UNREAPABLE_POLL_S = 0.2

# What a non-200 answer means (sglang/srt/entrypoints/http_server.py `ready` and `health_generate`).
NOT_READY_MEANING = {
    READY_PATH: "starting, paused, draining or unhealthy",
    HEALTH_PATH: "starting, draining or unhealthy",
}

SPECULATIVE_FIELDS = {
    "algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "eagle_topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
}


class TierFailure(Exception):
    """Raised inside a tier check; ``fatal`` stops a wait (a dead or restarted unit never recovers by waiting)."""

    def __init__(self, reason: str, fatal: bool = False):
        super().__init__(reason)
        self.fatal = fatal


class TierSkip(Exception):
    """The tier does not apply (no unit given, no floors set)."""


def request_count(samples: list) -> int:
    """Requests in one of SGLang's request gauges, over its series.

    Series with a non-empty ``priority`` label are the per-priority breakdown of the total in ``priority=""``;
    the attention-TP ranks of one DP rank report the same batch (the largest is taken), DP ranks add up.
    """
    by_dp = {}
    for labels, value in samples:
        if labels.get("priority", ""):
            continue
        rank = labels.get("dp_rank", "")
        by_dp[rank] = max(by_dp.get(rank, 0.0), value)
    return int(sum(by_dp.values()))


class MetricsSnapshot:
    """What one /metrics scrape says about progress."""

    def __init__(self, samples: dict, at: float):
        self.at = at
        self.running = request_count(samples.get(RUNNING_METRIC, []))
        self.queued = request_count(samples.get(QUEUED_METRIC, []))
        # A labelled counter has no sample until it first grows, so a missing one is 0.
        self.generated = sum(value for _labels, value in samples.get(GENERATED_METRIC, []))
        self.processed = sum(value for _labels, value in samples.get(PROCESSED_METRIC, []))

    @property
    def busy(self) -> int:
        return self.running + self.queued

    @property
    def tokens(self) -> float:
        return self.generated + self.processed


class SglangProbe:
    """Runs the tiers against one server (and its systemd unit), once or until ready.

    ``unit_reader(unit) -> UnitState``, ``unit_pids(unit) -> [pid]``, ``gpu_reader() -> [Gpu]`` and
    ``process_reader(pid) -> ProcessInfo | None`` are the host readers (systemd, /proc, NVML or nvidia-smi);
    ``client`` is an SglangClient.
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
        process_reader=read_process,
    ):
        self.settings = settings
        self.client = client
        self.unit_reader = unit_reader
        self.unit_pids = unit_pids
        self.gpu_reader = gpu_reader
        self.process_reader = process_reader
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
        unreapable = [] if attempt.healthy else self._unreapable()
        return probe_result(attempt, attempts, waited, self.clock() - started, unreapable)

    def _attempt(self) -> Attempt:
        attempt = Attempt()
        if "progress" in self.settings.tiers and self.settings.progress_window:
            # The progress window opens before the tiers ahead of it, so that their time counts towards it.
            attempt.progress_opening = self._opening_scrape()
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
        """The unit's processes' memory on ``gpu`` (NVML's per-process accounting); without a unit, or where the
        figures are unavailable (e.g. some containers), the memory in use beyond the driver's reservation."""
        if pids is None or not gpu.processes_known:
            return gpu.in_use_mib or 0
        mine = [proc for proc in gpu.processes if proc.pid in pids]
        if any(proc.used_mib is None for proc in mine):
            return gpu.in_use_mib or 0
        return sum(proc.used_mib for proc in mine)

    def _expected_gpus(self, gpus: list) -> tuple:
        """``(devices that must each hold memory, how many of them must)``; without a list, the devices an engine
        can run on (MIG devices of a GPU in MIG mode, else whole GPUs)."""
        settings = self.settings
        if settings.gpu_selectors:
            try:
                chosen = select_gpus(gpus, settings.gpu_selectors)
            except ValueError as exc:
                raise TierFailure(f"expected_gpus: {exc}") from None
            return chosen, len(chosen)
        devices = runnable_gpus(gpus)
        if settings.gpu_count:
            if settings.gpu_count > len(devices):
                raise TierFailure(f"expected {settings.gpu_count} GPUs but the host has {len(devices)}")
            return devices, settings.gpu_count
        if not devices:
            raise TierFailure("no GPUs found")
        return devices, len(devices)

    def _check_gpu(self, attempt: Attempt) -> str:
        try:
            gpus = self.gpu_reader()
        except Exception as exc:
            raise TierFailure(f"cannot list GPUs: {exc}") from None
        unit = self.settings.unit
        pids = set(self.unit_pids(unit)) if unit else None
        held = {gpu.key: self._held_mib(gpu, pids) for gpu in gpus}
        attempt.gpu_memory_mib = {gpu.key: held[gpu.key] for gpu in gpus}
        attempt.gpu_errors = [{"gpu": gpu.index, "uuid": gpu.uuid, **error} for gpu in gpus for error in gpu.errors]
        candidates, needed = self._expected_gpus(gpus)
        # With a count, the GPUs the unit uses most must do (CUDA_VISIBLE_DEVICES may pick any of them).
        ranked = sorted(candidates, key=lambda gpu: (-held[gpu.key], gpu.index, gpu.mig_index or 0))[:needed]
        ranked.sort(key=lambda gpu: (gpu.index, -1 if gpu.mig_index is None else gpu.mig_index))
        minimum = self.settings.min_gpu_memory_mib
        for gpu in ranked:
            if held[gpu.key] < minimum:
                raise TierFailure(self._gpu_reason(gpu, held[gpu.key], attempt))
        return ", ".join(f"{held[gpu.key]} MiB on {gpu.display}" for gpu in ranked)

    def _gpu_reason(self, gpu, held: int, attempt: Attempt) -> str:
        unknown = "" if gpu.processes_known else " (its process list is unavailable, so all of its used memory counts)"
        if not self.settings.unit:
            return f"{gpu.display} has {held} MiB used: model not loaded"
        state = attempt.unit_state
        who = "unit active but its processes" if state is not None and state.is_active else "the unit's processes"
        total = f" ({gpu.in_use_mib} MiB used on the GPU in all)" if gpu.in_use_mib not in (None, held) else ""
        return f"{who} hold {held} MiB on {gpu.display}{total}{unknown}: model not loaded"

    def _unreapable(self) -> list:
        """On an unhealthy host, GPU memory that no live process holds and that stays (a reset or a reboot frees it).

        Looks at the expected GPUs (all the devices an engine can run on without a list), only when the ``gpu``
        tier was requested; waits up to UNREAPABLE_CONFIRM_S for memory the driver is still releasing.
        """
        if "gpu" not in self.settings.tiers or self.gpu_reader is None:
            return []
        found = []

        def released() -> bool:
            try:
                gpus = self.gpu_reader()
                chosen = select_gpus(gpus, self.settings.gpu_selectors) if self.settings.gpu_selectors else None
            except Exception:
                found.clear()
                return True  # the gpu tier reports a listing that fails
            found[:] = memory_without_live_holder(
                runnable_gpus(gpus) if chosen is None else chosen,
                self.process_reader,
                self.settings.unaccounted_threshold_mib,
            )
            return not found

        wait_for(released, UNREAPABLE_CONFIRM_S, UNREAPABLE_POLL_S, self.clock, self.sleep)
        return found

    # progress ---------------------------------------------------------------------------------------

    def _scrape(self) -> MetricsSnapshot:
        samples = self.client.metric_samples(PROGRESS_METRICS)
        return MetricsSnapshot(samples, self.clock())

    def _opening_scrape(self) -> MetricsSnapshot | None:
        """The window's first scrape, or None when it failed (the tier scrapes again, and says why if it fails)."""
        try:
            return self._scrape()
        except SglangError:
            return None

    def _check_progress(self, attempt: Attempt) -> str:
        """Two or more /metrics scrapes up to ``progress_window`` apart: requests running or queued while no token
        is generated is a hang. Ends early once tokens are generated or the requests are gone."""
        window = self.settings.progress_window
        if not window:
            raise TierSkip("no progress_window set")
        try:
            first = attempt.progress_opening or self._scrape()
        except SglangHTTPError as exc:
            if exc.status != 404:
                raise TierFailure(f"cannot read /metrics: {exc}") from None
            attempt.progress = {"window_s": window, "metrics": False}
            reason = "/metrics answered HTTP 404 (the server runs without --enable-metrics): progress not judged"
            if self.settings.progress_require_metrics:
                raise TierFailure(reason) from None
            raise TierSkip(reason) from None
        except SglangError as exc:
            raise TierFailure(f"cannot read /metrics: {exc}") from None
        last = first
        self._note_progress(attempt, first, last, "idle")
        if not first.busy:
            return "idle: 0 running, 0 queued"
        deadline = first.at + window
        while True:
            self.sleep(max(0.0, min(PROGRESS_POLL_S, deadline - self.clock())))
            try:
                last = self._scrape()
            except SglangError as exc:
                raise TierFailure(f"cannot read /metrics during the progress window: {exc}") from None
            counts = f"{last.running} running, {last.queued} queued"
            if last.tokens < first.tokens:
                self._note_progress(attempt, first, last, "reset")
                raise TierFailure(f"token counters went backwards within {window:g} s (the server restarted?)")
            if last.tokens > first.tokens:
                self._note_progress(attempt, first, last, "progressing")
                return f"progressing: {self._generated(first, last)} in {last.at - first.at:.1f} s ({counts})"
            if not last.busy:
                self._note_progress(attempt, first, last, "drained")
                return f"drained: no request running or queued after {last.at - first.at:.1f} s"
            if last.at >= deadline:
                self._note_progress(attempt, first, last, "hung")
                attempt.hung = True
                raise TierFailure(f"hung: {counts}, no token generated in {window:g} s")

    @staticmethod
    def _generated(first: MetricsSnapshot, last: MetricsSnapshot) -> str:
        parts = []
        if last.generated > first.generated:
            parts.append(f"{last.generated - first.generated:g} tokens of finished requests")
        if last.processed > first.processed:
            parts.append(f"{last.processed - first.processed:g} tokens processed")
        return " and ".join(parts)

    def _note_progress(self, attempt: Attempt, first: MetricsSnapshot, last: MetricsSnapshot, verdict: str) -> None:
        attempt.progress = {
            "window_s": self.settings.progress_window,
            "metrics": True,
            "verdict": verdict,
            "running": last.running,
            "queued": last.queued,
            "generated_tokens": last.generated - first.generated,
            "processed_tokens": last.processed - first.processed,
            "observed_s": round(last.at - first.at, 3),
        }

    # http -------------------------------------------------------------------------------------------

    def _check_health(self, attempt: Attempt) -> str:
        """Readiness: SGLang's /ready, or /health where the server has no /ready (see SglangClient.ready).

        SGLang 0.5.23's /health is a generation of its own that takes a second or more; /ready reads the same
        state without one, and the generate tier is the proof that the engine generates.
        """
        try:
            path, status = self.client.ready()
        except SglangError as exc:
            raise TierFailure(str(exc)) from None
        if status != 200:
            raise TierFailure(f"{path} returned HTTP {status} ({NOT_READY_MEANING[path]})")
        return f"HTTP 200 on {path}"

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

    def _check_soak(self, attempt: Attempt) -> str:
        """``soak_requests`` short generations one after another, each within ``generate_timeout``."""
        settings = self.settings
        count = settings.soak_requests
        if not count:
            raise TierSkip("no soak_requests set")
        latencies = []
        attempt.soak = {"requests": count, "completed": 0, "latencies_s": latencies, "failed_request": None}
        for number in range(1, count + 1):
            problem = None
            try:
                result = self.client.generate(settings.prompt, settings.soak_max_new_tokens, settings.generate_timeout)
            except SglangTimeout as exc:
                problem = f"timed out: {exc}"
            except SglangError as exc:
                problem = f"failed: {exc}"
            else:
                if not result.text.strip():
                    problem = f"returned empty output ({result.completion_tokens or 0} completion tokens)"
                else:
                    degenerate = degenerate_reason(result.text, settings.min_distinct_ratio)
                    problem = f"returned {degenerate}" if degenerate else None
            if problem:
                attempt.soak["failed_request"] = number
                done = f"; {len(latencies)} before it took {_latency_range(latencies)}" if latencies else ""
                raise TierFailure(f"soak request {number} of {count} {problem}{done}")
            latencies.append(round(result.latency_s, 3))
            attempt.soak["completed"] = number
        return f"{count} requests, {_latency_range(latencies)}"

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


def _latency_range(latencies: list) -> str:
    ordered = sorted(latencies)
    median = ordered[len(ordered) // 2]
    return f"latency median {median:.3f} s, max {ordered[-1]:.3f} s"
