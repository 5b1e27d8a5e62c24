# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The probe's progress tier: requests running or queued while no token is generated is a hang.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.probe_base import ProbeBase, TierFailure, TierSkip
from ansible_collections.llmops.inference.plugins.module_utils.probe_report import Attempt
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangError, SglangHTTPError

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


class ProgressTier(ProbeBase):
    """The progress tier of SglangProbe."""

    def _scrape(self) -> MetricsSnapshot:
        samples = self.client.metric_samples(PROGRESS_METRICS)
        return MetricsSnapshot(samples, self.clock())

    def _opening_scrape(self) -> MetricsSnapshot | None:
        """The window's first scrape, or None when it failed (the tier scrapes again, and says why if it fails)."""
        try:
            return self._scrape()
        except SglangError:
            return None

    def _first_scrape(self, attempt: Attempt, window: float) -> MetricsSnapshot:
        """The window's first scrape; a server without /metrics skips the tier (fails it with
        ``progress_require_metrics``)."""
        try:
            return attempt.progress_opening or self._scrape()
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

    def _check_progress(self, attempt: Attempt) -> str:
        """Two or more /metrics scrapes up to ``progress_window`` apart: requests running or queued while no token
        is generated is a hang. Ends early once tokens are generated or the requests are gone."""
        window = self.settings.progress_window
        if not window:
            raise TierSkip("no progress_window set")
        first = self._first_scrape(attempt, window)
        self._note_progress(attempt, first, first, "idle")
        if not first.busy:
            return "idle: 0 running, 0 queued"
        deadline = first.at + window
        while True:
            self.sleep(max(0.0, min(PROGRESS_POLL_S, deadline - self.clock())))
            try:
                last = self._scrape()
            except SglangError as exc:
                raise TierFailure(f"cannot read /metrics during the progress window: {exc}") from None
            verdict = self._progress_verdict(attempt, first, last, deadline)
            if verdict is not None:
                return verdict

    def _progress_verdict(self, attempt: Attempt, first: MetricsSnapshot, last: MetricsSnapshot, deadline: float):
        """The tier's reason once the scrapes tell (progressing, drained), TierFailure (counters reset, hung), or
        None while the window is still open."""
        window = self.settings.progress_window
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
        return None

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
