# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sweep's results directory on the controller: its definition, one file per measured load level, resume.

Private to the llmops.inference collection; not a public API. Standard library only.

Layout of ``sweep_results_dir``::

    sweep.json                      what is swept and how it is measured, and the history of runs
    points/<id>/c<concurrency>.json one record per point and load level (measured or failed), written when
                                    the point's benchmark ends
    results.*, results-*            the reports (sweep_render.py), rewritten at the end of every run

The levels' files of a point are written atomically when the one benchmark of all its levels ends (or is cut
short), for whichever host ran it. Until then each level that ended is kept on that host, in the benchmark's
progress file, which a resumed sweep records first: a killed sweep loses at most the level in progress, and a
re-run with resume measures only the levels that have no file: a point with some of its levels recorded is
loaded again for the others only.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import atomic_write
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import SweepInputError

DEFINITION_FILE = "sweep.json"
POINTS_DIR = "points"
REPORT_PREFIX = "results"
# The proof of the deployable configuration (sweep_prove.py): one record per arm, round and level. Its name starts
# with REPORT_PREFIX, so a new run moves it aside with the reports.
PROVE_DIR = "results-prove"
# What makes two runs' numbers comparable; a resumed run must match the earlier one in all of these.
MEASUREMENT_KEYS = ("algorithm", "repeats", "warmup_requests", "bench")


def _dump(data) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _utc_stamp(epoch: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch))


class ResultsDir:
    """``sweep_results_dir`` on the controller."""

    def __init__(self, path: str):
        if not isinstance(path, str) or not os.path.isabs(path):
            raise SweepInputError("sweep_results_dir", f"must be an absolute path on the controller, got {path!r}")
        self.path = os.path.normpath(path)
        self.points_dir = os.path.join(self.path, POINTS_DIR)
        self.definition_path = os.path.join(self.path, DEFINITION_FILE)

    def ensure_writable(self) -> None:
        """Create the directory (and points/) and prove a file can be written there."""
        try:
            os.makedirs(self.points_dir, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=self.points_dir)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise SweepInputError(
                "sweep_results_dir", f"cannot be written on the controller: {self.path}: {exc.strerror or exc}"
            ) from None

    def check_writable(self) -> None:
        """Like ensure_writable, without creating anything (check mode): the nearest existing directory must be
        writable."""
        existing = self.points_dir
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise SweepInputError(
                "sweep_results_dir", f"cannot be written on the controller: {existing} is not a directory"
            )
        if not os.access(existing, os.W_OK | os.X_OK):
            raise SweepInputError(
                "sweep_results_dir", f"cannot be written on the controller: {existing} is not writable"
            )

    def read_definition(self) -> dict | None:
        try:
            with open(self.definition_path, encoding="utf-8") as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise SweepInputError(
                "sweep_results_dir", f"holds an unreadable {DEFINITION_FILE} ({exc}); move it away or pick another"
            ) from None

    def level_path(self, point_id: str, concurrency: int) -> str:
        return os.path.join(self.points_dir, point_id, f"c{int(concurrency):04d}.json")

    def level_records(self) -> list:
        """Every recorded level, sorted by point id and concurrency; unreadable files are skipped (a write cut
        short)."""
        records = []
        if not os.path.isdir(self.points_dir):
            return records
        for point in sorted(os.listdir(self.points_dir)):
            folder = os.path.join(self.points_dir, point)
            if not os.path.isdir(folder):
                continue
            for name in sorted(os.listdir(folder)):
                if not (name.startswith("c") and name.endswith(".json")):
                    continue
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as handle:
                        records.append(json.load(handle))
                except (OSError, ValueError):
                    continue
        return records

    def write_level(self, record: dict) -> str:
        path = self.level_path(record["point"]["id"], record["concurrency"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, _dump(record))
        return path

    def write_arm(self, record: dict) -> str:
        """One arm's level of one round of the proof."""
        name = f"r{int(record['round'])}-c{int(record['concurrency'])}.json"
        path = os.path.join(self.path, PROVE_DIR, record["point"]["id"], name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, _dump(record))
        return path

    def arm_records(self) -> list:
        """Every recorded arm level of the proof; unreadable files are skipped (a write cut short)."""
        records = []
        root = os.path.join(self.path, PROVE_DIR)
        for arm in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            folder = os.path.join(root, arm)
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as handle:
                        records.append(json.load(handle))
                except (OSError, ValueError):
                    continue
        return records

    def done_levels(self, retry_failed: bool = False) -> dict:
        """{point id: [concurrency, ...]} recorded (failed ones too, unless ``retry_failed``)."""
        done = {}
        for record in self.level_records():
            if retry_failed and record.get("status") != "measured":
                continue
            done.setdefault(record["point"]["id"], []).append(record["concurrency"])
        return done

    def write_file(self, name: str, data: bytes) -> str:
        path = os.path.join(self.path, name)
        atomic_write(path, data)
        return path

    def _move_aside(self, now: float) -> str | None:
        """Move an earlier run's files into replaced-<UTC time>/; return that directory, or None if none."""
        entries = [
            name
            for name in (os.listdir(self.path) if os.path.isdir(self.path) else [])
            if name in (DEFINITION_FILE, POINTS_DIR) or name.startswith(REPORT_PREFIX)
        ]
        if not entries or (entries == [POINTS_DIR] and not os.listdir(self.points_dir)):
            return None
        aside = os.path.join(self.path, f"replaced-{_utc_stamp(now)}")
        os.makedirs(aside, exist_ok=True)
        for name in entries:
            os.replace(os.path.join(self.path, name), os.path.join(aside, name))
        return aside

    def start_run(self, definition: dict, resume: bool, run: dict, now: float, retry_failed: bool = False) -> dict:
        """Begin a run: check or replace earlier results; return {"done": {id: [levels]}, "replaced": dir or None}.

        With ``resume``, earlier results must come from the same measurement (MEASUREMENT_KEYS) or the
        numbers would not compare (points and load levels may differ: new ones are measured), and recorded
        levels count as done (failed ones too, unless ``retry_failed``); without it, earlier results are moved
        aside, never deleted.
        """
        self.ensure_writable()
        earlier = self.read_definition()
        replaced = None
        if resume and earlier is not None:
            before = earlier.get("definition", {})
            differ = [key for key in MEASUREMENT_KEYS if before.get(key) != definition.get(key)]
            if differ:
                raise SweepInputError(
                    "sweep_resume",
                    f"is true but {self.path} holds a sweep measured differently (differs in: {', '.join(differ)}; "
                    f"before: {json.dumps({key: before.get(key) for key in differ}, sort_keys=True)}); set "
                    "sweep_resume: false to start over (earlier results are moved aside) or use another "
                    "sweep_results_dir",
                )
        elif not resume:
            replaced = self._move_aside(now)
            earlier = None
        os.makedirs(self.points_dir, exist_ok=True)
        runs = list((earlier or {}).get("runs", []))
        runs.append(run)
        self.write_file(DEFINITION_FILE, _dump({"definition": definition, "runs": runs}))
        done = self.done_levels(retry_failed) if resume else {}
        return {"done": done, "replaced": replaced}
