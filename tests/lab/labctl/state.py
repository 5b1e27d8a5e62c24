"""Where a lab instance keeps its state, and the lab-wide lock that allocates subnets."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .system import exclusive

RUN_ROOT = Path(os.environ.get("LLMOPS_LAB_RUN", "/run/llmops-lab"))
HOSTS_ROOT = Path(os.environ.get("LLMOPS_LAB_HOSTS_ROOT", "/var/lib/llmops-lab"))
NAME_RE = re.compile(r"^[a-z](?:[a-z0-9]{0,4}[a-z])?$")
SUBNET_PREFIX = "10.213"
MAX_HOSTS = 127  # two addresses per host (host side, container side) in one /24


class LabState:
    """State of one named lab: ``/run/llmops-lab/<name>/state.json`` plus per-host directories."""

    def __init__(self, name: str):
        self.name = name
        self.run_dir = RUN_ROOT / name
        self.hosts_dir = HOSTS_ROOT / name
        self.file = self.run_dir / "state.json"
        self.inventory = self.run_dir / "inventory.yml"
        self.key = self.run_dir / "id_ed25519"

    def load(self) -> dict:
        try:
            return json.loads(self.file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def save(self, data: dict) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, self.file)

    def host_name(self, index: int) -> str:
        return f"{self.name}{index}"

    def host_dir(self, host: str) -> Path:
        return self.hosts_dir / host


def global_lock():
    """Serialise subnet allocation between labs started at the same time."""
    return exclusive(RUN_ROOT / ".lock")


def allocate_subnet(name: str) -> int:
    """The third octet of this lab's /24: its previous one, else the lowest one no other lab uses."""
    used = {}
    for state_file in RUN_ROOT.glob("*/state.json"):
        try:
            data = json.loads(state_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if "subnet" in data:
            used[data["subnet"]] = state_file.parent.name
    for octet, owner in used.items():
        if owner == name:
            return octet
    for octet in range(256):
        if octet not in used:
            return octet
    raise RuntimeError("no free lab subnet left in 10.213.0.0/16")


def addresses(subnet: int, index: int) -> tuple[str, str]:
    """(host-side, container-side) addresses of host ``index`` (1-based)."""
    return f"{SUBNET_PREFIX}.{subnet}.{2 * index - 1}", f"{SUBNET_PREFIX}.{subnet}.{2 * index}"
