"""Every command of the runbooks (docs/runbooks/) runs on a lab host as written, with the lab's names, or as the
runbook says to run it there (docs/README.md, "Running a runbook on a lab host"), in the runbook's order, the host's
commands inside the host and the ansible ones on the controller against the lab's inventory. The single-node
runbooks run on a 2-host lab fleet that the deploy playbook deployed; two_node_engine.md on the lab's first two hosts
as the runbook's group, from its deploy to its rollback. A command passes when it exits 0 and says nothing of a
broken pipe."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import yaml
from gateway_lab import connect_hosts
from labutil import DEPLOY, LAB_LAYER, PLAYBOOKS, REPO, fleet_of, output, recap, wait_healthy
from labutil import run_playbook as run
from runbook_commands import SINGLE_NODE, TWO_NODE, commands, is_assignment

pytestmark = pytest.mark.lab

# The runbooks' example names, and the lab's.
LAB_UNIT = "sglang"
EXAMPLE_UNIT = "sglang-qwen"
EXAMPLE_HOST = "gpu-17"
BROKEN = ("Pipe to stdout was broken", "Broken pipe", "command not found")
# two_node_engine.md's: its group, its two hosts (rank 0, rank 1) and the play that applies the role (the lab's).
GROUP = "deepseek_v3"
EXAMPLE_RANKS = ("gpu-c01.example.net", "gpu-c02.example.net")
EXAMPLE_PLAY = "your_playbook.yml"
LAB_PLAY = PLAYBOOKS / "service_role.yml"
# What the two-node runbook runs against the group, from inventory to rollback.
STEPS = (
    "inference.deploy ",
    "--tags sglang_service_restart",
    "inference.fleet_probe ",
    "inference.spec_sweep ",
    "inference.rollback ",
)


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    lab.reset_used()
    fleet = fleet_of(lab, 2)
    # The reference gate at its defaults: its runbook reads the reference this deploy records.
    deployed = {"deploy_batch": "100%", "sglang_service_reference": {}}
    proc, _records = run(fleet, DEPLOY, tmp_path_factory.mktemp("runbooks"), "deploy", deployed)
    assert proc.returncode == 0, output(proc)
    yield fleet
    lab.reset()


def as_in_the_lab(text: str, lab, host: str, layers: tuple = ()) -> str:
    text = text.replace(EXAMPLE_UNIT, LAB_UNIT).replace(EXAMPLE_HOST, host)
    inventories = " ".join(f"-i {shlex.quote(str(path))}" for path in (lab.inventory, LAB_LAYER, *layers))
    for given in ("-i inventory/ ", "-i inventory "):
        text = text.replace(given, inventories + " ")
    if text.startswith("ansible ") and " -i " not in text:
        text = text.replace("ansible ", f"ansible {inventories} ", 1)
    return text


@pytest.mark.parametrize("runbook", SINGLE_NODE)
def test_every_command_of_the_runbook_runs_on_a_lab_host(fleet, runbook):
    host = fleet.hosts[0]
    # Each runbook begins where an operator opens it: on a deployed host whose unit runs (the one before it may have
    # ended with the unit stopped, as the orphaned holders' does).
    fleet.exec(host, f"systemctl start {LAB_UNIT}.service", timeout=300)
    wait_healthy(fleet, host)
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
            failures.append(failed(text, proc))
    assert ran, f"{runbook} has no command to run"
    assert not failures, "\n\n".join(failures)


def failed(text: str, proc) -> str:
    return f"$ {text}\nrc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"


def group_layer(lab, tmp_path):
    """The runbook's inventory on the lab's first two hosts: its group, under the lab's group, and its group variables
    in group_vars/ (so that they override the lab's own, group_vars/ too) at the lab's size (2 GPUs a host, tp_size 4,
    a short rendezvous wait); each host hands its gate to the lab's play that applies the role (svc_test_result)."""
    rank0, rank1 = lab.hosts[:2]
    layer = tmp_path / "inventory"
    (layer / "group_vars").mkdir(parents=True)
    hosts = {host: {"svc_test_result": str(tmp_path / f"gate-{host}.json")} for host in (rank0, rank1)}
    group = {"sglang_fleet": {"children": {"lab": {"children": {GROUP: {"hosts": hosts}}}}}}
    (layer / "hosts.yml").write_text(yaml.safe_dump(group))
    variables = {
        "sglang_service_name": "sglang-deepseek",
        "sglang_service_node_group": [rank0, rank1],
        "sglang_service_tp_size": 4,
        "sglang_service_gpus": [0, 1],
        "sglang_service_dist_timeout": 60,
    }
    (layer / "group_vars" / f"{GROUP}.yml").write_text(yaml.safe_dump(variables))
    return layer


def test_every_command_of_the_two_node_runbook_runs_on_a_two_host_lab_group(clean_lab, tmp_path):
    """Deploy, restart by tag, the checks by hand, the fleet probe, a one-point sweep and the rollback, one after the
    other; the controller's commands run in a directory of their own (the sweep writes its results there). A host
    command runs on the host it names (rank 1's name: the second host), else on rank 0. The first command that fails
    ends the test: each needs what the ones before it did."""
    lab = clean_lab
    assert len(lab.hosts) >= 2, "run with two lab hosts at least"
    rank0, rank1 = lab.hosts[:2]
    connect_hosts(lab)  # rank 1 reaches rank 0's rendezvous address
    layer = group_layer(lab, tmp_path)
    workdir = tmp_path / "controller"
    workdir.mkdir()
    found = commands(TWO_NODE)
    assert [command.not_on_lab for command in found if command.not_on_lab] == [], "every command runs on the lab"
    ran = []
    for command in found:
        text = as_in_the_lab(command.lab or command.text, lab, rank0, (layer,))
        text = text.replace(EXAMPLE_PLAY, shlex.quote(str(LAB_PLAY)))
        for example, host in zip(EXAMPLE_RANKS, (rank0, rank1)):
            text = text.replace(example, host)
        if command.controller:
            env = {**lab.env(), "PWD": str(workdir)}
            proc = subprocess.run(
                ["bash", "-c", text], check=False, cwd=workdir, env=env, capture_output=True, text=True, timeout=900
            )
        else:
            proc = lab.exec(rank1 if EXAMPLE_RANKS[1] in command.text else rank0, text, timeout=300)
        said = proc.stdout + proc.stderr
        assert proc.returncode == 0 and not any(word in said for word in BROKEN), failed(text, proc)
        if command.text.startswith("ansible-playbook"):  # a pattern that matches no host runs nothing and exits 0
            assert {rank0, rank1} <= set(recap(proc)), failed(text, proc)
        ran.append(text)
    for step in STEPS:
        assert any(step in text for text in ran), f"no command of {TWO_NODE} runs {step.strip()}: {ran}"
