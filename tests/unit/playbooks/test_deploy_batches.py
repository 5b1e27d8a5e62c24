"""The rolling deploy's batches (playbooks/deploy.yml): in the order of deploy_hosts, as its preflight play ran them,
whatever order group_by filled the rollout group in (the order the hosts' results came back), and the hosts of a
multi-node engine always in one batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "playbooks" / "deploy.yml"
COLLECTIONS = str(REPO / "build" / "collections")  # make collection-link
HOSTS = ["h1", "h2", "h3", "h4", "h5"]
PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
PREFLIGHT = "Deploy - preflight every host (nothing changes)"
BATCHES = "Deploy - one batch at a time"


PLAN = "Plan the batches"


def deploy_play(name: str, label: str, tasks: tuple = ()) -> dict:
    """A play of deploy.yml with its host selection, batching and knobs, its ``tasks`` named, and a task that reports
    its batch under `label`."""
    play = next(play for play in yaml.safe_load(DEPLOY.read_text()) if play["name"] == name)
    kept = {key: play[key] for key in ("name", "hosts", "gather_facts", "serial", "vars") if key in play}
    batch = "{{ ansible_play_batch | join(',') }}"
    report = {"ansible.builtin.debug": {"msg": f"BATCH {label} {batch}"}, "run_once": True}
    return {**kept, "tasks": [task for task in play["tasks"] if task["name"] in tasks] + [report]}


def run(tmp_path: Path, arrival: list[str], node_groups: dict | None = None, **knobs: str) -> dict:
    """The preflight play's and the batch play's batches (and the output) when the hosts of `arrival` are not up
    to date and the rollout group was filled in that order; `node_groups` gives hosts sglang_service_node_group."""
    fill = {
        "name": "Fill the rollout group as group_by would when results come back in this order",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "ansible.builtin.add_host": {"name": "{{ item }}", "groups": "llmops_deploy_rollout"},
                "loop": arrival,
            }
        ],
    }
    preflight = deploy_play(PREFLIGHT, "preflight", (PLAN,))
    state = {
        "__fleet_before": {"up_to_date": "{{ inventory_hostname not in " + repr(arrival) + " }}"},
        # What the role's facts entry point gives (tasks/host_facts.yml runs it in the real preflight).
        "sglang_service_facts": {"node_group": "{{ sglang_service_node_group }}"},
        # Every host passed its preflight (tasks/preflight_verdict.yml): all go on.
        "__preflight_verdict": {"go": "{{ ansible_play_hosts }}", "records": {}},
    }
    preflight["tasks"].insert(0, {"name": "Record the state", "ansible.builtin.set_fact": state})
    playbook = tmp_path / "batches.yml"
    plays = [preflight, fill, deploy_play(BATCHES, "batch")]
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    inventory = tmp_path / "inventory.yml"
    hosts = {host: {"ansible_connection": "local", "sglang_service_node_group": (node_groups or {}).get(host, [])}
             for host in HOSTS}  # fmt: skip
    inventory.write_text(yaml.safe_dump({"sglang_fleet": {"hosts": hosts}}))
    extra = [arg for name, value in knobs.items() for arg in ("-e", f"{name}={value}")]
    proc = subprocess.run(
        [str(PLAYBOOK), "-i", str(inventory), str(playbook), *extra],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_COLLECTIONS_PATH": COLLECTIONS},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found: dict[str, list[list[str]]] = {"preflight": [], "batch": []}
    for label, batch in re.findall(r'"msg": "BATCH (preflight|batch) ([^"]*)"', proc.stdout):
        found[label].append(batch.split(","))
    return {**found, "output": proc.stdout + proc.stderr}


@pytest.mark.parametrize("arrival", [["h5", "h3", "h1", "h4"], ["h1", "h3", "h4", "h5"], ["h4", "h5", "h3", "h1"]])
def test_batches_follow_the_inventory_whatever_order_the_group_was_filled_in(tmp_path, arrival):
    result = run(tmp_path, arrival, deploy_batch="2")
    assert result["preflight"] == [HOSTS]
    assert result["batch"] == [["h1", "h3"], ["h4", "h5"]]


def test_batches_follow_a_host_list_in_the_order_it_names_them(tmp_path):
    result = run(tmp_path, ["h1", "h2", "h4"], deploy_hosts="h4,h2,h1", deploy_batch="1")
    assert result["preflight"] == [["h4", "h2", "h1"]]
    assert result["batch"] == [["h4"], ["h2"], ["h1"]]


def test_a_host_pattern_keeps_its_exclusions(tmp_path):
    result = run(tmp_path, ["h5", "h3", "h1"], deploy_hosts="sglang_fleet:!h2:!h4", deploy_batch="100%")
    assert result["batch"] == [["h1", "h3", "h5"]]


def test_no_batch_runs_and_nothing_warns_when_every_host_is_up_to_date(tmp_path):
    result = run(tmp_path, [], deploy_batch="2")
    assert result["batch"] == []
    assert "Could not match" not in result["output"] and "WARNING" not in result["output"], result["output"]


def test_the_hosts_of_a_multi_node_engine_are_one_batch_and_deploy_together(tmp_path):
    # h2 and h4 are the ranks of one engine; only h4 is not up to date, and both are deployed, in one batch.
    engine = ["h2", "h4"]
    groups = {"h2": engine, "h4": engine}
    result = run(tmp_path, ["h4", "h5"], groups, deploy_batch="1")
    assert result["batch"] == [["h2", "h4"], ["h5"]]
    result = run(tmp_path, ["h1", "h2", "h3", "h4", "h5"], groups, deploy_batch="2")
    assert result["batch"] == [["h1"], ["h2", "h4"], ["h3", "h5"]]
