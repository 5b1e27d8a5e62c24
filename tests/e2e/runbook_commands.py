"""The commands of the runbooks (docs/runbooks/*.md), as a lab host runs them (docs/README.md, "Running a runbook on
a lab host"): every line of a ``sh`` block, its continuation lines joined, with the lab form a
``# on a lab host: ...`` comment after it gives, or the reason a ``# not on a lab host: ...`` comment gives."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
# The runbooks of single-node engines, and the one of a two-node engine (it needs a two-host group of its own).
SINGLE_NODE = (
    "active_but_not_serving.md",
    "broken_patched_runtime.md",
    "gpu_needs_reset.md",
    "orphaned_gpu_holders.md",
    "reference_gate_rollback.md",
)
TWO_NODE = "two_node_engine.md"
ON_THE_LAB = (*SINGLE_NODE, TWO_NODE)
BLOCK = re.compile(r"^( *)```sh\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
ON_LAB = "# on a lab host:"
NOT_ON_LAB = "# not on a lab host:"
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S+$")


@dataclass
class Command:
    runbook: str
    block: int
    text: str  # as the runbook writes it
    lab: str | None = None  # what a lab host runs instead
    not_on_lab: str | None = None  # why a lab host does not run it

    @property
    def controller(self) -> bool:
        """Lines that start with ansible run on the controller, every other line on the host."""
        return self.text.split()[0] in ("ansible", "ansible-playbook")


def commands(name: str) -> list[Command]:
    """The commands of runbook ``name`` in order; an assignment (PY=...) is kept as a command of its own."""
    found = []
    text = (RUNBOOKS / name).read_text()
    for index, match in enumerate(BLOCK.finditer(text)):
        lines = textwrap.dedent(match.group(2)).splitlines()
        joined, pending = [], ""
        for line in lines:
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            joined.append((pending + line.strip()) if pending else line.strip())
            pending = ""
        for line in joined:
            if line.startswith(ON_LAB) and found and found[-1].block == index:
                found[-1].lab = line[len(ON_LAB) :].strip()
            elif line.startswith(NOT_ON_LAB) and found and found[-1].block == index:
                found[-1].not_on_lab = line[len(NOT_ON_LAB) :].strip()
            elif line and not line.startswith("#"):
                found.append(Command(name, index, re.sub(r"\s+#\s.*$", "", line)))
    return found


def is_assignment(command: Command) -> bool:
    return bool(ASSIGNMENT.match(command.text))
