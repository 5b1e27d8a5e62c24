"""The Ansible inventory a lab writes for its hosts."""

from __future__ import annotations

import json
from pathlib import Path

SSH_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"


def render(hosts: list[dict], key: Path, gpus: int, gpu_host_pids: bool = False) -> str:
    """YAML for group ``lab``. Values are JSON-quoted, which YAML reads as plain strings.

    Lab hosts are systemd-nspawn containers, which the role refuses unless the GPU's PIDs are visible: they are,
    unless the lab's simulated GPUs list host-namespace PIDs (``lab up --gpu-host-pids``), a container host as real.
    """
    lines = [
        "# Written by tests/lab/lab up; removed by tests/lab/lab down.",
        "all:",
        "  children:",
        "    lab:",
        "      hosts:",
    ]
    for host in hosts:
        lines += [
            f"        {host['name']}:",
            f"          ansible_host: {json.dumps(host['address'])}",
            f"          lab_gpu_count: {gpus}",
            f"          lab_mig_uuids: {json.dumps(host.get('mig_uuids', []))}",
        ]
    lines += [
        "      vars:",
        "        ansible_user: root",
        f"        ansible_ssh_private_key_file: {json.dumps(str(key))}",
        f"        ansible_ssh_common_args: {json.dumps(SSH_ARGS)}",
        "        ansible_python_interpreter: /usr/bin/python3",
        f"        sglang_service_gpu_pids_visible: {json.dumps(not gpu_host_pids)}",
    ]
    return "\n".join(lines) + "\n"
