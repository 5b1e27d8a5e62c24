"""The runbooks' commands as tests/e2e/test_runbooks.py runs them on a lab host: parsed the same way, each that a lab
host cannot run as written says what to run there or why not, and none pipes into head (pip then prints "ERROR: Pipe
to stdout was broken")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PARSER = Path(__file__).resolve().parents[2] / "e2e" / "runbook_commands.py"
_spec = importlib.util.spec_from_file_location("runbook_commands", PARSER)
runbook_commands = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("runbook_commands", runbook_commands)  # its dataclass looks its module up there
_spec.loader.exec_module(runbook_commands)
# What lab hosts lack (docs/README.md, "Running a runbook on a lab host"; nor do they ssh to one another): a command
# that needs it has a lab form.
LAB_LACKS = ("curl ", "ssh ", "sglang==", "/proc/<pid>", "--gpu-reset", "/dev/nvidia")


@pytest.mark.parametrize("runbook", runbook_commands.ON_THE_LAB)
def test_the_runbook_has_commands_and_each_that_a_lab_host_lacks_says_what_to_run_there(runbook):
    found = runbook_commands.commands(runbook)
    assert found, f"{runbook} has no sh block"
    for command in found:
        if any(word in command.text for word in LAB_LACKS):
            assert command.lab or command.not_on_lab, f"{runbook}: no lab form for: {command.text}"
        if command.not_on_lab is not None:
            assert len(command.not_on_lab) > 10, f"{runbook}: say why it does not run on a lab host: {command.text}"


@pytest.mark.parametrize("runbook", sorted(path.name for path in runbook_commands.RUNBOOKS.glob("*.md")))
def test_no_runbook_command_pipes_into_head(runbook):
    piped = [command.text for command in runbook_commands.commands(runbook) if "| head" in command.text]
    assert piped == [], f"{runbook}: head closes the pipe early, and pip then says 'Pipe to stdout was broken'"


def test_continuation_lines_and_lab_forms_are_read():
    found = runbook_commands.commands("broken_patched_runtime.md")
    generate = next(command for command in found if command.text.startswith("curl") and "/generate" in command.text)
    assert generate.text.endswith('"temperature": 0}}\'') and generate.lab.startswith("python3 -c")
    assert runbook_commands.is_assignment(found[0]) and found[0].text == "PY=/opt/sglang/venv/bin/python"
