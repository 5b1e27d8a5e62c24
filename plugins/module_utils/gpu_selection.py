# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether an engine's GPU list can work on this host, judged before anything on the host changes.

Private to the llmops.inference collection; not a public API (the ``gpus`` check of the sglang_info module).

The unit gives the engine its GPUs as ``CUDA_VISIBLE_DEVICES``; a list that cannot work is only found out once the
running engine was stopped: CUDA reads an unknown index as the end of the list and a repeated GPU as no GPU at all,
and a GPU that another unit's process holds is never freed by the restart's reap, which leaves other units alone.
Each of these is refused here, one line per GPU and reason:

- a GPU the host does not have (by index, ``GPU-`` UUID or ``MIG-`` UUID);
- a GPU named twice (also once by index and once by UUID);
- whole GPUs and MIG devices together: the unit lists whole GPUs by index and MIG devices by UUID, and CUDA stops
  reading the list at the first entry of the other kind;
- fewer CUDA devices than the engine's layout uses (tensor x pipeline parallel ranks per node, data-parallel
  replicas, ``--base-gpu-id`` and ``--gpu-id-step``), counting a list with MIG devices as one device: a CUDA
  process enumerates a single MIG device;
- memory held by a process outside the unit's reach. In reach are the processes in the unit's cgroup (the engine
  and its leftovers) and orphans titled ``^sglang::`` outside every running unit: the restart chain reaps both.
  A holder that this host's /proc does not show is either of another PID namespace or one that exited after the
  listing (a scheduler of a unit that restarts); while the GPUs, listed again, still show it, the host cannot see
  the driver's PIDs and is refused as pid_namespace.py says (as is a container host, unless its PIDs are visible).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ansible_collections.llmops.inference.plugins.module_utils.gpu import Gpu, GpuQueryError, select_gpus
from ansible_collections.llmops.inference.plugins.module_utils.gpu_query import query_gpus
from ansible_collections.llmops.inference.plugins.module_utils.pid_namespace import Unseen, detect_container, refusal
from ansible_collections.llmops.inference.plugins.module_utils.procs import is_orphan, read_process, wait_for
from ansible_collections.llmops.inference.plugins.module_utils.systemd import (
    SystemdError,
    list_running_units,
    normalize_unit_name,
    systemd_booted,
)

# The orphans a restart reaps besides the unit's own leftovers (titles SGLang's schedulers and detokenizer set).
ORPHAN_PATTERN = "^sglang::"

# SGLang 0.5.23's options that decide which CUDA devices the engine uses (srt/arg_groups/fields/parallel.py,
# fields/device.py), with their aliases.
_VALUED = {
    "--tp-size": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--pp-size": "pp_size",
    "--pipeline-parallel-size": "pp_size",
    "--dp-size": "dp_size",
    "--data-parallel-size": "dp_size",
    "--attn-dp-size": "attn_dp_size",
    "--attention-data-parallel-size": "attn_dp_size",
    "--nnodes": "nnodes",
    "--base-gpu-id": "base_gpu_id",
    "--gpu-id-step": "gpu_id_step",
}
_FLAGS = {"--enable-dp-attention": "enable_dp_attention"}
_SHOWN = (
    ("tp_size", "--tp-size", 1),
    ("pp_size", "--pp-size", 1),
    ("dp_size", "--dp-size", 1),
    ("nnodes", "--nnodes", 1),
    ("base_gpu_id", "--base-gpu-id", 0),
    ("gpu_id_step", "--gpu-id-step", 1),
)


