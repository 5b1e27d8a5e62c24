# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Several load levels in one benchmark, on one server: the levels in the order given, the warm-up before the
first only, each level ended at its own budget, and each level's result kept in a progress file as soon as the
level ends, so that a benchmark cut short (its task timed out, its controller gone) leaves what it finished.

Private to the llmops.inference collection; not a public API. Standard library plus bench.py, engine_times.py,
atomic_file.py and redact.py.

The progress file is JSON, replaced atomically (atomic_file.atomic_write) when the benchmark starts and at each
level's start and end::

    {"context": {...},            the caller's data, kept as given (for whoever reads the file back)
     "planned": [1, 8, 32],       the levels' concurrencies, in order
     "levels": [{...}, ...],      the result of each level that ended, as run_levels returns it
     "running": {"concurrency": 8, "level_started_at": 1764620000.5} or null,
     "not_run": [32],             levels left out because an earlier one failed (stop_on_failure)
     "finished": false,           true once the benchmark ended by itself
     "updated_at": 1764620001.2}

Times are seconds since the epoch on this host's clock. Every string in the file is redacted (redact.py).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import atomic_write
from ansible_collections.llmops.inference.plugins.module_utils.bench import (
    BenchInputError,
    BenchSettings,
    run_benchmark,
)
from ansible_collections.llmops.inference.plugins.module_utils.engine_times import (
    engine_times,
    journal_tail,
    same_engine,
)
from ansible_collections.llmops.inference.plugins.module_utils.redact import Redactor

# The keys of one entry of sglang_bench's ``levels`` option.
LEVEL_OPTIONS = ("concurrency", "num_prompts", "budget_s")
PROGRESS_FILE_MODE = 0o600
PROGRESS_DIR_MODE = 0o700


@dataclass(frozen=True)
class BenchLevel:
    """One load level: requests in flight at most, measured requests per run, and the seconds it may take."""

    concurrency: int
    num_prompts: int
    budget_s: float | None = None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_levels(levels, default_num_prompts: int) -> list:
    """``levels`` as BenchLevel entries, in the order given; each ``num_prompts`` defaults to
    ``default_num_prompts``. Raises BenchInputError naming the entry and its key."""
    accepted = ", ".join(LEVEL_OPTIONS)
    if not isinstance(levels, list) or not levels:
        raise BenchInputError("levels", f"must list at least one level, each a mapping of {accepted}; got {levels!r}")
    parsed = []
    for index, entry in enumerate(levels):
        name = f"levels[{index}]"
        if not isinstance(entry, dict):
            raise BenchInputError(name, f"must be a mapping of {accepted} (concurrency required), got {entry!r}")
        unknown = sorted(set(entry) - set(LEVEL_OPTIONS))
        if unknown:
            raise BenchInputError(name, f"has unknown keys {unknown}; accepted: {accepted}")
        concurrency = entry.get("concurrency")
        if not _is_int(concurrency) or concurrency < 1:
            raise BenchInputError(f"{name}.concurrency", f"must be an integer >= 1, got {concurrency!r}")
        num_prompts = default_num_prompts if entry.get("num_prompts") is None else entry["num_prompts"]
        if not _is_int(num_prompts) or num_prompts < 1:
            raise BenchInputError(f"{name}.num_prompts", f"must be an integer >= 1, got {num_prompts!r}")
        budget_s = entry.get("budget_s")
        if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))):
            raise BenchInputError(f"{name}.budget_s", f"must be a number of seconds > 0, got {budget_s!r}")
        if budget_s is not None and budget_s <= 0:
            raise BenchInputError(f"{name}.budget_s", f"must be a number of seconds > 0, got {budget_s!r}")
        if any(level.concurrency == concurrency for level in parsed):
            raise BenchInputError(
                f"{name}.concurrency", f"{concurrency} is listed twice; each level needs a concurrency of its own"
            )
        parsed.append(BenchLevel(concurrency, num_prompts, None if budget_s is None else float(budget_s)))
    return parsed


def check_progress_path(path) -> str:
    if not isinstance(path, str) or not os.path.isabs(path) or path.endswith("/"):
        raise BenchInputError("progress_path", f"must be the absolute path of a file on the host, got {path!r}")
    return os.path.normpath(path)


class EngineWatch:
    """Which engine process of ``unit`` serves each level, and whether another one served by its end."""

    def __init__(self, run_command, unit: str):
        self.run_command = run_command
        self.unit = unit
        self._engine = None

    def before(self) -> dict:
        """The engine now: one full reading (with its ready time from the journal) per engine process."""
        if self._engine is None:
            self._engine = engine_times(self.run_command, self.unit)
        return self._engine

    def restarted(self, before: dict) -> bool:
        """Whether the unit is now served by another engine process than ``before`` (or by none)."""
        now = engine_times(self.run_command, self.unit, ready=False)
        if same_engine(before, now):
            return False
        self._engine = None
        return True

    def journal_tail(self) -> list:
        return journal_tail(self.run_command, self.unit)


