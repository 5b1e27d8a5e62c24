"""The role's node group tasks hand sglang_info every member's published settings. A member that is in the play but
failed before it published them (its variable is undefined) must reach the module as missing, to be refused by name,
not break the template of the other members' task."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.llmops.inference.plugins.module_utils.node_group import NodeGroupError, plan_group

TASKS = Path(__file__).resolve().parents[3] / "roles" / "sglang_service" / "tasks"
VIEW = {
    "node_group": ["gpu-a", "gpu-b"],
    "node_rank": None,
    "tp_size": 4,
    "gpus": ["0", "1"],
    "model_path": "Qwen/Qwen3-32B",
    "dist_init_addr": "",
    "dist_init_port": 20000,
    "address": "10.0.0.1",
}


def trusted(value):
    """The task's text as Ansible reads it from a role file: trusted to hold templates."""
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return trust_as_template(value) if isinstance(value, str) else value


def node_group_tasks():
    for name in ("node_group.yml", "preflight.yml"):
        for task in yaml.safe_load((TASKS / name).read_text()):
            if "node_group" in task.get("llmops.inference.sglang_info", {}):
                yield name, task


@pytest.mark.parametrize(("name", "task"), list(node_group_tasks()), ids=lambda value: str(value)[:40])
def test_a_member_in_the_play_without_its_published_settings_is_refused_by_name(name, task):
    variables = {
        "inventory_hostname": "gpu-b",
        "sglang_service_node_group": ["gpu-a", "gpu-b"],
        "ansible_play_hosts": ["gpu-a", "gpu-b"],
        "hostvars": {"gpu-a": {}, "gpu-b": {"__sglang_service_node_view": dict(VIEW, address="10.0.0.2")}},
    }
    members = trusted(task["vars"]["__members"])
    variables["__members"] = Templar(loader=DataLoader(), variables=variables).template(members)
    templar = Templar(loader=DataLoader(), variables=variables)
    group = templar.template(trusted(task["llmops.inference.sglang_info"]["node_group"]))
    with pytest.raises(NodeGroupError) as refused:
        plan_group(group["host"], group["members"], group["views"])
    assert str(refused.value).startswith("sglang_service_node_group names gpu-a, which is not in this play"), name


def test_both_tasks_are_checked():
    assert [name for name, _task in node_group_tasks()] == ["node_group.yml", "preflight.yml"]
