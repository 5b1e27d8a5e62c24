# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What every tier of the SGLang probe works with: the settings, the client, the host readers, and how a tier ends
early (a failure, fatal or not, or a skip).

Private to the llmops.inference collection; not a public API.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import ProbeSettings
from ansible_collections.llmops.inference.plugins.module_utils.procs import read_process


class TierFailure(Exception):
    """Raised inside a tier check; ``fatal`` stops a wait (a dead or restarted unit never recovers by waiting)."""

    def __init__(self, reason: str, fatal: bool = False):
        super().__init__(reason)
        self.fatal = fatal


class TierSkip(Exception):
    """The tier does not apply (no unit given, no floors set)."""


@dataclass
class ProbeHost:
    """The host readers: ``unit_reader(unit) -> UnitState``, ``unit_pids(unit) -> [pid]``, ``gpu_reader() -> [Gpu]``
    and ``process_reader(pid) -> ProcessInfo | None`` (systemd, /proc, NVML or nvidia-smi), and the clock."""

    unit_reader: object = None
    unit_pids: object = None
    gpu_reader: object = None
    clock: object = time.monotonic
    sleep: object = time.sleep
    process_reader: object = read_process


class ProbeBase:
    """The state a probe's tiers share; ``client`` is an SglangClient."""

    def __init__(self, settings: ProbeSettings, client, host: ProbeHost | None = None):
        host = host or ProbeHost()
        self.settings = settings
        self.client = client
        self.unit_reader = host.unit_reader
        self.unit_pids = host.unit_pids
        self.gpu_reader = host.gpu_reader
        self.process_reader = host.process_reader
        self.clock = host.clock
        self.sleep = host.sleep
        self._baseline = None
        self._baseline_at = None
