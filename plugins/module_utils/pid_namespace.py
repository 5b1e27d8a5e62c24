# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether this host sees the PIDs that the NVIDIA driver names: refused before anything changes where it does not.

Private to the llmops.inference collection; not a public API (the ``gpus`` check of the sglang_info module).

The driver names a GPU's processes by their PIDs in the host's PID namespace, whatever namespace the caller is in
(NVIDIA's answer in NVIDIA/nvidia-docker#1483). On an LXC, systemd-nspawn or Docker host with a PID namespace of its
own, those PIDs are not this host's: the unit's GPU gate and the probe's GPU tier find none of the engine's processes
on its GPUs (a healthy engine fails its gate), and the reaper reads the engine's memory as held by no process, which
looks like memory that needs a GPU reset. Two signs, either one refuses:

- ``systemd-detect-virt --container`` names a container (unless the operator says the GPU's PIDs are visible: a
  container that shares the host's PID namespace, such as ``docker run --pid=host``);
- evidence: the driver lists a PID holding memory on the engine's GPUs that this host's /proc does not show, still
  listed a moment later. That proves the PIDs are not visible, whatever the option says.
"""

from __future__ import annotations

from dataclasses import dataclass

DETECT_VIRT = ("systemd-detect-virt", "--container")
OPTION = "sglang_service_gpu_pids_visible"
ISSUE = "NVIDIA/nvidia-docker#1483"
REMEDY = (
    "Run the engine on the GPU host itself, or in a container that shares the host's PID namespace (docker run "
    f"--pid=host; an LXC or systemd-nspawn container without a PID namespace of its own) and set {OPTION}: true"
)
CONSEQUENCE = (
    "the unit's GPU gate, the probe's GPU tier and the reaper would find none of the engine's processes on its "
    "GPUs: a healthy engine fails its gate, and its memory reads as held by no process, as if the GPU needed a reset"
)


def detect_container(run_command) -> str | None:
    """The container ``systemd-detect-virt --container`` names, or None (none, or the tool is missing)."""
    try:
        rc, out, _err = run_command(list(DETECT_VIRT))
    except OSError:
        return None
    name = (out or "").strip()
    return name if rc == 0 and name and name != "none" else None


@dataclass(frozen=True)
class Unseen:
    """A holder the driver lists that /proc does not show: GPU (as shown), PID, MiB (None when unknown)."""

    gpu: str
    pid: int
    mib: int | None = None

    def describe(self) -> str:
        memory = "memory" if self.mib is None else f"{self.mib} MiB"
        return f"pid {self.pid} on {self.gpu} ({memory})"


def refusal(label: str, container: str | None, unseen: list, pids_visible: bool) -> str | None:
    """The one message that refuses ``label`` on a host that cannot see the GPU's PIDs, or None."""
    if unseen:
        listed = ", ".join(holder.describe() for holder in unseen)
        said = f" ({OPTION} is true, but this shows otherwise)" if pids_visible else ""
        where = f"a {container} container" if container else "a PID namespace other than the driver's"
        return (
            f"{label} cannot be managed from this host: the NVIDIA driver lists {listed}, which this host's /proc "
            f"does not show: this host runs in {where}{said}. The driver names GPU processes by their PIDs in the "
            f"host's PID namespace ({ISSUE}), so {CONSEQUENCE}. {REMEDY}."
        )
    if container and not pids_visible:
        return (
            f"{label} cannot be managed from this host: it runs in a container ({container}, systemd-detect-virt "
            f"--container), which usually has a PID namespace of its own. The NVIDIA driver names GPU processes by "
            f"their PIDs in the host's PID namespace ({ISSUE}), so {CONSEQUENCE}. {REMEDY}."
        )
    return None
