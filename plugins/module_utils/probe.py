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

from ansible_collections.llmops.inference.plugins.module_utils.degenerate import degenerate_reason, quote_sample
from ansible_collections.llmops.inference.plugins.module_utils.gpu_query import query_gpus
from ansible_collections.llmops.inference.plugins.module_utils.probe_base import ProbeHost, TierFailure, TierSkip
from ansible_collections.llmops.inference.plugins.module_utils.probe_gpu import GpuTier
from ansible_collections.llmops.inference.plugins.module_utils.probe_progress import ProgressTier
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
from ansible_collections.llmops.inference.plugins.module_utils.probe_unit import UnitTier
from ansible_collections.llmops.inference.plugins.module_utils.procs import pids_of_unit
from ansible_collections.llmops.inference.plugins.module_utils.sglang import (
    HEALTH_PATH,
    READY_PATH,
    SglangError,
    SglangTimeout,
)
from ansible_collections.llmops.inference.plugins.module_utils.systemd import SHOW_PROPERTIES, show_unit

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


class SglangProbe(UnitTier, GpuTier, ProgressTier):
    """Runs the tiers against one server (and its systemd unit), once or until ready; ``host`` holds the host
    readers (ProbeHost), ``client`` is an SglangClient."""

    @classmethod
    def for_host(cls, settings: ProbeSettings, client, run_command, gpu_backend: str = "auto") -> SglangProbe:
        """A probe reading this host: systemd through ``run_command``, /proc, and NVML or nvidia-smi."""
        return cls(
            settings,
            client,
            ProbeHost(
                unit_reader=lambda unit: show_unit(run_command, unit, (*SHOW_PROPERTIES, "ExecMainPID")),
                unit_pids=pids_of_unit,
                gpu_reader=lambda: query_gpus(gpu_backend, run_command=run_command)[1],
            ),
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
