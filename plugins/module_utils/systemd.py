# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unit state from `systemctl show` and `systemctl list-units`.

Private to the llmops.inference collection; not a public API. Needs only the Python standard library.
Commands run through a ``run_command(args) -> (rc, stdout, stderr)`` callable; AnsibleModule.run_command fits.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields

SHOW_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "NRestarts",
    "ControlGroup",
    "ExecMainStatus",
    "ExecMainCode",
    "InvocationID",
    "ActiveEnterTimestampMonotonic",
)
# States in which systemd still runs, starts or stops the unit's processes. "activating" covers a
# unit in its Restart= wait (SubState=auto-restart), the state of a restart loop.
RUNNING_STATES = ("active", "activating", "deactivating", "reloading", "refreshing")
UNIT_TYPES = (
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".slice",
    ".scope",
)


_TIMESPAN_UNITS = {
    "us": 1e-6,
    "usec": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "min": 60.0,
    "m": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "M": 2629800.0,
    "y": 31557600.0,
}
_TIMESPAN_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)")


class SystemdError(Exception):
    """systemctl failed or answered something unreadable."""


def parse_timespan(text: str | None) -> float | None:
    """Seconds in a time span as `systemctl show` prints it (``1h 30s``, ``500ms``, ``0``); None for
    ``infinity`` or text it cannot read. A bare number is seconds."""
    text = (text or "").strip()
    if not text or text == "infinity":
        return None
    total, end = 0.0, 0
    for match in _TIMESPAN_PART.finditer(text):
        if text[end : match.start()].strip():
            return None
        unit = match.group(2) or "s"
        if unit not in _TIMESPAN_UNITS:
            return None
        total += float(match.group(1)) * _TIMESPAN_UNITS[unit]
        end = match.end()
    return total if not text[end:].strip() and end else None


def _int_or(value: str | None, default):
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


@dataclass
class UnitState:
    name: str
    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    result: str = ""
    main_pid: int = 0
    n_restarts: int = 0
    control_group: str = ""
    exec_main_status: int | None = None
    properties: dict = field(default_factory=dict)

    @property
    def is_active(self) -> bool:
        """ActiveState is exactly `active`."""
        return self.active_state == "active"

    @property
    def is_running(self) -> bool:
        """systemd still manages live processes of the unit (active, starting, stopping, restarting)."""
        return self.active_state in RUNNING_STATES

    @property
    def is_loaded(self) -> bool:
        return self.load_state == "loaded"

    @classmethod
    def from_properties(cls, name: str, props: dict) -> UnitState:
        return cls(
            name=props.get("Id") or name,
            load_state=props.get("LoadState", ""),
            active_state=props.get("ActiveState", ""),
            sub_state=props.get("SubState", ""),
            result=props.get("Result", ""),
            main_pid=_int_or(props.get("MainPID"), 0),
            n_restarts=_int_or(props.get("NRestarts"), 0),
            control_group=props.get("ControlGroup", ""),
            exec_main_status=_int_or(props.get("ExecMainStatus"), None),
            properties=dict(props),
        )

    def as_dict(self) -> dict:
        """Every field but the raw ``properties``."""
        return {item.name: getattr(self, item.name) for item in fields(self) if item.name != "properties"}


def systemd_booted(root: str = "/") -> bool:
    """True when systemd is the init system (the check sd_booted(3) documents)."""
    return os.path.isdir(os.path.join(root, "run/systemd/system"))


def normalize_unit_name(unit: str) -> str:
    """`foo` -> `foo.service`, as systemctl itself does; names with a unit type suffix stay."""
    unit = unit.strip()
    return unit if unit.endswith(UNIT_TYPES) else unit + ".service"


def parse_show(text: str) -> dict:
    """Parse one `systemctl show` block of KEY=VALUE lines (values may contain '=')."""
    props = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key:
            props[key.strip()] = value
    return props


def show_unit(run_command, unit: str, properties=SHOW_PROPERTIES) -> UnitState:
    name = normalize_unit_name(unit)
    rc, out, err = run_command(["systemctl", "show", name, "--property=" + ",".join(properties), "--no-pager"])
    if rc != 0:
        raise SystemdError(f"systemctl show {name} failed (rc={rc}): {(err or out).strip()}")
    return UnitState.from_properties(name, parse_show(out))


def parse_list_units(text: str) -> dict:
    """Parse `systemctl list-units --plain --no-legend` lines into {unit: active_state}.

    Failed or not-found units may carry a leading status bullet, which is skipped.
    """
    states = {}
    for line in text.splitlines():
        fields = line.split()
        while fields and not fields[0][:1].isalnum() and "." not in fields[0]:
            fields = fields[1:]
        if len(fields) >= 3:
            states[fields[0]] = fields[2]
    return states


def list_units(run_command, types=("service", "scope")) -> dict:
    """All loaded units of ``types`` with their ActiveState."""
    args = ["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", "--full"]
    if types:
        args.append("--type=" + ",".join(types))
    rc, out, err = run_command(args)
    if rc != 0:
        raise SystemdError(f"systemctl list-units failed (rc={rc}): {(err or out).strip()}")
    return parse_list_units(out)


def list_running_units(run_command, types=("service", "scope")) -> dict:
    """Units whose processes systemd still manages: {unit: active_state}."""
    return {name: state for name, state in list_units(run_command, types).items() if state in RUNNING_STATES}
