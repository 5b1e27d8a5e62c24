# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reference gate: after the probe's tiers pass, the engine is held to the known-good's reference.

- ``plan`` (before the snapshot is saved): which case this restart is. ``off``; ``skipped`` (a rank >= 1, no
  known-good store, or - with ``mode: changed`` - engine inputs the same as the current known-good's, a routine
  restart); ``missing`` (no reference yet: nothing to compare, one is recorded after the save when
  ``record_missing``); ``accept`` (an intended change: recorded anew after the save, never compared); ``check``.
- ``check``: the golden outputs scored teacher-forced and free-running, the fingerprint measured again, each
  figure compared (reference_score.py). A failure is a failed gate on the ``reference`` tier; the reason names
  each failed check, by how much, and the reference (its recording time and the snapshot it came with).
- ``record`` (after a passing gate saved its snapshot): measures and writes the reference, saying why.

The reference lives in the known-good store (known_good.py ``reference.json``); a rollback leaves it unchanged.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.known_good import SnapshotError, inputs_of, now_iso
from ansible_collections.llmops.inference.plugins.module_utils.reference_record import (
    ReferenceMeasureError,
    measurement_settings,
)
from ansible_collections.llmops.inference.plugins.module_utils.reference_score import (
    output_checks,
    speed_checks,
    verdict,
)
from ansible_collections.llmops.inference.plugins.module_utils.reference_settings import MODE_ALWAYS, MODE_OFF
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangError

REFERENCE_TIER = "reference"
FORMAT = 1


def label(reference: dict) -> str:
    return f"recorded {reference.get('recorded_at')} with the known-good of {reference.get('snapshot_saved_at')}"


class ReferenceGate:
    def __init__(self, options, host, engine):
        self.options = options
        self.settings = options.reference
        self.host = host
        self.engine = engine
        self.case = None
        self.reference = None
        self.live_inputs = None
        self.result = {"status": "off", "reason": "reference.mode is off"}

    def _store(self):
        return self.host.store(self.options.known_good.root)

    def _dropin_dir(self) -> str:
        known_good = self.options.known_good
        unit_path = known_good.files.get("unit") or f"/etc/systemd/system/{self.options.unit}"
        return known_good.dropin_dir or unit_path + ".d"

    def plan(self) -> str:
        """Decide the case before the snapshot is saved; ``check`` is the only one run before it."""
        self.case = self._plan()
        return self.case

    def _plan(self) -> str:
        settings, known_good = self.settings, self.options.known_good
        if settings["mode"] == MODE_OFF:
            return "off"
        if self.options.node_rank:
            return self._skip(f"node_rank {self.options.node_rank} serves no API; rank 0 is held to the reference")
        if not known_good.root:
            return self._skip("no known_good.root: the reference lives beside the known-good snapshot")
        store = self._store()
        try:
            self.reference = store.read_reference()
            self.live_inputs = store.live_inputs(known_good.files, self._dropin_dir(), known_good.python)
            current = store.read("current")
        except (SnapshotError, OSError) as exc:
            return self._skip(f"the reference cannot be read: {exc}")
        return self._case(current)

    def _case(self, current: dict | None) -> str:
        settings = self.settings
        if settings["accept"]:
            self.result = {"status": "accept", "reason": "reference.accept: the reference is recorded anew"}
            return "accept"
        if self.reference is None:
            self.result = {"status": "missing", "reason": "no reference recorded yet"}
            return "missing"
        if settings["mode"] != MODE_ALWAYS and current is not None and self.live_inputs == inputs_of(current):
            return self._skip(
                f"engine inputs unchanged since the known-good of {current.get('saved_at')}: a routine restart "
                "(reference.mode: always checks it too)"
            )
        return "check"

    def _skip(self, why: str) -> str:
        self.result = {"status": "skipped", "reason": why}
        return "skipped"

    def check(self, speculative: bool) -> dict:
        """Compare the engine with the reference; the gate entries (``healthy``, ``failed_tier``, ``reason``)."""
        reference, settings = self.reference, self.settings
        named = label(reference)
        try:
            observed = self.engine.observe(reference["golden"], speculative)
        except (ReferenceMeasureError, SglangError, KeyError, IndexError, TypeError) as exc:
            reason = f"the engine could not be measured against the reference {named}: {exc}"
            self.result = {"status": "failed", "reason": reason, "checks": [], "reference": self._summary()}
            return {"healthy": False, "failed_tier": REFERENCE_TIER, "reason": reason}
        checks = output_checks(reference["golden"], observed["scores"], settings["logprob_tolerance"])
        checks += speed_checks(
            reference.get("fingerprint") or {},
            observed["fingerprint"],
            settings["speed_tolerance"],
            settings["latency_floor_ms"],
        )
        passed, reason = verdict(checks, named)
        self.result = {
            "status": "passed" if passed else "failed",
            "reason": reason,
            "checks": checks,
            "failed_checks": sorted({check["check"] for check in checks if not check["passed"]}),
            "reference": self._summary(),
            "fingerprint": observed["fingerprint"],
        }
        if passed:
            return {"healthy": True}
        return {"healthy": False, "failed_tier": REFERENCE_TIER, "reason": f"reference check failed {reason}"}

    def record(self, speculative: bool, snapshot: dict | None, model: dict) -> dict:
        """Measure the engine and write its reference (after a passing gate saved its snapshot)."""
        why = "accepted as an intended change (reference.accept)" if self.case == "accept" else "first reference"
        try:
            measured = self.engine.record(speculative)
        except (ReferenceMeasureError, SglangError) as exc:
            self.result = {"status": "not_recorded", "reason": f"the reference was not recorded: {exc}"}
            return self.result
        reference = {
            "format": FORMAT,
            "recorded_at": now_iso(),
            "why": why,
            "snapshot_saved_at": (snapshot or {}).get("saved_at"),
            "inputs": self.live_inputs,
            "model": model,
            "speculative": speculative,
            "settings": measurement_settings(self.settings),
            **measured,
        }
        try:
            path = self._store().write_reference(reference)
        except OSError as exc:
            self.result = {"status": "not_recorded", "reason": f"the reference was not written: {exc}"}
            return self.result
        replaced = f"; it replaces the one {label(self.reference)}" if self.reference else ""
        self.reference = reference
        status = "accepted" if self.case == "accept" else "recorded"
        self.result = {
            "status": status,
            "reason": f"reference {why} at {path}{replaced}",
            "reference": self._summary(),
            "fingerprint": reference["fingerprint"],
        }
        return self.result

    def _summary(self) -> dict:
        reference = self.reference or {}
        return {key: reference.get(key) for key in ("recorded_at", "why", "snapshot_saved_at", "settings")}
