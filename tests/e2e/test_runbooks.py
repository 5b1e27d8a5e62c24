"""Every command of the single-node runbooks (docs/runbooks/) runs on a lab host as written, with the lab's names, or
as the runbook says to run it there (docs/README.md, "Running a runbook on a lab host"): on a 2-host lab fleet that
the deploy playbook deployed, in the runbooks' order, the host's commands inside the host and the ansible ones on
the controller against the lab's inventory. A command passes when it exits 0 and says nothing of a broken pipe."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from labutil import DEPLOY, LAB_LAYER, REPO, fleet_of, output
from labutil import run_playbook as run
from runbook_commands import SINGLE_NODE, commands, is_assignment

pytestmark = pytest.mark.lab

# The runbooks' example names, and the lab's.
LAB_UNIT = "sglang"
EXAMPLE_UNIT = "sglang-qwen"
EXAMPLE_HOST = "gpu-17"
BROKEN = ("Pipe to stdout was broken", "Broken pipe", "command not found")


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    lab.reset_used()
    fleet = fleet_of(lab, 2)
    proc, _records = run(fleet, DEPLOY, tmp_path_factory.mktemp("runbooks"), "deploy", {"deploy_batch": "100%"})
    assert proc.returncode == 0, output(proc)
    yield fleet
    lab.reset()


def as_in_the_lab(text: str, lab, host: str) -> str:
    text = text.replace(EXAMPLE_UNIT, LAB_UNIT).replace(EXAMPLE_HOST, host)
    inventories = f"-i {shlex.quote(str(lab.inventory))} -i {shlex.quote(str(LAB_LAYER))}"
    for given in ("-i inventory/ ", "-i inventory "):
        text = text.replace(given, inventories + " ")
    if text.startswith("ansible ") and " -i " not in text:
        text = text.replace("ansible ", f"ansible {inventories} ", 1)
    return text


@pytest.mark.parametrize("runbook", SINGLE_NODE)
def test_every_command_of_the_runbook_runs_on_a_lab_host(fleet, runbook):
    host = fleet.hosts[0]
    prelude, ran, failures = [], [], []
    for command in commands(runbook):
        if command.not_on_lab:
            continue
        text = as_in_the_lab(command.lab or command.text, fleet, host)
        if is_assignment(command):
            prelude.append(text)
            continue
        if command.controller:
            env = fleet.env()
            proc = subprocess.run(
                ["bash", "-c", text], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=900
            )
        else:
            proc = fleet.exec(host, "; ".join([*prelude, text]), timeout=300)
        ran.append(text)
        said = proc.stdout + proc.stderr
        if proc.returncode != 0 or any(word in said for word in BROKEN):
            failures.append(f"$ {text}\nrc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    assert ran, f"{runbook} has no command to run"
    assert not failures, "\n\n".join(failures)