@dataclass
class Layout:
    """How SGLang places its ranks on the CUDA devices it sees."""

    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1
    enable_dp_attention: bool = False
    nnodes: int = 1
    base_gpu_id: int = 0
    gpu_id_step: int = 1

    @property
    def replicas(self) -> int:
        """Data-parallel replicas, each on GPUs of its own. The deprecated ``--dp-size N --enable-dp-attention``
        means N attention groups inside the TP group (arg_groups/parallel_hook.py handle_deprecated_dp_attention)."""
        if self.enable_dp_attention and self.attn_dp_size == 1:
            return 1
        return max(self.dp_size, 1)

    def devices_needed(self) -> int:
        """One more than the highest CUDA device a rank of this node uses (entrypoints/engine.py
        _calculate_rank_ranges, weight_cache/protocol.py compute_local_gpu_id, and the replica offset of
        managers/data_parallel_controller.py launch_dp_schedulers)."""
        nnodes, pp_size, tp_size = max(self.nnodes, 1), max(self.pp_size, 1), max(self.tp_size, 1)
        step = max(self.gpu_id_step, 1)
        pp_per_node = max(pp_size // nnodes, 1)
        tp_per_node = max(tp_size // max(nnodes // pp_size, 1), 1)
        highest = (
            max(self.base_gpu_id, 0)
            + (self.replicas - 1) * tp_size * pp_size * step
            + (pp_per_node - 1) * tp_per_node
            + (tp_per_node - 1) * step
        )
        return highest + 1

    def describe(self) -> str:
        parts = [f"{flag} {getattr(self, name)}" for name, flag, default in _SHOWN if getattr(self, name) != default]
        if self.enable_dp_attention:
            parts.append("--enable-dp-attention")
        return ", ".join(parts or ["--tp-size 1"])


def parse_layout(tp_size, extra_args=()) -> Layout:
    """The layout of ``--tp-size tp_size`` followed by ``extra_args`` (the last of a repeated option wins, as in
    argparse); values that are not integers are left for SGLang to refuse."""
    layout = Layout(tp_size=int(tp_size))
    args = [str(arg) for arg in extra_args or ()]
    for position, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in _FLAGS and not equals:
            setattr(layout, _FLAGS[name], True)
        elif name in _VALUED:
            if not equals:
                value = args[position + 1] if position + 1 < len(args) else ""
            if re.fullmatch(r"\s*-?\d+\s*", value):
                setattr(layout, _VALUED[name], int(value))
    return layout


def _known(inventory: list) -> str:
    devices = [gpu for gpu in inventory if gpu.can_run]
    return ", ".join(f"{gpu.key} ({gpu.uuid})" if not gpu.is_mig else gpu.uuid for gpu in devices) or "none"


@dataclass
class Verdict:
    """What the check found: ``problems`` (each refuses the list), ``warnings``, and the facts behind them."""

    problems: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    devices: list = field(default_factory=list)
    holders: list = field(default_factory=list)
    needed: int = 0
    cuda_devices: int = 0

    def as_dict(self) -> dict:
        return {
            "devices": [gpu.as_dict() for gpu in self.devices],
            "holders": [dict(holder) for holder in self.holders],
            "needed": self.needed,
            "cuda_devices": self.cuda_devices,
            "problems": list(self.problems),
        }


# How long a holder out of reach may stay listed before it is refused: the driver lists a process until its CUDA
# context is torn down, a moment after the process is gone from /proc.
EXITED_HOLDER_WAIT_S = 2.0


@dataclass
class GpuListContext:
    """Whose GPU list it is: the unit that will run on it, the running units ({name: state}), the option's name in
    the messages, and where /proc is. ``relist`` lists the GPUs again (as gpu_query.query_gpus does), to tell a
    holder that exited after the first listing from one that holds the GPU; without it, every holder out of reach
    at the first look is refused."""

    unit: str | None = None
    running_units: dict | None = None
    label: str = "gpus"
    proc_root: str = "/proc"
    relist: object = None
    relist_timeout: float = EXITED_HOLDER_WAIT_S
    container: str | None = None  # what systemd-detect-virt --container named
    pids_visible: bool = False  # the operator says the driver's PIDs are this host's


class GpuListCheck:
    """Checks one GPU list against the host's GPUs (``inventory``, as gpu_query.query_gpus lists them)."""

    def __init__(self, selectors, inventory: list, layout: Layout, context: GpuListContext | None = None):
        context = context or GpuListContext()
        self.selectors = [str(selector).strip() for selector in selectors]
        self.inventory = inventory
        self.layout = layout
        self.unit = context.unit
        self.running = dict(context.running_units or {})
        self.label = context.label
        self.proc_root = context.proc_root
        self.relist = context.relist
        self.relist_timeout = context.relist_timeout
        self.container = context.container
        self.pids_visible = context.pids_visible
        self.verdict = Verdict()
        self.doubtful = []

    def _refuse(self, rule: str, detail: str) -> None:
        shown = "[" + ", ".join(self.selectors) + "]"
        self.verdict.problems.append(f"{self.label} {rule}: {detail}; got {shown}")

    def run(self) -> Verdict:
        verdict = self.verdict
        verdict.needed = self.layout.devices_needed()
        named, kinds = {}, []
        for selector in self.selectors:
            try:
                gpu = select_gpus(self.inventory, [selector])[0]
            except ValueError:
                self._refuse(
                    "must name GPUs this host has",
                    f"{selector} is not one of them (this host has {_known(self.inventory)})",
                )
                continue
            named.setdefault(gpu.uuid, (gpu, []))[1].append(selector)
            kinds.append((selector, "MIG devices" if gpu.is_mig else "whole GPUs"))
        for gpu, names in named.values():
            verdict.devices.append(gpu)
            if len(names) > 1:
                how = f"{names[0]} is named {len(names)} times" if len(set(names)) == 1 else " and ".join(names)
                self._refuse(
                    "must name each GPU once",
                    f"{how} ({gpu.display}, {gpu.uuid}); CUDA reads a list that repeats a GPU as no GPU at all",
                )
        if len({kind for _selector, kind in kinds}) > 1:
            first = kinds[0][1]
            dropped = next(selector for selector, kind in kinds if kind != first)
            self._refuse(
                "must name either whole GPUs (by index or GPU- UUID) or MIG devices (by MIG- UUID), not both",
                f"the list starts with {first} and CUDA stops reading it at {dropped}",
            )
        mig = any(gpu.is_mig or gpu.mig_enabled for gpu in verdict.devices)
        verdict.cuda_devices = min(len(verdict.devices), 1) if mig else len(verdict.devices)
        if not verdict.problems and verdict.cuda_devices < verdict.needed:
            gives = f"{verdict.cuda_devices}" + (f" ({', '.join(self.selectors)})" if self.selectors else "")
            if mig and len(verdict.devices) > 1:
                gives += ": a CUDA process enumerates a single MIG device"
            self._refuse(
                f"must give the engine at least {verdict.needed} GPU(s)",
                f"its layout ({self.layout.describe()}) uses CUDA devices up to {verdict.needed - 1}, and the list "
                f"gives it {gives}",
            )
        for gpu in verdict.devices:
            self._check_holders(gpu)
        unseen = self._judge_doubtful_holders()
        refused = refusal(self.label, self.container, unseen, self.pids_visible)
        if refused:
            verdict.problems.append(refused)
        return verdict

    def _in_reach(self, proc) -> bool:
        """Whether the unit's restart reaps ``proc``: its own leftovers, or a ``^sglang::`` orphan of no running
        unit (the restart chain's two reap scopes)."""
        if self.unit and proc.in_unit(self.unit):
            return True
        orphan_title = re.search(ORPHAN_PATTERN, proc.title) or re.search(ORPHAN_PATTERN, proc.cmdline)
        return bool(self.unit and orphan_title and is_orphan(proc, self.proc_root) and proc.unit not in self.running)

    def _owner(self, proc) -> str:
        if proc.unit in self.running:
            return f"of the {self.running[proc.unit]} unit {proc.unit}"
        if proc.unit:
            return f"of the unit {proc.unit}"
        return "outside every unit"

    def _check_holders(self, gpu: Gpu) -> None:
        where = f"{gpu.display} ({gpu.uuid})"
        if not gpu.processes_known:
            errors = "; ".join(error["error"] for error in gpu.errors if error["field"] == "processes")
            self.verdict.warnings.append(
                f"{self.label}: the processes on {where} cannot be listed ({errors or 'unknown error'}); whether "
                "another process holds its memory is not checked"
            )
            return
        for holder in gpu.processes:
            entry = {"gpu": gpu.index, "uuid": gpu.uuid, "pid": holder.pid, "mib": holder.used_mib}
            proc = self._look_at(holder, entry)
            self.verdict.holders.append(entry)
            if not entry["in_reach"]:
                self.doubtful.append((gpu, holder, entry, proc))

    def _look_at(self, holder, entry: dict):
        """Fill ``entry`` from what /proc shows of the holder now; the process, or None when /proc does not show it."""
        proc = read_process(holder.pid, self.proc_root)
        entry.update(title=proc.title if proc else None, unit=proc.unit if proc else None)
        entry["in_reach"] = proc is not None and self._in_reach(proc)
        return proc

    def _refuse_holder(self, gpu: Gpu, holder, whose: str) -> None:
        rule = f"must name GPUs that no process outside {self.unit} holds" if self.unit else "must name free GPUs"
        memory = "memory" if holder.used_mib is None else f"{holder.used_mib} MiB"
        stop = f"a restart of {self.unit} leaves it alone" if self.unit else "the engine could not use it"
        where = f"{gpu.display} ({gpu.uuid})"
        self._refuse(rule, f"{where} holds {memory} of {whose}; {stop}: stop that process or name other GPUs")

    def _judge_doubtful_holders(self) -> list:
        """Refuse the holders out of reach only once the GPUs, listed again until they are gone or for
        ``relist_timeout`` seconds, still show them, and /proc, read again, still puts them out of reach. A process
        that is exiting (a restarting unit's scheduler) can be listed on the GPU and then be gone from /proc, or
        show no cgroup, by the time /proc is read; it leaves the listing a moment later and is forgotten. Returns
        the holders still listed that /proc does not show (:class:`Unseen`): not refused one by one, they say the
        host cannot see the driver's PIDs."""
        unseen = []
        listed = {(gpu.uuid, holder.pid) for gpu, holder, _entry, _proc in self.doubtful}

        def all_exited() -> bool:
            try:
                _backend, inventory = self.relist()
            except GpuQueryError:
                return False
            listed.intersection_update((gpu.uuid, process.pid) for gpu in inventory for process in gpu.processes)
            return not listed

        relisted = bool(listed) and self.relist is not None
        if relisted:
            wait_for(all_exited, self.relist_timeout, interval=0.2)
        for gpu, holder, entry, proc in self.doubtful:
            if (gpu.uuid, holder.pid) not in listed:
                self.verdict.holders.remove(entry)
                continue
            if relisted:
                proc = self._look_at(holder, entry)
            if entry["in_reach"]:
                continue
            if proc is None:
                unseen.append(Unseen(f"{gpu.display} ({gpu.uuid})", holder.pid, holder.used_mib))
            else:
                self._refuse_holder(gpu, holder, f"pid {holder.pid} {proc.title!r} {self._owner(proc)}")
        return unseen


def check_gpu_list(selectors, inventory: list, layout: Layout, **options) -> Verdict:
    """Check ``selectors`` (indexes, GPU- or MIG- UUIDs) against ``inventory``; ``options`` are GpuListContext's."""
    return GpuListCheck(selectors, inventory, layout, GpuListContext(**options)).run()


def inspect_gpu_list(params: dict, run_command, *, query=query_gpus, booted=systemd_booted, proc_root="/proc") -> tuple:
    """``(facts, problems, warnings)`` for the sglang_info module's ``gpus`` options: ``devices``, ``tp_size``,
    ``extra_args``, ``unit``, ``label``, ``backend`` and ``pids_visible``. A host whose GPUs cannot be listed is a
    problem: nothing can be judged, and a restart would stop the engine before finding out."""
    label = params.get("label") or "gpus"
    try:
        backend, inventory = query(params.get("backend") or "auto", run_command)
    except GpuQueryError as exc:
        return {}, [f"{label} cannot be checked against this host's GPUs: {exc}"], []
    unit = normalize_unit_name(params["unit"]) if params.get("unit") else None
    running = {}
    if unit and booted():
        try:
            running = list_running_units(run_command)
        except SystemdError as exc:
            return {"backend": backend}, [f"{label} cannot be checked: {exc}"], []
    layout = parse_layout(params.get("tp_size") or 1, params.get("extra_args"))
    container = detect_container(run_command)
    verdict = check_gpu_list(
        params.get("devices") or [],
        inventory,
        layout,
        unit=unit,
        running_units=running,
        label=label,
        proc_root=proc_root,
        relist=lambda: query(backend, run_command),
        container=container,
        pids_visible=bool(params.get("pids_visible")),
    )
    return dict(verdict.as_dict(), backend=backend), verdict.problems, verdict.warnings
