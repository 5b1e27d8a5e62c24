#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_reap
short_description: Reap the processes that hold GPU memory after an unclean stop
version_added: 0.1.0
description:
  - Finds the processes that hold memory on NVIDIA GPUs (through NVML, else C(nvidia-smi), and optionally
    processes with a C(/dev/nvidia*) file open), keeps only those in the requested scope, and signals them
    with O(signal), then with SIGKILL the ones still alive after O(grace) seconds.
  - Then waits until the GPU memory is really released, and fails naming what is still held when it is not
    released within O(timeout). The driver frees a process's memory some time after the process is gone, and
    NVML lists live processes only, so in between the memory is used with no process listed (C(nvidia-smi) shows
    the memory and "No running processes found"). The wait therefore ends only when no reaped PID is listed and
    each GPU a reaped process held memory on uses no more memory beyond what its listed processes hold than it
    did before the reap.
  - "A process is in scope when its PID is listed in O(pids), or when it passes B(every) other selector
    that is set: it lies in the cgroup of O(unit) B(and) its title or command line matches O(match)
    B(and) it is an orphan (O(orphans_only)). At least one selector is required."
  - "Safety rules that always apply, each reported in RV(excluded) with its reason: PID 1, the module's own
    process and its ancestors, and kernel threads are never signalled; neither is a process that belongs
    to another running systemd unit, unless its PID is listed in O(pids)."
  - Processes still alive O(kill_timeout) seconds after SIGKILL (usually in uninterruptible sleep, state D) are
    reported in RV(unkillable).
  - "B(Unreapable memory): a holder still alive O(kill_timeout) seconds after SIGKILL (usually state D, stuck in
    the driver), a zombie that holds memory, or memory that no live process holds (a PID the driver still lists
    but that is gone, or used memory on a selected GPU that no listed process accounts for, above
    O(unaccounted_threshold_mib)) still there O(kill_timeout) seconds into the wait for the release. Only a GPU
    reset or a reboot frees it. Each piece is listed in RV(unreapable) with its evidence (PID, state from
    C(/proc/PID/stat), parent, MiB per GPU), and the task fails with
    C(GPU <n> needs a reset or a reboot: <evidence>) unless O(fail_on_unreapable=false).
    See the runbook C(docs/runbooks/gpu_needs_reset.md)."
  - GPUs can be named by index, C(GPU-) UUID or C(MIG-) UUID; a MIG device has its own memory and processes.
author:
  - llmops.inference maintainers (@llmops)
requirements:
  - Linux with C(/proc); systemd for O(unit) and for the rule that protects other units' processes.
  - Python package C(nvidia-ml-py) (module C(pynvml)) for the C(nvml) backend; it is optional.
  - C(nvidia-smi) for the C(nvidia-smi) backend, used by C(auto) when pynvml is missing or NVML fails.
  - Root, or the same user as the processes to reap.
attributes:
  check_mode:
    support: full
    description:
      - Lists the processes it would reap in RV(reaped) and signals nothing; C(changed) says whether it would signal.
      - Lists what looks unreapable (zombies or gone PIDs holding memory, memory no process accounts for) and stays
        O(kill_timeout) seconds (memory the driver is still releasing goes sooner and is not listed) in
        RV(unreapable) and warns, without failing; a candidate in state D is warned about.
  diff_mode:
    support: full
    description: Shows the GPU memory before and after (in check mode, the memory expected after).
  idempotent:
    support: full
    description: Once the processes in scope are gone, another run finds no candidates and reports no change.
