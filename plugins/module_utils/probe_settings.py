# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sglang_probe options: defaults, and validation that names the wrong option and what it accepts.

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

import re

from ansible_collections.llmops.inference.plugins.module_utils.degenerate import DEFAULT_MIN_DISTINCT_RATIO
from ansible_collections.llmops.inference.plugins.module_utils.module_support import OptionError, OptionSet, refused_as
from ansible_collections.llmops.inference.plugins.module_utils.sglang import DEFAULT_URL, validate_url
from ansible_collections.llmops.inference.plugins.module_utils.systemd import normalize_unit_name

# In the order they run. `progress` runs before the HTTP tiers: a hung engine keeps /server_info and /generate
# waiting (and /health, which runs a generation, on a server without /ready), and the progress verdict takes one
# window at most.
TIER_NAMES = ("unit", "gpu", "progress", "health", "model", "generate", "floors", "soak")
MAX_POLL_INTERVAL = 0.5
DEFAULT_PROMPT = "List the first five prime numbers."
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_MIN_GPU_MEMORY_MIB = 1024
DEFAULT_SOAK_MAX_NEW_TOKENS = 8
DEFAULT_UNACCOUNTED_THRESHOLD_MIB = 1024


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


class ProbeInputError(OptionError):
    """An option is wrong; ``option`` names it and the message says what is accepted."""


# Every probe option with its default.
SETTINGS_DEFAULTS = {
    "url": DEFAULT_URL,
    "unit": None,
    "tiers": None,  # every tier
    "prompt": DEFAULT_PROMPT,
    "max_new_tokens": DEFAULT_MAX_NEW_TOKENS,
    "timeout": 10.0,
    "generate_timeout": 60.0,
    "expected_model": None,
    "expect_regex": None,
    "min_gpu_memory_mib": DEFAULT_MIN_GPU_MEMORY_MIB,
    "expected_gpus": None,
    "tp_size": None,
    "min_tokens_per_s": None,
    "min_accept_length": None,
    "min_distinct_ratio": DEFAULT_MIN_DISTINCT_RATIO,
    "stability_window": 0.0,
    "wait_timeout": 0.0,
    "poll_interval": MAX_POLL_INTERVAL,
    "progress_window": None,
    "progress_require_metrics": False,
    "soak_requests": 0,
    "soak_max_new_tokens": DEFAULT_SOAK_MAX_NEW_TOKENS,
    "unaccounted_threshold_mib": DEFAULT_UNACCOUNTED_THRESHOLD_MIB,
}


def gate_probe_spec() -> dict:
    """The checks of a probe gate as argument-spec options, shared by sglang_probe and sglang_restart's ``probe``."""
    return {
        "expected_model": {"type": "str"},
        "min_gpu_memory_mib": {"type": "int", "default": DEFAULT_MIN_GPU_MEMORY_MIB},
        "max_new_tokens": {"type": "int", "default": DEFAULT_MAX_NEW_TOKENS, "no_log": False},
        "generate_timeout": {"type": "float", "default": SETTINGS_DEFAULTS["generate_timeout"]},
        "min_tokens_per_s": {"type": "float", "no_log": False},
        "min_accept_length": {"type": "float"},
        "tp_size": {"type": "int"},
    }


class ProbeSettings(OptionSet):
    """The probe's options (SETTINGS_DEFAULTS, as keywords); :meth:`validate` names any option that is wrong."""

    DEFAULTS = SETTINGS_DEFAULTS

    def __init__(self, **options):
        super().__init__(**options)
        self.unit = self.unit or None
        self.tiers = list(TIER_NAMES) if self.tiers is None else list(self.tiers)
        self.expected_model = self.expected_model or None
        self.expect_regex = self.expect_regex or None
        self.progress_require_metrics = bool(self.progress_require_metrics)
        if self.soak_requests is None:
            self.soak_requests = 0
        if self.soak_max_new_tokens is None:
            self.soak_max_new_tokens = DEFAULT_SOAK_MAX_NEW_TOKENS
        if self.unaccounted_threshold_mib is None:
            self.unaccounted_threshold_mib = DEFAULT_UNACCOUNTED_THRESHOLD_MIB
        self.gpu_count = None
        self.gpu_selectors = None
        self.pattern = None

    def validate(self) -> ProbeSettings:
        """Check every option; raise ProbeInputError naming the option and what is accepted."""
        with refused_as("url", ProbeInputError):
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
        self._validate_progress_and_soak()
        if self.expect_regex:
            try:
                self.pattern = re.compile(self.expect_regex)
            except re.error as exc:
                raise ProbeInputError(
                    "expect_regex", f"expect_regex does not compile: {exc} (pattern {self.expect_regex!r})"
                ) from None
        with refused_as("expected_gpus", ProbeInputError):
            self.gpu_count, self.gpu_selectors = parse_expected_gpus(self.expected_gpus)
        if self.gpu_count is None and self.gpu_selectors is None and self.tp_size:
            self.gpu_count = self.tp_size
        return self

    def _validate_progress_and_soak(self) -> None:
        window = self.progress_window
        if window is not None:
            _require(
                _is_number(window) and window > 0,
                "progress_window",
                f"progress_window must be a number of seconds greater than 0 (leave it unset to turn the progress "
                f"tier off), got {window!r}",
            )
        _require(
            _is_whole(self.soak_requests) and self.soak_requests >= 0,
            "soak_requests",
            f"soak_requests must be a whole number of requests, 0 (no soak) or more, got {self.soak_requests!r}",
        )
        _require(
            _is_whole(self.soak_max_new_tokens) and self.soak_max_new_tokens >= 1,
            "soak_max_new_tokens",
            f"soak_max_new_tokens must be a whole number of at least 1, got {self.soak_max_new_tokens!r}",
        )
        _require(
            _is_whole(self.unaccounted_threshold_mib) and self.unaccounted_threshold_mib >= 0,
            "unaccounted_threshold_mib",
            "unaccounted_threshold_mib must be a whole number of MiB, 0 or more, "
            f"got {self.unaccounted_threshold_mib!r}",
        )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(condition: bool, option: str, message: str) -> None:
    if not condition:
        raise ProbeInputError(option, message)
