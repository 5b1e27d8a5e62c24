# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPUs, their processes and MIG devices through `nvidia-smi`.

Private to the llmops.inference collection; not a public API. Needs only the Python standard library.
"""

from __future__ import annotations

import re
import subprocess

from ansible_collections.llmops.inference.plugins.module_utils.gpu import (
    LEGACY_MIG_NAME,
    Gpu,
    GpuProcess,
    GpuQueryError,
    merge_processes,
)

SMI_GPU_QUERY = ["--query-gpu=index,uuid,name,memory.used,memory.total", "--format=csv,noheader,nounits"]
SMI_APPS_QUERY = ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
# Drivers from R510 on report the driver's reservation apart (nvidia-smi's memory.used then leaves it out); an
# older nvidia-smi refuses the field, and its memory.used is all the memory in use.
SMI_RESERVED_QUERY = ["--query-gpu=uuid,memory.reserved", "--format=csv,noheader,nounits"]
SMI_LIST = ["-L"]
SMI_MISSING_VALUES = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "")
# `nvidia-smi -L`: "GPU 0: NAME (UUID: GPU-...)", and under a GPU in MIG mode
# "  MIG 1g.10gb     Device  0: (UUID: MIG-...)".
SMI_LIST_GPU = re.compile(r"^GPU (\d+): (.*) \(UUID: ([^)]+)\)\s*$")
SMI_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")
SMI_MIG_MEMORY_UNKNOWN = "nvidia-smi reports no memory per MIG device; install nvidia-ml-py (pynvml) to read it"
SMI_MIG_PROCESSES_UNKNOWN = "nvidia-smi --query-compute-apps names the parent GPU of a process, not its MIG device"


def _smi_value(text: str) -> int | None:
    text = text.strip()
    if text in SMI_MISSING_VALUES or text.startswith("["):
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_smi_gpus(text: str) -> list:
    """Parse ``--query-gpu=index,uuid,name,memory.used,memory.total`` CSV (the name may hold commas)."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 5 or not fields[0].isdigit():
            raise GpuQueryError(f"unexpected nvidia-smi GPU line: {line!r}")
        gpus.append(
            Gpu(
                index=int(fields[0]),
                uuid=fields[1],
                name=", ".join(fields[2:-2]),
                used_mib=_smi_value(fields[-2]),
                total_mib=_smi_value(fields[-1]),
            )
        )
    return gpus


def parse_smi_apps(text: str) -> list:
    """Parse ``--query-compute-apps=pid,gpu_uuid,used_memory`` CSV into (gpu_uuid, GpuProcess) pairs."""
    apps = []
    for line in text.splitlines():
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            continue  # blank lines and "No running processes found"
        apps.append((fields[1], GpuProcess(int(fields[0]), _smi_value(fields[2]))))
    return apps


def default_run_command(args):
    try:
        proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def parse_smi_list(text: str) -> list:
    """MIG devices from ``nvidia-smi -L``: ``(parent index, parent UUID, parent name, device index, profile, UUID)``."""
    found = []
    parent = None
    for line in text.splitlines():
        gpu_line = SMI_LIST_GPU.match(line)
        if gpu_line:
            parent = (int(gpu_line.group(1)), gpu_line.group(3).strip(), gpu_line.group(2).strip())
            continue
        mig_line = SMI_LIST_MIG.match(line)
        if mig_line and parent is not None:
            found.append((*parent, int(mig_line.group(2)), mig_line.group(1), mig_line.group(3).strip()))
    return found


def _smi_mig_devices(gpus: list, listing: str) -> list:
    """``gpus`` with the MIG devices of ``nvidia-smi -L`` after their parents; their memory and processes unknown."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    children = {}
    for parent_index, parent_uuid, parent_name, slot, profile, uuid in parse_smi_list(listing):
        parent = by_uuid.get(parent_uuid)
        if parent is None:
            continue
        parent.mig_enabled = True
        device = Gpu(
            index=parent_index,
            uuid=uuid,
            name=f"{parent.name or parent_name} MIG {profile}",
            total_mib=None,
            used_mib=None,
            processes_known=False,
            mig_index=slot,
            parent_uuid=parent_uuid,
        )
        legacy = LEGACY_MIG_NAME.match(uuid)
        if legacy:
            device.gpu_instance_id, device.compute_instance_id = int(legacy.group(2)), int(legacy.group(3))
        device.add_error("memory", SMI_MIG_MEMORY_UNKNOWN)
        device.add_error("processes", SMI_MIG_PROCESSES_UNKNOWN)
        children.setdefault(parent_uuid, []).append(device)
    listed = []
    for gpu in gpus:
        listed.append(gpu)
        listed.extend(children.get(gpu.uuid, ()))
    return listed


def query_nvidia_smi(run_command=None, binary: str = "nvidia-smi") -> list:
    """List GPUs (``--query-gpu``), their processes (``--query-compute-apps``) and MIG devices (``-L``)."""
    run_command = run_command or default_run_command
    outputs = []
    for query in (SMI_GPU_QUERY, SMI_APPS_QUERY):
        rc, out, err = run_command([binary, *query])
        if rc != 0:
            detail = (err or out or "").strip() or "no output"
            raise GpuQueryError(f"`{binary} {query[0]}` failed (rc={rc}): {detail}")
        outputs.append(out)
    gpus = parse_smi_gpus(outputs[0])
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    _smi_reserved(by_uuid, run_command, binary)
    for uuid, proc in parse_smi_apps(outputs[1]):
        if uuid in by_uuid:
            by_uuid[uuid].processes.append(proc)
    for gpu in gpus:
        gpu.processes = merge_processes(gpu.processes)
    listing = _mig_listing(run_command, binary)
    return _smi_mig_devices(gpus, listing) if listing is not None else gpus


def _smi_reserved(by_uuid: dict, run_command, binary: str) -> None:
    """Set each GPU's reservation from ``memory.reserved``, adding it back to ``used_mib`` (which then leaves it out).

    An nvidia-smi that refuses the field (drivers before R510) leaves the GPUs as they are: its memory.used is all
    the memory in use.
    """
    for uuid, reserved in _smi_reservations(run_command, binary).items():
        gpu = by_uuid.get(uuid)
        if gpu is None:
            continue
        gpu.reserved_mib = reserved
        if gpu.used_mib is not None:
            gpu.used_mib += reserved


# The reservation per (binary, runner): it is fixed while the driver is loaded, and a module polls memory many times.
_RESERVATIONS = {}


def _smi_reservations(run_command, binary: str) -> dict:
    key = (binary, run_command)
    if key not in _RESERVATIONS:
        rc, out, _err = run_command([binary, *SMI_RESERVED_QUERY])
        found = {}
        for line in out.splitlines() if rc == 0 else ():
            fields = [part.strip() for part in line.split(",")]
            reserved = _smi_value(fields[1]) if len(fields) == 2 else None
            if reserved is not None:
                found[fields[0]] = reserved
        _RESERVATIONS[key] = found
    return _RESERVATIONS[key]


# `nvidia-smi -L` per (binary, runner): MIG devices change only when an administrator changes them, and a module
# polls memory many times in one run; nvidia-smi takes a while to start on a real host.
_MIG_LISTINGS = {}


def _mig_listing(run_command, binary: str):
    key = (binary, run_command)
    if key not in _MIG_LISTINGS:
        rc, listing, _err = run_command([binary, *SMI_LIST])
        if rc != 0:
            return None
        _MIG_LISTINGS[key] = listing
    return _MIG_LISTINGS[key]