options:
  unit:
    description:
      - Reap processes in the cgroup of this systemd unit, such as the leftovers of a stopped service
        (C(.service) is added to a name without a unit type).
      - Refused while the unit is active, activating, deactivating or reloading, unless O(allow_active=true).
    type: str
  allow_active:
    description:
      - Allow O(unit) to name a unit that systemd still runs; its processes are then reaped too.
    type: bool
    default: false
  match:
    description:
      - Python regular expression searched in each process's title (C(argv[0]), as set by setproctitle)
        and in its full command line; either matching is enough. Anchor it, as in C(^sglang::).
    type: str
  orphans_only:
    description:
      - Only processes whose parent is PID 1 or a subreaper. Subreapers cannot be read from C(/proc) for
        another process; a parent that is a systemd manager (such as C(systemd --user)) counts as one.
    type: bool
    default: false
  pids:
    description:
      - Reap these PIDs (when they hold GPU memory), also if they belong to another running unit.
      - PID 1 and values below 1 are refused.
    type: list
    elements: int
  gpus:
    description:
      - GPUs to consider, by index, C(GPU-) UUID or C(MIG-) UUID (a MIG device, with its own memory and processes).
        Default is all whole GPUs.
      - Only memory on these GPUs makes a process a holder, and only these GPUs are watched for the release and
        checked for unreapable memory.
    type: list
    elements: str
  include_device_holders:
    description:
      - Also count processes that have a C(/dev/nvidia*) file open without a listed compute context.
        Such processes are not tied to one GPU, so O(gpus) does not narrow them.
    type: bool
    default: false
  backend:
    description:
      - How to list GPUs and their processes. C(auto) tries NVML through pynvml, then C(nvidia-smi).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  signal:
    description:
      - The first signal sent, by name (C(SIGTERM), C(TERM), C(SIGINT)) or number. With C(SIGKILL) there is no
        grace period.
    type: str
    default: SIGTERM
  grace:
    description:
      - Seconds to wait after O(signal) before sending SIGKILL to the processes still alive.
    type: float
    default: 10
  wait_released:
    description:
      - After the processes exit, wait until the reaped PIDs no longer hold memory on the selected GPUs and the
        driver has released it (see the description), and each GPU is at or below O(released_below_mib), if set.
        Fail if that does not happen in O(timeout).
      - Less than O(unaccounted_threshold_mib) of a reaped process's memory that is still not released after
        O(kill_timeout) seconds ends the wait with a warning.
    type: bool
    default: true
  released_below_mib:
    description:
      - With O(wait_released), also wait until the memory in use on every selected GPU beyond the driver's
        reservation (NVML v2's C(reserved)) is at most this many MiB, whoever holds it. Without candidates, this
        still waits, so it can assert that the GPUs are free.
    type: int
  timeout:
    description:
      - Seconds to wait, after the last signal, for the processes to exit and the memory to be released.
    type: float
    default: 60
  kill_timeout:
    description:
      - Seconds a process may stay alive after SIGKILL, and memory without a live holder may stay held, before
        either is judged unreapable (see the description). Bounded by O(timeout).
      - Set it above the driver's release lag (usually well under a second, a few seconds on large GPUs).
    type: float
    default: 10
  unaccounted_threshold_mib:
    description:
      - Memory in use on a selected GPU beyond the driver's reservation that no listed process accounts for counts
        as unreapable above this many MiB.
      - The reservation (hundreds of MiB on an idle H100 or H200) is read from NVML v2 (C(reserved)) or
        C(nvidia-smi --query-gpu=memory.reserved) and never counts. Where neither reports it (drivers before R510,
        nvidia-ml-py before 11.510), all used memory counts, so keep this above what an idle board shows there.
    type: int
    default: 1024
  fail_on_unreapable:
    description:
      - "Fail when unreapable memory is left (RV(unreapable) not empty), with the message
        C(GPU <n> needs a reset or a reboot: <evidence>)."
      - Set to V(false) to only report it (RV(unreapable), RV(reset_gpus) and a warning), for example to collect it
        from a fleet.
    type: bool
    default: true
notes:
  - Explicit O(pids) bypass only the other-unit rule; PID 1, the module's ancestors and kernel threads are never
    signalled.
  - Before each signal the process's start time is compared with the one seen while planning, so a reused PID
    is not signalled.
  - The memory polls run every 0.2 seconds and the exit polls every 0.1 seconds.
  - A failed NVML query of one device (C(Not Supported), C(Insufficient Permissions)) leaves that field unknown
    and is listed in the device's C(errors) in RV(gpus_before) and as a warning; the other devices are used as
    reported. A GPU whose process list is unknown cannot show its holders.
  - Memory held by a process of another PID namespace (a container) cannot be told from memory that no process
    holds; run the module where the GPU's users are visible (on the host).
seealso:
  - name: nvidia-smi
    description: NVIDIA System Management Interface.
    link: https://docs.nvidia.com/deploy/nvidia-smi/index.html
  - name: systemd.kill
    description: KillMode= and how systemd stops a unit's processes.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.kill.html
"""

EXAMPLES = r"""
- name: Stop the server, then reap what its KillMode left behind in its cgroup
  block:
    - name: Stop the unit
      ansible.builtin.systemd_service:
        name: sglang-qwen.service
        state: stopped

    - name: Reap the unit's leftover GPU holders
      llmops.inference.nvidia_reap:
        unit: sglang-qwen.service
        grace: 15
        timeout: 120
      register: reap

- name: Reap orphaned SGLang schedulers on GPUs 0 and 1 and wait until both GPUs are nearly empty
  llmops.inference.nvidia_reap:
    match: '^sglang::'
    orphans_only: true
    gpus: [0, 1]
    grace: 5
    released_below_mib: 1024

- name: Reap an explicit list of PIDs, straight away with SIGKILL
  llmops.inference.nvidia_reap:
    pids: [41233, 41234]
    signal: SIGKILL

- name: Reap the leftovers, and fail fast naming the GPU when a holder survives SIGKILL for 5 seconds
  llmops.inference.nvidia_reap:
    unit: sglang-qwen.service
    gpus: ["MIG-5c4a2d61-9a3e-5b35-8d2f-1a9a6c1e2f00"]
    kill_timeout: 5
  register: reap

- name: Collect unreapable GPU memory from a fleet without failing
  llmops.inference.nvidia_reap:
    match: '^sglang::'
    orphans_only: true
    fail_on_unreapable: false
  register: leftovers

- name: Show what would be reaped, without signalling anything
  llmops.inference.nvidia_reap:
    unit: sglang-qwen.service
    match: '^sglang::'
  check_mode: true
  diff: true
  register: would_reap
"""

RETURN = r"""
backend:
  description: The backend that listed the GPUs.
  returned: success
  type: str
  sample: nvml
reaped:
  description: The processes signalled (in check mode, the ones that would be signalled).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
      sample: 41233
    title:
      description: The process title (C(argv[0]), or the kernel's C(comm) when there is no command line).
      type: str
      sample: "sglang::scheduler_TP0"
    cmdline:
      description: The command line, arguments joined by spaces.
      type: str
      sample: "sglang::scheduler_TP0"
    unit:
      description: The innermost systemd unit of the process's cgroup, or null.
      type: str
      sample: sglang-qwen.service
    gpus:
      description: Indices of the selected GPUs on which the process held memory.
      type: list
      elements: int
      sample: [0]
    used_mib:
      description: GPU memory the process held on those GPUs, in MiB; null when the driver does not say.
      type: int
      sample: 45012
    device_files:
      description: C(/dev/nvidia*) files the process had open (only with O(include_device_holders)).
      type: list
      elements: str
      sample: []
    signals:
      description: Signals sent, in order.
      type: list
      elements: str
      sample: [SIGTERM, SIGKILL]
    exited:
      description: Whether the process is gone.
      type: bool
      sample: true
excluded:
  description:
    - Processes in scope that were not signalled, each with the reason (safety rules, explicit PIDs that
      hold no GPU memory or do not exist).
    - Named C(excluded) rather than C(skipped), because Ansible reads a non-empty C(skipped) as a skipped task.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID; for an explicit PID that does not exist, the one listed in O(pids).
      type: int
    reason:
      description: Why it was left alone.
      type: str
  sample: [{pid: 3120, reason: "belongs to active unit batch-train.service; list its PID in pids to reap it anyway"}]
unkillable:
  description:
    - Reaped processes still alive O(kill_timeout) seconds after SIGKILL, usually in uninterruptible sleep (state D).
    - Each is also listed in RV(unreapable), with its evidence and the memory it holds.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: The survivor's process ID.
      type: int
      sample: 41233
    title:
      description: The process title.
      type: str
    state:
      description: The process state letter from C(/proc/PID/stat).
      type: str
      sample: D
unreapable:
  description:
    - Memory that only a GPU reset or a reboot frees, one entry per GPU and holder (see the description).
    - In check mode, what already looks unreapable before any signal.
  returned: always
  type: list
  elements: dict
  contains:
    gpu:
      description: Index of the physical GPU (the parent of a MIG device); null for a holder with no GPU memory listed.
      type: int
      sample: 0
    uuid:
      description: UUID of the GPU or MIG device that holds the memory.
      type: str
      sample: GPU-3b1c0f1e-0000-4000-8000-000000000000
    pid:
      description: The holder's PID; null for used memory that no listed process accounts for.
      type: int
      sample: 41233
    state:
      description: The process state letter from C(/proc/PID/stat) (C(D), C(Z), ...); null when the PID is gone.
      type: str
      sample: D
    ppid:
      description: The holder's parent PID; null when the PID is gone.
      type: int
      sample: 1
    title:
      description: The holder's title; null when the PID is gone.
      type: str
      sample: "sglang::scheduler_TP0"
    mib:
      description: MiB held on that GPU; null when the driver does not say.
      type: int
      sample: 45012
    evidence:
      description: What was seen, in words.
      type: str
      sample: >-
        pid 41233 'sglang::scheduler_TP0' (state D, parent 1) still alive 10.0 s after SIGKILL, holding 45012 MiB
reset_gpus:
  description: Indices of the physical GPUs in RV(unreapable), the ones that need a reset or a reboot.
  returned: always
  type: list
  elements: int
  sample: [0]
gpus_before:
  description: The selected GPUs before anything was signalled.
  returned: success
  type: list
  elements: dict
  contains:
    index:
      description: GPU index.
      type: int
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-3b1c0f1e-0000-4000-8000-000000000000
    name:
      description: GPU product name.
      type: str
      sample: NVIDIA H100 80GB HBM3
    used_mib:
      description: Used memory in MiB, the driver's reservation included (NVML's v1 C(used)).
      type: int
    reserved_mib:
      description: The driver's reservation in MiB (NVML v2's C(reserved)); null where the driver does not report it.
      type: int
    total_mib:
      description: Total memory in MiB.
      type: int
    processes:
      description: Compute processes on the GPU, each with C(pid) and C(used_mib) (null when unknown).
      type: list
      elements: dict
    errors:
      description:
        - The queries that failed for this device, each with C(field) (C(memory), C(processes), C(name),
          C(mig_mode), ...) and C(error); the field they fill is null (memory) or empty (processes).
      type: list
      elements: dict
      sample: [{field: memory, error: Not Supported}]
    mig_enabled:
      description: Present and true for a whole GPU in MIG mode (its memory is that of all its MIG devices).
      type: bool
    mig_index:
      description: For a MIG device, its index under its parent GPU (C(Device N) in C(nvidia-smi -L)).
      type: int
    parent_uuid:
      description: For a MIG device, the UUID of its parent GPU (whose index is RV(gpus_before[].index)).
      type: str
    gpu_instance_id:
      description: For a MIG device, its GPU instance ID.
      type: int
    compute_instance_id:
      description: For a MIG device, its compute instance ID.
      type: int