def level_failed(result: dict) -> bool:
    """Whether a level's result shows a failure: a failed request (warm-up too), a request not sent, or another
    engine process by the level's end."""
    return bool(
        result.get("failed_requests")
        or (result.get("warmup") or {}).get("failed_requests")
        or result.get("stopped_early")
        or result.get("engine_restarted")
    )


def measure(settings: BenchSettings, client_factory, watch: EngineWatch | None = None, budget_s=None) -> dict:
    """One level: run_benchmark, plus the engine that served it and the journal when something failed."""
    engine = watch.before() if watch is not None else None
    result = run_benchmark(settings, client_factory, budget_s=budget_s)
    if watch is not None:
        result["engine"] = engine
        result["engine_restarted"] = watch.restarted(engine)
        if level_failed(result):
            result["journal_tail"] = watch.journal_tail()
    return result


class BenchProgress:
    """The progress file: see the module docstring. Only ``start`` creates the file's directory (mode 0700) and
    raises OSError; a later write that fails is kept in ``error`` and the benchmark goes on."""

    def __init__(self, path: str, context: dict | None, planned: list, secrets=(), write: bool = True):
        self.path = path
        self.write = write
        self.redactor = Redactor(secrets)
        self.error = None
        self.document = {
            "context": context or {},
            "planned": list(planned),
            "levels": [],
            "running": None,
            "not_run": [],
            "finished": False,
            "updated_at": None,
        }

    def _save(self) -> None:
        self.document["updated_at"] = time.time()
        if not self.write:
            return
        data = (json.dumps(self.redactor.value(self.document), sort_keys=True) + "\n").encode("utf-8")
        atomic_write(self.path, data, mode=PROGRESS_FILE_MODE)

    def _save_quietly(self) -> None:
        try:
            self._save()
        except OSError as exc:
            self.error = self.error or f"{self.path}: {exc.strerror or exc}"

    def start(self) -> None:
        if self.write:
            os.makedirs(os.path.dirname(self.path), mode=PROGRESS_DIR_MODE, exist_ok=True)
        self._save()

    def level_started(self, concurrency: int, at: float) -> None:
        self.document["running"] = {"concurrency": concurrency, "level_started_at": at}
        self._save_quietly()

    def level_ended(self, result: dict) -> None:
        self.document["levels"].append(result)
        self.document["running"] = None
        self._save_quietly()

    def finish(self, not_run: list) -> None:
        self.document.update(not_run=list(not_run), finished=True)
        self._save_quietly()


def run_levels(
    settings: BenchSettings,
    levels: list,
    client_factory,
    watch: EngineWatch | None = None,
    progress: BenchProgress | None = None,
) -> dict:
    """Measure ``levels`` (BenchLevel) in order with ``settings`` for everything else: the warm-up
    (``settings.warmup_requests``) before the first level only, ``settings.repeats`` runs per level, each level
    ended at its ``budget_s``. With ``settings.stop_on_failure`` a level that fails (level_failed) also ends the
    benchmark: the later levels are not run. Each level's result is run_benchmark's (with ``engine``,
    ``engine_restarted`` and, when it failed, ``journal_tail`` given a ``watch``) plus ``concurrency``,
    ``level_started_at``, ``level_ended_at`` (epoch seconds) and ``budget_s``.

    Returns {"levels": [result of each level run], "levels_not_run": [concurrency, ...]}.
    """
    ran, not_run = [], []
    for index, level in enumerate(levels):
        if settings.stop_on_failure and ran and level_failed(ran[-1]):
            not_run.extend(later.concurrency for later in levels[index:])
            break
        level_settings = BenchSettings(
            **dict(
                vars(settings),
                concurrency=level.concurrency,
                num_prompts=level.num_prompts,
                warmup_requests=settings.warmup_requests if index == 0 else 0,
            )
        )
        started_at = time.time()
        if progress is not None:
            progress.level_started(level.concurrency, started_at)
        result = measure(level_settings, client_factory, watch, level.budget_s)
        result.update(
            concurrency=level.concurrency,
            level_started_at=started_at,
            level_ended_at=time.time(),
            budget_s=level.budget_s,
        )
        result.setdefault("out_of_budget", False)
        ran.append(result)
        if progress is not None:
            progress.level_ended(result)
    if progress is not None:
        progress.finish(not_run)
    return {"levels": ran, "levels_not_run": not_run}
