# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The probe's unit tier: the systemd unit is active, did not restart, and stays so over ``stability_window``.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.probe_base import ProbeBase, TierFailure, TierSkip
from ansible_collections.llmops.inference.plugins.module_utils.probe_report import FAILED, OK, SKIPPED, Attempt
from ansible_collections.llmops.inference.plugins.module_utils.unit_verdicts import (
    DEAD_STATES,
    unit_not_active_reason,
    unit_restart_reason,
)


class UnitTier(ProbeBase):
    """The unit tier of SglangProbe."""

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