gpus_after:
  description: The selected GPUs at the end, in the same form as RV(gpus_before) (unchanged in check mode).
  returned: success
  type: list
  elements: dict
released_mib:
  description: Drop of the used memory summed over the selected GPUs, in MiB; null when a GPU does not report it.
  returned: success
  type: int
  sample: 90024
elapsed_s:
  description: Seconds the module spent, planning included.
  returned: success
  type: float
  sample: 2.31
unit_state:
  description: The state of O(unit) when planning.
  returned: when O(unit) is set
  type: dict
  sample:
    name: sglang-qwen.service
    load_state: loaded
    active_state: inactive
    sub_state: dead
    result: success
    main_pid: 0
    n_restarts: 0
    control_group: /system.slice/sglang-qwen.service
    exec_main_status: 0
option:
  description: The option that was refused.
  returned: when an option is invalid
  type: str
  sample: gpus
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.module_support import (  # noqa: E402
    command_runner,
    fail_refused_option,
)
from ansible_collections.llmops.inference.plugins.module_utils.reaper import (  # noqa: E402
    GpuReaper,
    ReapError,
    ReapInputError,
    parse_options,
)

ARGUMENT_SPEC = dict(
    unit=dict(type="str"),
    allow_active=dict(type="bool", default=False),
    match=dict(type="str"),
    orphans_only=dict(type="bool", default=False),
    pids=dict(type="list", elements="int"),
    gpus=dict(type="list", elements="str"),
    include_device_holders=dict(type="bool", default=False),
    backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
    signal=dict(type="str", default="SIGTERM"),
    grace=dict(type="float", default=10),
    wait_released=dict(type="bool", default=True),
    released_below_mib=dict(type="int"),
    timeout=dict(type="float", default=60),
    kill_timeout=dict(type="float", default=10),
    unaccounted_threshold_mib=dict(type="int", default=1024),
    fail_on_unreapable=dict(type="bool", default=True),
)


def report(module, result: dict) -> dict:
    for warning in result.pop("warnings", []):
        module.warn(warning)
    diff = result.pop("diff", None)
    if module._diff and diff:
        result["diff"] = diff
    return result


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        options = parse_options(module.params)
        result = GpuReaper(options, command_runner(module)).run(check_mode=module.check_mode)
    except ReapInputError as exc:
        fail_refused_option(module, exc)
    except ReapError as exc:
        module.fail_json(msg=str(exc), **report(module, exc.result))
    module.exit_json(**report(module, result))


if __name__ == "__main__":
    main()
