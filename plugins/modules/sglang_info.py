#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_info
short_description: Check that an interpreter can run SGLang - the package, its version, the Python version
version_added: 0.2.0
description:
  - Asks the interpreter O(python) (usually a venv's C(bin/python)) where its C(sglang) package is, which version is
    installed and which Python it is, by running a short standard-library script under it with C(-E);
    C(importlib.util.find_spec) locates the package without importing it (a real C(import sglang) needs torch and a
    GPU stack, which a host being prepared may not have yet).
  - Fails, naming O(label) and what is needed, when the interpreter cannot be run, has no C(sglang), is older than
    O(min_python), has another sglang than O(version), or lacks the C(sglang) console script beside it
    (O(require_script)).
  - With O(gpus), checks instead (or as well) that an engine's GPU list can work on this host before anything changes,
    and fails naming each GPU and why it cannot be used - a GPU the host does not have, a GPU named twice (also by
    index and by UUID), whole GPUs and MIG devices together (CUDA stops reading C(CUDA_VISIBLE_DEVICES) at the first
    entry of the other kind), fewer CUDA devices than the engine's layout uses (a list with MIG devices gives one, as a
    CUDA process enumerates a single MIG device), or memory held by a process outside the reach of O(gpus.unit)'s
    restart.
  - With O(node_group), checks this host's place in a multi-node engine (one engine across several hosts) from every
    member's own settings and returns its rank, the number of nodes and the rank-0 address; fails naming each member
    and problem - this host not in its group, a host named twice or not in the play, group lists that differ, ranks
    out of range, given twice or missing, tp_size that differs or does not divide by the number of hosts, a GPU list
    that does not hold tp_size / nnodes GPUs, different models or rank-0 addresses - and when this host cannot resolve
    or reach the rank-0 address (a refused connection counts as reached - nothing listens before the engine starts).
  - With O(drain), refuses engine settings that SGLang's graceful shutdown does not serve, which a unit whose stop
    relies on that drain cannot run cleanly - C(--pp-size) above 1 (pipeline-parallel schedulers never read
    C(ShutdownReq)), C(--tokenizer-worker-num) above 1 and C(SGLANG_RUST_SERVER) (no stop hook) - unless
    O(drain.accept) is set.
  - With O(nvcc_dirs), returns the first C(nvcc) found in them (RV(nvcc)), in the order given; finding none is not a
    failure (only SGLang's JIT-compiled kernels need one, at their first use), the caller decides whether to warn.
author:
  - llmops.inference contributors (@llmops)
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
extends_documentation_fragment:
  - llmops.inference.read_only
options:
  python:
    description:
      - The absolute path of the interpreter that runs SGLang. One of O(python), O(gpus), O(node_group) and
        O(nvcc_dirs) is required.
    type: path
  nvcc_dirs:
    description:
      - Directories to look for an executable C(nvcc) in, in the order the engine looks (SGLang 0.5.23's JIT kernels
        take C(CUDA_HOME)'s, then one on C(PATH), then C(/usr/local/cuda)'s).
    type: list
    elements: path
  version:
    description: The sglang version that must be installed (exactly, as in its dist-info). Empty accepts any.
    type: str
    default: ""
  min_python:
    description: The oldest Python the installed sglang supports (sglang 0.5.23 requires 3.11).
    type: str
    default: "3.11"
  require_script:
    description: Also require the C(sglang) console script (C(sglang serve)) in the interpreter's directory.
    type: bool
    default: false
  label:
    description: How messages name the interpreter, such as the variable it comes from.
    type: str
    default: python
  gpus:
    description:
      - The GPU list to check against this host's GPUs (through NVML, else C(nvidia-smi)). Only reads.
    type: dict
    suboptions:
      devices:
        description:
          - The GPUs, in the order the engine gets them, by index, C(GPU-) UUID or C(MIG-) UUID.
        type: list
        elements: str
        required: true
      tp_size:
        description: The engine's C(--tp-size).
        type: int
        default: 1
      extra_args:
        description:
          - The engine's other arguments. C(--pp-size), C(--dp-size), C(--nnodes), C(--base-gpu-id), C(--gpu-id-step)
            and C(--enable-dp-attention) (with their aliases) change how many CUDA devices it uses, as SGLang 0.5.23
            places its ranks.
        type: list
        elements: str
        default: []
      unit:
        description:
          - The systemd unit that runs the engine (C(.service) is added to a name without a unit type). Memory held
            by its own processes (the engine and its leftovers) and by orphans titled C(sglang::) outside every running
            unit is accepted - its restart reaps them; memory of any other process refuses the GPU.
          - Without it, a GPU where any process holds memory is refused.
        type: str
      label:
        description: How messages name the list, such as the variable it comes from.
        type: str
        default: gpus
      backend:
        description: How to list the GPUs; C(auto) tries NVML through pynvml, then C(nvidia-smi).
        type: str
        choices: [auto, nvml, nvidia-smi]
        default: auto
      pids_visible:
        description:
          - Whether the PIDs the NVIDIA driver names are this host's. The driver names a GPU's processes by their PIDs
            in the host's PID namespace (NVIDIA/nvidia-docker#1483), so a host in a container with a PID namespace of
            its own cannot find the engine's processes on its GPUs.
          - With V(false), a host that C(systemd-detect-virt --container) finds to be a container is refused, with a
            message that says why and what to do. Set V(true) for a container that shares the host's PID namespace
            (C(docker run --pid=host)).
          - Either way, a PID the driver lists holding memory on these GPUs that this host's C(/proc) does not show,
            still listed a moment later, refuses the host.
        type: bool
        default: false
  node_group:
    description:
      - A multi-node engine to check this host's place in. Only reads; the address check opens one TCP connection.
    type: dict
    suboptions:
      host:
        description: This host's name in the group (its inventory name).
        type: str
        required: true
      members:
        description: The group's hosts in rank order (inventory names), as this host lists them. Empty is one node.
        type: list
        elements: str
        required: true
      views:
        description:
          - Each member's own settings, by name - C(node_group), C(node_rank) (null - its position), C(tp_size),
            C(gpus), C(model_path), C(dist_init_addr) (empty - derived), C(dist_init_port), C(address) (how the others
            reach it). A member that is missing, null or empty (not in the play, or failed before it published its
            settings) is refused.
        type: dict
        default: {}
      check_address:
        description: Also resolve and connect to the rank-0 address from this host.
        type: bool
        default: true
      label:
        description: The prefix of the variables that messages name (C(LABEL_node_group), C(LABEL_tp_size), ...).
        type: str
        default: sglang_service
  drain:
    description:
      - The engine's settings to check against SGLang's graceful drain. Only looks at the values given.
    type: dict
    suboptions:
      extra_args:
        description: The engine's extra command-line arguments (C(--pp-size N), C(--tokenizer-worker-num=N), ...).
        type: list
        elements: str
        default: []
      environment:
        description: The engine's environment (C(SGLANG_RUST_SERVER)).
        type: dict
        default: {}
      accept:
        description:
          - Accept those settings - every stop then kills the schedulers before they release their GPU memory (the
            restart's reaper frees it) and cuts the requests in flight.
        type: bool
        default: false
"""

EXAMPLES = r"""
- name: The stop's drain serves the engine's settings (refuses --pp-size 2 unless accepted)
  llmops.inference.sglang_info:
    drain:
      extra_args: [--pp-size, "2"]
      accept: false

- name: The engine's interpreter runs sglang 0.5.23
  llmops.inference.sglang_info:
    python: /opt/sglang/venv/bin/python
    version: 0.5.23
    require_script: true
    label: sglang_service_python
  register: sglang

- name: The GPU list can work on this host
  llmops.inference.sglang_info:
    gpus:
      devices: ["2", "3"]
      tp_size: 2
      unit: sglang-qwen.service
      label: sglang_service_gpus

- name: This host's place in a two-host engine
  llmops.inference.sglang_info:
    node_group:
      host: gpu-b
      members: [gpu-a, gpu-b]
      views:
        gpu-a:
          {node_group: [gpu-a, gpu-b], tp_size: 4, model_path: Qwen/Qwen3-32B, dist_init_port: 20000, address: 10.0.0.1}
        gpu-b:
          {node_group: [gpu-a, gpu-b], tp_size: 4, model_path: Qwen/Qwen3-32B, dist_init_port: 20000, address: 10.0.0.2}
  register: group
"""

RETURN = r"""
python:
  description: The interpreter.
  returned: always
  type: str
  sample: /opt/sglang/venv/bin/python
python_version:
  description: Its Python version.
  returned: when the interpreter ran
  type: str
  sample: 3.11.2
version:
  description: The installed sglang version.
  returned: when sglang is installed
  type: str
  sample: 0.5.23
package_dir:
  description: Where the interpreter finds the sglang package.
  returned: when sglang is installed
  type: str
  sample: /opt/sglang/venv/lib/python3.11/site-packages/sglang
script:
  description: The C(sglang) console script beside the interpreter, or null when there is none.
  returned: when sglang is installed
  type: str
  sample: /opt/sglang/venv/bin/sglang
gpus:
  description: What the check of O(gpus) found.
  returned: when O(gpus) is set and the host's GPUs could be listed
  type: dict
  contains:
    backend:
      description: How the GPUs were listed (C(nvml) or C(nvidia-smi)).
      type: str
    devices:
      description:
        - The devices the list names, in its order and each once, as M(llmops.inference.nvidia_reap) reports GPUs.
      type: list
      elements: dict
    holders:
      description:
        - The processes holding memory on them, each with C(gpu), C(uuid), C(pid), C(mib), C(title), C(unit) and
          C(in_reach) (whether a restart of O(gpus.unit) reaps it).
      type: list
      elements: dict
    needed:
      description: How many CUDA devices the engine's layout uses.
      type: int
      sample: 2
    cuda_devices:
      description: How many CUDA devices the list gives the engine.
      type: int
      sample: 2
    problems:
      description: Why the list cannot work, one line each; empty when it can.
      type: list
      elements: str
      sample:
        - "sglang_service_gpus must name GPUs this host has: 7 is not one of them (this host has 0 (GPU-9f2c...),
          1 (GPU-41aa...)); got [7]"
node_group:
  description: This host's place in the group of O(node_group).
  returned: when O(node_group) is set and the group can work
  type: dict
  contains:
    nnodes:
      description: The number of hosts (1 - one node, nothing to render).
      type: int
      sample: 2
    node_rank:
      description: This host's rank.
      type: int
      sample: 1
    dist_init_addr:
      description: The rank-0 address every rank meets at (HOST:PORT); empty on one node.
      type: str
      sample: 10.0.0.1:20000
    gpus_per_node:
      description: tp_size / nnodes, the GPUs each host gives the engine.
      type: int
      sample: 2
    ranks:
      description: Every member's rank, by name.
      type: dict
      sample: {gpu-a: 0, gpu-b: 1}
nvcc:
  description: The first executable C(nvcc) in O(nvcc_dirs); null when none holds one.
  returned: when O(nvcc_dirs) is given
  type: str
  sample: /usr/local/cuda/bin/nvcc
"""

import os  # noqa: E402 - Ansible modules import after their docs

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.llmops.inference.plugins.module_utils.drain_support import refusals  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.gpu_selection import inspect_gpu_list  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.module_support import command_runner  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.node_group import (  # noqa: E402
    NodeGroupError,
    check_rank0_address,
    plan_group,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import (  # noqa: E402
    InstallError,
    TargetPython,
)

ARGUMENT_SPEC = dict(
    python=dict(type="path"),
    version=dict(type="str", default=""),
    min_python=dict(type="str", default="3.11"),
    require_script=dict(type="bool", default=False),
    label=dict(type="str", default="python"),
    nvcc_dirs=dict(type="list", elements="path"),
    gpus=dict(
        type="dict",
        options=dict(
            devices=dict(type="list", elements="str", required=True),
            tp_size=dict(type="int", default=1),
            extra_args=dict(type="list", elements="str", default=[]),
            unit=dict(type="str"),
            label=dict(type="str", default="gpus"),
            backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
            pids_visible=dict(type="bool", default=False),
        ),
    ),
    node_group=dict(
        type="dict",
        options=dict(
            host=dict(type="str", required=True),
            members=dict(type="list", elements="str", required=True),
            views=dict(type="dict", default={}),
            check_address=dict(type="bool", default=True),
            label=dict(type="str", default="sglang_service"),
        ),
    ),
    drain=dict(
        type="dict",
        options=dict(
            extra_args=dict(type="list", elements="str", default=[]),
            environment=dict(type="dict", default={}),
            accept=dict(type="bool", default=False),
        ),
    ),
)


def _version_tuple(text: str) -> tuple:
    parts = []
    for part in text.split("."):
        digits = "".join(char for char in part if char.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def inspect_install(params: dict, run_command) -> tuple:
    """``(facts, problem)``: what the interpreter has, and the first requirement it misses (None when it has all)."""
    python, label = params["python"], params["label"]
    facts = {"python": python}
    try:
        install = TargetPython(run_command, python).locate()
    except InstallError as exc:
        return facts, f"{label} {python} cannot run SGLang: {exc}"
    facts.update(python_version=install.python_version, version=install.version, package_dir=install.package_dir)
    script = os.path.join(os.path.dirname(python), "sglang")
    facts["script"] = script if os.access(script, os.X_OK) else None
    minimum = params["min_python"]
    if minimum and _version_tuple(install.python_version)[:2] < _version_tuple(minimum)[:2]:
        return facts, (
            f"{label} {python} is Python {install.python_version}; sglang needs Python >= {minimum}: give the "
            "interpreter of an environment built on a newer Python"
        )
    if params["version"] and install.version != params["version"]:
        return facts, f"{label} {python} has sglang {install.version}, but version {params['version']} is required"
    if params["require_script"] and facts["script"] is None:
        return facts, (
            f"{label} {python} has sglang {install.version} but no executable {script} (the console script that "
            "`sglang serve` runs); reinstall sglang in that environment with pip"
        )
    return facts, None


def find_nvcc(directories: list) -> str | None:
    """The first executable ``nvcc`` in ``directories``, in their order; None when none holds one."""
    for directory in directories:
        candidate = os.path.join(directory, "nvcc")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def inspect_node_group(params: dict) -> tuple:
    """``(facts, problems)`` for the ``node_group`` options."""
    try:
        plan = plan_group(params["host"], params["members"], params["views"] or {}, params["label"])
    except NodeGroupError as exc:
        return {}, exc.problems
    problem = None
    if plan.nnodes > 1 and params["check_address"]:
        problem = check_rank0_address(plan.dist_init_addr, params["host"], f"{params['label']}_dist_init_addr")
    return {"node_group": plan.as_dict()}, [problem] if problem else []


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_one_of=[("python", "gpus", "node_group", "nvcc_dirs", "drain")],
        supports_check_mode=True,
    )
    run_command = command_runner(module)
    facts, problems, said = {}, [], []
    if module.params["python"]:
        facts, problem = inspect_install(module.params, run_command)
        problems.extend([problem] if problem else [])
        said.extend([] if problem else [f"sglang {facts['version']} on Python {facts['python_version']}"])
    if module.params["nvcc_dirs"] is not None:
        facts["nvcc"] = find_nvcc(module.params["nvcc_dirs"])
    if module.params["gpus"]:
        gpus, gpu_problems, warnings = inspect_gpu_list(module.params["gpus"], run_command)
        for warning in warnings:
            module.warn(warning)
        facts.update({"gpus": gpus} if gpus else {})
        problems.extend(gpu_problems)
        gpu_list = f"{module.params['gpus']['label']} [{', '.join(module.params['gpus']['devices'])}]"
        said.extend([] if gpu_problems else [f"{gpu_list} can work on this host"])
    if module.params["node_group"]:
        group_facts, group_problems = inspect_node_group(module.params["node_group"])
        facts.update(group_facts)
        problems.extend(group_problems)
        plan = group_facts.get("node_group") or {}
        if not group_problems and plan.get("nnodes", 1) > 1:
            said.append(f"{module.params['node_group']['host']} is rank {plan['node_rank']} of {plan['nnodes']} nodes")
    if module.params["drain"]:
        drain = module.params["drain"]
        drain_problems = refusals(drain["extra_args"], drain["environment"], drain["accept"])
        problems.extend(drain_problems)
        said.extend([] if drain_problems else ["the stop's drain serves the engine's settings"])
    if problems:
        module.fail_json(msg="\n".join(problems), changed=False, **facts)
    module.exit_json(msg="; ".join(said), changed=False, **facts)


if __name__ == "__main__":
    main()
