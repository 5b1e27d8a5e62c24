"""GPU conformance kit: measure on this machine's GPUs what the collection and the lab assume, and check that the
collection's GPU inventory, reaper and GPU-free gate do their job against real holders.

    python3 tests/gpu/gpu_kit.py --out DIR [--backend auto|cuda|simgpu] [--max-gpus 2]

Needs python3's standard library, the driver's libcuda.so.1 and libnvidia-ml.so.1 (or, in the lab, simgpu's), and
this checkout's plugins/module_utils (imported without Ansible). pynvml is used where importable, as the modules use
it; without it the collection's inventory falls back to nvidia-smi, and the result says which one answered.
Writes DIR/gpu_kit.json (raw results) and DIR/summary.txt; exits 0 when every check passed. docs/gpu_conformance.md
explains each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import holders  # noqa: E402
import nvml_raw  # noqa: E402

KIT_VERSION = 1
RESULT_FILE = "gpu_kit.json"
SUMMARY_FILE = "summary.txt"
BUDGET_S = 230.0
LAG_HOLDERS_PER_GPU = 5
LAG_POLL_S = 0.002
LAG_TIMEOUT_S = 30.0
# A holder's memory counts as released once the board's used memory fell by this share of what NVML listed for it.
RELEASED_SHARE = 0.9
# On the lab, a measured release lag may exceed the configured one by the time a poll takes on a busy machine, and
# fall short of it by simgpu's millisecond rounding of the exit time.
LAB_LAG_SLACK_S = 0.5
LAB_LAG_EARLY_S = 0.01
KIT_TITLE_PREFIX = "gpu-kit::"
ROLE_DEFAULTS = REPO / "roles" / "sglang_service" / "defaults" / "main.yml"
MODULE_UTILS = REPO / "plugins" / "module_utils"


class KitError(Exception):
    """The kit could not run a step; the message says which and why."""


# -- the collection's own code, imported without Ansible ----------------------------------------------------------


def import_collection(root: Path):
    """Make this checkout importable as ansible_collections.llmops.inference under ``root`` (a link to it) and return
    the collection's gpu_query, gpu_smi, reaper, gpu_gate, procs and systemd modules."""
    namespace = root / "ansible_collections" / "llmops"
    namespace.mkdir(parents=True)
    (namespace / "inference").symlink_to(REPO)
    sys.path.insert(0, str(root))
    from ansible_collections.llmops.inference.plugins.module_utils import (
        gpu_gate,
        gpu_query,
        gpu_smi,
        procs,
        reaper,
        systemd,
    )

    return gpu_query, gpu_smi, reaper, gpu_gate, procs, systemd


def _scalar_setting(paths, name: str) -> str:
    """A one-line ``name: value`` (YAML) or ``NAME = "value"`` (Python) setting, read from the collection's files."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    for path in paths:
        match = re.search(rf"^{re.escape(name)}\s*[:=]\s*(.+?)\s*$", path.read_text(), re.MULTILINE)
        if match:
            return match.group(1).strip().strip("\"'")
    raise KitError(f"{name} not found in {', '.join(str(path) for path in paths)}")


def collection_settings() -> dict:
    """The values the role and the restart chain use (read from their files, not restated here)."""
    return {
        "gpu_free_threshold_mib": int(_scalar_setting(ROLE_DEFAULTS, "sglang_service_gpu_free_threshold_mib")),
        "gpu_free_wait_sec": float(_scalar_setting(ROLE_DEFAULTS, "sglang_service_gpu_free_wait_sec")),
        "reap_grace": float(_scalar_setting(ROLE_DEFAULTS, "sglang_service_reap_grace")),
        "reap_timeout": float(_scalar_setting(ROLE_DEFAULTS, "sglang_service_reap_timeout")),
        "orphan_pattern": _scalar_setting(sorted(MODULE_UTILS.glob("*.py")), "ORPHAN_PATTERN"),
    }


# -- the lab's assumptions -------------------------------------------------------------------------------------


def lab_assumptions(state) -> dict:
    """What the lab's simulated GPU assumes of every board, read from simgpu's own module (``simgpu_state``): the
    driver's reservation (NVML v2 ``reserved``, part of v1 ``used``), what an idle board's v2 ``used`` shows, the
    release lag (as configured for this state directory, and simgpu's default)."""
    reserved = int(state.reserved_mib()) if hasattr(state, "reserved_mib") else 0
    idle_used = int(getattr(state, "IDLE_USED_MIB", getattr(state, "DRIVER_RESERVED_MIB", 0)))
    return {
        "idle_used_v1_mib": idle_used + reserved,
        "reserved_v2_mib": reserved,
        "idle_used_v2_mib": idle_used,
        "release_lag_default_s": state.DEFAULT_RELEASE_LAG_MS / 1000.0,
        "release_lag_s": state.release_lag_s(),
    }


# -- the run -----------------------------------------------------------------------------------------------------


class Kit:
    def __init__(self, args):
        self.args = args
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.run_dir = Path(tempfile.mkdtemp(prefix="gpu-kit-run-"))
        self.children = []  # every holder or parent the kit started, killed at the end whatever happens
        self.units = []  # transient units the kit started, stopped at the end
        self.orphan_pids = set()  # holders whose parent exited, killed at the end if a reap missed them
        self.result = {
            "kit_version": KIT_VERSION,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": socket.gethostname(),
            "kernel": platform.release(),
            "python": sys.version.split()[0],
            "checks": [],
            "differences": [],
            "steps": {},
        }
        self.checks = self.result["checks"]
        self.backend = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, name: str, passed: bool, detail: str, kind: str = "function") -> bool:
        """Record a check. ``function``: the collection must do this anywhere. ``lab``: a lab assumption, binding on
        the lab's simulated GPU; on a real GPU a mismatch is recorded as a difference instead."""
        if kind == "lab" and self.backend == "cuda":
            if not passed:
                self.result["differences"].append({"name": name, "detail": detail})
            self.checks.append({"name": name, "kind": kind, "passed": True, "detail": detail, "recorded": True})
            return passed
        self.checks.append({"name": name, "kind": kind, "passed": bool(passed), "detail": detail})
        return passed

    def step(self, name: str, started: float) -> None:
        self.result["steps"][name] = round(time.monotonic() - started, 3)

    # -- setup --

    def setup(self) -> None:
        self.gpu_query, self.gpu_smi, self.reaper, self.gate, self.procs, self.systemd = import_collection(
            self.run_dir / "collections"
        )
        self.settings = collection_settings()
        self.result["collection_settings"] = self.settings
        try:
            self.backend, unusable = holders.choose_backend(self.args.backend)
        except holders.HolderError as exc:
            raise KitError(str(exc)) from None
        self.result["holder_backend"] = self.backend
        self.result["holder_backends_not_usable"] = unusable
        try:
            import pynvml

            self.result["pynvml"] = getattr(pynvml, "__file__", "importable")
        except ImportError as exc:
            self.result["pynvml"] = f"not importable ({exc}); the collection's inventory uses nvidia-smi"
        self.nvml = nvml_raw.Nvml()
        self.nvml.open()
        try:
            self.state = holders.simgpu_state()
        except holders.HolderError:
            self.state = None  # the lab's assumptions cannot be compared; recorded below
        self.result["lab_source"] = None if self.state is None else self.state.__file__

    # -- steps --

    def inventory_idle(self) -> None:
        started = time.monotonic()
        nvml = self.nvml
        self.result["driver_version"] = _try(nvml.driver_version)
        self.result["cuda_driver_version"] = _try(nvml.cuda_driver_version)
        count = nvml.count()
        self.result["gpu_count"] = count
        boards = []
        for index in range(min(count, self.args.max_gpus)):
            handle = nvml.handle(index)
            answers = nvml_raw.queries(nvml, handle)
            uuid = answers["uuid"].get("ok")
            board = {
                "index": index,
                "uuid": uuid,
                "name": answers["name"].get("ok"),
                "pci_bus_id": answers["pci_bus_id"].get("ok"),
                "mig_mode": answers["mig_mode"].get("ok"),
                "idle_memory_v1": answers["memory_v1"].get("ok"),
                "idle_memory_v2": answers["memory_v2"].get("ok"),
                "idle_processes": answers["compute_processes_v3"].get("ok"),
                "queries": {name: ("ok" if "ok" in answer else answer["error"]) for name, answer in answers.items()},
                "refused": sorted(
                    f"{name}: {answer['error']}"
                    for name, answer in answers.items()
                    if answer.get("error") in ("NOT_SUPPORTED", "NO_PERMISSION")
                ),
            }
            board["total_mib"] = (board["idle_memory_v1"] or {}).get("total_mib")
            board["in_mig_mode"] = bool(board["mig_mode"] and board["mig_mode"]["current"] == 1)
            boards.append(board)
        self.boards = boards
        self.result["boards"] = boards
        self.handles = {board["index"]: nvml.handle(board["index"]) for board in boards}
        backend_used, gpus = self.gpu_query.query_gpus("auto", self.gpu_smi.default_run_command)
        self.result["collection_inventory_backend"] = backend_used
        self.result["collection_inventory_idle"] = [gpu.as_dict() for gpu in gpus]
        for board in boards:
            listed = next((gpu for gpu in gpus if not gpu.is_mig and gpu.uuid == board["uuid"]), None)
            raw_used = (board["idle_memory_v1"] or {}).get("used_mib")
            self.check(
                f"GPU {board['index']}: the collection's inventory lists it with the driver's used memory",
                listed is not None and listed.used_mib == raw_used,
                f"{backend_used}: {listed.as_dict() if listed else 'not listed'}; NVML v1 used {raw_used} MiB",
            )
            reserved = (board["idle_memory_v2"] or {}).get("reserved_mib")
            self.check(
                f"GPU {board['index']}: the collection's inventory reads the driver's reservation (v2)",
                listed is not None and getattr(listed, "reserved_mib", reserved) == reserved,
                f"collection {getattr(listed, 'reserved_mib', 'not read')} MiB, NVML v2 reserved {reserved} MiB",
            )
            self.check(
                f"GPU {board['index']}: idle, no process listed",
                board["idle_processes"] == [],
                f"processes before the kit started any: {board['idle_processes']}",
            )
            if self.state is not None:
                self._compare_idle(board)
        self.step("inventory_idle", started)

    def _compare_idle(self, board: dict) -> None:
        expected = lab_assumptions(self.state)
        board["lab_assumptions"] = expected
        used = (board["idle_memory_v1"] or {}).get("used_mib")
        self.check(
            f"GPU {board['index']}: idle used (v1) is the lab's",
            used == expected["idle_used_v1_mib"],
            f"measured {used} MiB, lab {expected['idle_used_v1_mib']} MiB",
            kind="lab",
        )
        memory_v2 = board["idle_memory_v2"] or {}
        self.check(
            f"GPU {board['index']}: the driver's reservation (v2 reserved) is the lab's",
            memory_v2.get("reserved_mib") == expected["reserved_v2_mib"],
            f"measured {memory_v2.get('reserved_mib')} MiB (v2 query: {board['queries']['memory_v2']}), "
            f"lab {expected['reserved_v2_mib']} MiB",
            kind="lab",
        )
        self.check(
            f"GPU {board['index']}: idle used (v2) is the lab's",
            memory_v2.get("used_mib") == expected["idle_used_v2_mib"],
            f"measured {memory_v2.get('used_mib')} MiB, lab {expected['idle_used_v2_mib']} MiB",
            kind="lab",
        )
        mig = self._lab_mig(board["index"])
        self.check(
            f"GPU {board['index']}: MIG mode",
            board["in_mig_mode"] == mig if mig is not None else True,
            f"measured {board['mig_mode']}, lab state file: {'MIG' if mig else 'no MIG' if mig is not None else 'n/a'}",
            kind="lab",
        )

    def _lab_mig(self, index: int):
        if self.backend != "simgpu":
            return None
        gpu = next((gpu for gpu in self.state.read_gpus() if gpu.index == index), None)
        return None if gpu is None else gpu.mig_enabled

    def cuda_order(self) -> None:
        """UUID -> index: CUDA's ordinals under CUDA_DEVICE_ORDER=PCI_BUS_ID against NVML's indices."""
        started = time.monotonic()
        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        env.pop("CUDA_VISIBLE_DEVICES", None)
        argv = [sys.executable, str(HERE / "holders.py"), "enumerate", "--backend", self.backend]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            self.check("CUDA enumerates the GPUs", False, done.stderr.strip() or done.stdout.strip())
            return
        devices = json.loads(done.stdout)
        mapping = []
        for device in devices:
            try:
                nvml_index = self.nvml.index(self.nvml.handle_by_uuid(device["uuid"]))
            except nvml_raw.NvmlError as exc:
                nvml_index = str(exc)
            mapping.append(dict(device, nvml_index=nvml_index))
        self.result["cuda_order"] = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES_outside": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices": mapping,
        }
        same = all(entry["ordinal"] == entry["nvml_index"] for entry in mapping)
        self.check(
            "CUDA ordinal (PCI_BUS_ID order) equals the NVML index for every GPU",
            same,
            ", ".join(f"ordinal {e['ordinal']} {e['uuid']} -> NVML index {e['nvml_index']}" for e in mapping),
            kind="lab",
        )
        for board in self.boards:
            entry = next((e for e in mapping if e["uuid"] == board["uuid"]), None)
            if entry and entry["pci_bus_id"] and board["pci_bus_id"]:
                self.check(
                    f"GPU {board['index']}: CUDA and NVML agree on the PCI bus ID",
                    entry["pci_bus_id"].lower() in board["pci_bus_id"].lower(),
                    f"CUDA {entry['pci_bus_id']}, NVML {board['pci_bus_id']}",
                )
        self.step("cuda_order", started)

    def usable_boards(self) -> list:
        boards = [board for board in self.boards if not board["in_mig_mode"] and board["uuid"]]
        skipped = [board["index"] for board in self.boards if board not in boards]
        if skipped:
            self.result["boards_skipped_for_holders"] = {"gpus": skipped, "why": "in MIG mode"}
        return boards

    def _start(self, board: dict, mib: int, title: str) -> subprocess.Popen:
        proc = holders.start_holder(self.backend, board["index"], board["uuid"], mib, title, str(self.run_dir))
        self.children.append(proc)
        return proc

    def _snapshot(self) -> dict:
        """{GPU index: {"used_mib", "processes"}} from NVML directly."""
        found = {}
        for index, handle in self.handles.items():
            found[index] = {"used_mib": self.nvml.used_mib(handle), "processes": self.nvml.compute_processes(handle)}
        return found

    def accounting_and_lag(self) -> None:
        """Start LAG_HOLDERS_PER_GPU holders per GPU, read what NVML says of them, then kill them one by one and time
        how long each one's memory stays used after the process is gone."""
        started = time.monotonic()
        mib = self.args.lag_holder_mib
        procs = []
        for board in self.usable_boards():
            for rank in range(LAG_HOLDERS_PER_GPU):
                procs.append((board, self._start(board, mib, f"sglang::scheduler_TP{rank}")))
        reports = holders.wait_ready(str(self.run_dir), [proc.pid for _board, proc in procs], timeout=self.left() / 2)
        snapshot = self._snapshot()
        accounting = []
        for board, proc in procs:
            listed = [entry for entry in snapshot[board["index"]]["processes"] if entry["pid"] == proc.pid]
            report = reports[proc.pid]
            accounting.append(
                {
                    "gpu": board["index"],
                    "pid": proc.pid,
                    "nspid": report["nspid"],
                    "title": report["title"],
                    "allocated_mib": mib,
                    "listed": bool(listed),
                    "listed_used_mib": listed[0]["used_mib"] if listed else None,
                    "process_name": _try(self.nvml.process_name, proc.pid),
                }
            )
        own = {proc.pid for _board, proc in procs}
        foreign = {
            index: [entry for entry in gpu["processes"] if entry["pid"] not in own] for index, gpu in snapshot.items()
        }
        self.result["accounting"] = {
            "holders": accounting,
            "devices": snapshot,
            "pids_not_ours": foreign,
            "kit_pid_namespace_nested": len(_nspid()) > 1,
        }
        unlisted = [entry["pid"] for entry in accounting if not entry["listed"]]
        self.check(
            "NVML lists every holder under the PID the holder sees as its own",
            not unlisted,
            f"not listed: {unlisted}; listed PIDs not ours: {foreign} (a PID namespace between NVML and the holders?)",
        )
        short = [e for e in accounting if e["listed_used_mib"] is not None and e["listed_used_mib"] < mib]
        self.check(
            "NVML's per-process memory covers each holder's allocation",
            not short and not unlisted,
            ", ".join(f"pid {e['pid']}: {e['listed_used_mib']} MiB listed for {mib} MiB" for e in accounting),
        )
        exact = all(e["listed_used_mib"] == mib for e in accounting)
        self.check(
            "per-process memory is exactly the allocation (no context overhead)",
            exact,
            "overhead per process: "
            + ", ".join(f"{(e['listed_used_mib'] or 0) - mib} MiB" for e in accounting if e["listed"]),
            kind="lab",
        )
        self.result["release_lag"] = self._measure_lags(procs, snapshot)
        self.step("accounting_and_lag", started)

    def _measure_lags(self, procs: list, snapshot: dict) -> dict:
        samples = []
        for board, proc in procs:
            handle = self.handles[board["index"]]
            before = self.nvml.used_mib(handle)
            listed = next((e["used_mib"] for e in snapshot[board["index"]]["processes"] if e["pid"] == proc.pid), None)
            held = listed if listed is not None else self.args.lag_holder_mib
            target = before - RELEASED_SHARE * held
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            dead = time.monotonic()
            unlisted_s, released_s = None, None
            while time.monotonic() - dead < min(LAG_TIMEOUT_S, max(self.left(), 0)):
                now = time.monotonic()
                if unlisted_s is None and all(e["pid"] != proc.pid for e in self.nvml.compute_processes(handle)):
                    unlisted_s = now - dead
                if self.nvml.used_mib(handle) <= target:
                    released_s = now - dead
                    break
                time.sleep(LAG_POLL_S)
            samples.append(
                {
                    "gpu": board["index"],
                    "pid": proc.pid,
                    "held_mib": held,
                    "used_before_mib": before,
                    "unlisted_after_s": _round(unlisted_s),
                    "released_after_s": _round(released_s),
                }
            )
        lags = [sample["released_after_s"] for sample in samples if sample["released_after_s"] is not None]
        summary = {"samples": samples, "count": len(lags)}
        if lags:
            summary.update(min_s=min(lags), median_s=round(statistics.median(lags), 4), max_s=max(lags))
        self.check(
            f"memory of every killed holder is released within {LAG_TIMEOUT_S:g} s",
            len(lags) == len(samples) and len(lags) >= LAG_HOLDERS_PER_GPU,
            f"{len(lags)} of {len(samples)} released",
        )
        if self.state is not None and lags:
            lab = lab_assumptions(self.state)
            summary["lab_release_lag_s"] = lab["release_lag_s"]
            summary["lab_default_release_lag_s"] = lab["release_lag_default_s"]
            self.check(
                "release lag is the lab's",
                lab["release_lag_s"] - LAB_LAG_EARLY_S <= summary["min_s"]
                and summary["max_s"] <= lab["release_lag_s"] + LAB_LAG_SLACK_S,
                f"measured min/median/max {summary['min_s']}/{summary['median_s']}/{summary['max_s']} s, "
                f"lab {lab['release_lag_s']} s (default {lab['release_lag_default_s']} s)",
                kind="lab",
            )
        return summary

    def reap_and_gate(self) -> None:
        """Orphaned schedulers (title scope), one orphan reaped by PID, one bystander that must be spared; the gate
        must refuse before the reap and pass after it."""
        started = time.monotonic()
        boards = self.usable_boards()
        selectors = [str(board["index"]) for board in boards]
        mib = self.args.holder_mib
        spec = [
            {"index": board["index"], "uuid": board["uuid"], "mib": mib, "title": f"sglang::scheduler_TP{rank}"}
            for rank, board in enumerate(boards)
        ]
        spec.append({"index": boards[0]["index"], "uuid": boards[0]["uuid"], "mib": mib, "title": "gpu-kit::listed"})
        parent = subprocess.Popen(self._parent_argv(spec, "orphans"), stdin=subprocess.DEVNULL)
        self.children.append(parent)
        bystander = self._start(boards[0], self.args.bystander_mib, f"{KIT_TITLE_PREFIX}bystander")
        leftovers_unit = self._start_leftovers(boards, mib)
        parent.wait(timeout=max(self.left() / 2, 1))
        report = self._parent_report("orphans")
        holders.wait_ready(str(self.run_dir), [bystander.pid], timeout=max(self.left() / 2, 1))
        by_title = {entry["title"]: int(pid) for pid, entry in report["holders"].items()}
        schedulers = {pid for title, pid in by_title.items() if title.startswith("sglang::")}
        listed_pid = by_title["gpu-kit::listed"]
        leftovers = self._leftovers_ready(leftovers_unit)
        self.orphan_pids = schedulers | {listed_pid} | leftovers
        orphans = {}
        for pid in sorted(schedulers | {listed_pid} | leftovers):
            proc = self.procs.read_process(pid)
            orphans[pid] = {
                "title": proc.title if proc else None,
                "ppid": proc.ppid if proc else None,
                "is_orphan": bool(proc and self.procs.is_orphan(proc)),
            }
        self.result["orphans"] = orphans
        self.check(
            "holders whose parent died are orphans as the collection reads /proc",
            all(entry["is_orphan"] for entry in orphans.values()),
            ", ".join(f"pid {pid} parent {e['ppid']} orphan={e['is_orphan']}" for pid, e in orphans.items()),
        )
        threshold = self.settings["gpu_free_threshold_mib"]
        passed, message = self.gate.check_gpus_free(selectors, threshold, 0.0, unit="gpu-kit")
        self.result["gate_before_reap"] = {"passed": passed, "message": message}
        self.check("the GPU-free gate refuses while the orphans hold memory", not passed, message)

        common = {"gpus": selectors, "grace": self.settings["reap_grace"], "timeout": self._reap_timeout()}
        # The PID-list reap first: the title reap, as the restart chain runs it, waits until each GPU is down to the
        # gate's threshold, which an orphan out of its scope would keep it from reaching.
        pid_result = self._reap("reap_by_pid", dict(common, pids=[listed_pid]))
        reaped_by_pid = {entry["pid"] for entry in pid_result.get("reaped", [])}
        self.check(
            "the reaper (PID list) reaps exactly the listed PID and waits for its memory",
            reaped_by_pid == {listed_pid} and not pid_result.get("failed"),
            f"reaped {sorted(reaped_by_pid)}; {pid_result.get('msg', 'no failure')}",
        )
        spared = [pid for pid in [*sorted(schedulers), bystander.pid] if self.procs.is_alive(pid)]
        self.check(
            "the reaper (PID list) spares every holder it was not given",
            len(spared) == len(schedulers) + 1,
            f"alive after it: {spared} of {[*sorted(schedulers), bystander.pid]}",
        )
        if leftovers_unit:
            self._reap_leftovers(leftovers_unit, leftovers, common, schedulers | {bystander.pid})
        common["timeout"] = self._reap_timeout()
        title_scope = dict(
            common, match=self.settings["orphan_pattern"], orphans_only=True, released_below_mib=threshold
        )
        title_result = self._reap("reap_by_title", title_scope)
        reaped = {entry["pid"] for entry in title_result.get("reaped", [])}
        self.check(
            "the reaper (orphans titled like SGLang's, as the restart chain scopes it) reaps exactly the schedulers",
            reaped == schedulers and not title_result.get("failed"),
            f"reaped {sorted(reaped)}, schedulers {sorted(schedulers)}; {title_result.get('msg', 'no failure')}",
        )
        self.check(
            "the reaper (title scope) spares a holder out of its scope",
            self.procs.is_alive(bystander.pid) and bystander.pid not in reaped,
            f"bystander pid {bystander.pid} {KIT_TITLE_PREFIX}bystander, the kit's child: "
            f"alive={self.procs.is_alive(bystander.pid)}",
        )
        after = self._snapshot()
        left = {
            index: [e["pid"] for e in gpu["processes"] if e["pid"] in schedulers | {listed_pid} | leftovers]
            for index, gpu in after.items()
        }
        self.check(
            "after the reaps NVML lists none of the reaped holders",
            not any(left.values()),
            f"still listed: {left}; used now: { {i: g['used_mib'] for i, g in after.items()} }",
        )
        bystander_mib = next(
            (e["used_mib"] for e in after[boards[0]["index"]]["processes"] if e["pid"] == bystander.pid), None
        )
        self.result["bystander"] = {"pid": bystander.pid, "listed_used_mib": bystander_mib}
        passed, message = self.gate.check_gpus_free(
            selectors, threshold, min(self.settings["gpu_free_wait_sec"], max(self.left(), 1)), unit="gpu-kit"
        )
        self.result["gate_after_reap"] = {"passed": passed, "message": message}
        self.check(
            "the GPU-free gate passes after the reap (the spared bystander holds less than the threshold)",
            passed,
            message,
        )
        bystander.terminate()
        bystander.wait(timeout=30)
        self.step("reap_and_gate", started)

    def _parent_argv(self, spec: list, name: str) -> list:
        ready_dir = self.run_dir / name
        ready_dir.mkdir()
        holder = str(HERE / "holders.py")
        return [
            sys.executable,
            holder,
            "parent",
            "--backend",
            self.backend,
            "--spec",
            json.dumps(spec),
            "--ready-dir",
            str(ready_dir),
        ]

    def _parent_report(self, name: str, timeout: float = 0.0) -> dict:
        path = self.run_dir / name / "parent.json"
        deadline = time.monotonic() + timeout
        while not path.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not path.is_file():
            raise KitError(f"the {name} holders' parent did not report within {timeout:g} s")
        report = json.loads(path.read_text())
        if not report.get("ok"):
            raise KitError(f"{name} holders did not start: {report.get('error')}")
        return report

    def _start_leftovers(self, boards: list, mib: int) -> str | None:
        """Where systemd runs: a transient unit with KillMode=process whose main process starts a scheduler per GPU
        and exits, so they stay in the stopped unit's cgroup, as SGLang's schedulers do after an unclean stop."""
        why = None
        if not self.systemd.systemd_booted():
            why = "systemd is not the init system here"
        elif shutil.which("systemd-run") is None:
            why = "systemd-run not found"
        if why:
            self.result["reap_by_unit"] = {"skipped": why}
            return None
        unit = f"gpu-kit-leftovers-{os.getpid()}.service"
        spec = [
            {"index": board["index"], "uuid": board["uuid"], "mib": mib, "title": f"sglang::scheduler_TP{rank}"}
            for rank, board in enumerate(boards)
        ]
        argv = ["systemd-run", "--quiet", "--unit", unit, "--property", "KillMode=process"]
        for name in ("SIMGPU_STATE_DIR", "SIMGPU_RELEASE_LAG_MS", "LD_LIBRARY_PATH"):
            if name in os.environ:
                argv += ["--setenv", f"{name}={os.environ[name]}"]
        done = subprocess.run(argv + self._parent_argv(spec, "unit"), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise KitError(f"systemd-run failed (rc={done.returncode}): {(done.stderr or done.stdout).strip()}")
        self.units.append(unit)
        return unit

    def _leftovers_ready(self, unit: str | None) -> set:
        """The leftovers' PIDs once the unit's main process has exited and the unit is no longer running."""
        if unit is None:
            return set()
        report = self._parent_report("unit", timeout=max(self.left() / 2, 1))
        pids = {int(pid) for pid in report["holders"]}
        deadline = time.monotonic() + 30
        while self.systemd.show_unit(self.gpu_smi.default_run_command, unit).is_running:
            if time.monotonic() > deadline:
                raise KitError(f"{unit} still running 30 s after its main process exited")
            time.sleep(0.1)
        return pids

    def _reap_leftovers(self, unit: str, leftovers: set, common: dict, others: set) -> None:
        """The restart chain's first reap: the stopped unit's cgroup, without waiting for the release."""
        result = self._reap("reap_by_unit", dict(common, unit=unit, wait_released=False))
        reaped = {entry["pid"] for entry in result.get("reaped", [])}
        self.check(
            "the reaper (a stopped unit's cgroup) reaps exactly the unit's leftovers",
            reaped == leftovers and not result.get("failed"),
            f"reaped {sorted(reaped)}, leftovers in {unit}: {sorted(leftovers)}; {result.get('msg', 'no failure')}",
        )
        alive = sorted(pid for pid in others if self.procs.is_alive(pid))
        self.check(
            "the reaper (unit scope) spares the holders outside the unit",
            alive == sorted(others),
            f"alive after it: {alive} of {sorted(others)}",
        )

    def _reap_timeout(self) -> float:
        return max(min(self.settings["reap_timeout"], self.left() - 20), 5)

    def _reap(self, name: str, params: dict) -> dict:
        started = time.monotonic()
        try:
            options = self.reaper.parse_options(params)
            result = self.reaper.GpuReaper(options, self.gpu_smi.default_run_command).run(check_mode=False)
        except self.reaper.ReapError as exc:
            result = dict(exc.result, failed=True, msg=str(exc))
        result["params"] = params
        result["elapsed_s"] = round(time.monotonic() - started, 3)
        self.result[name] = result
        self.step(name, started)
        return result

    # -- ending --

    def cleanup(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in self.orphan_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # already gone: the reaper did its job
        for unit in self.units:
            subprocess.run(["systemctl", "stop", unit], capture_output=True, check=False)
            subprocess.run(["systemctl", "reset-failed", unit], capture_output=True, check=False)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if hasattr(self, "nvml"):
            self.nvml.close()

    def finish(self, error: str | None) -> int:
        self.result["elapsed_s"] = round(time.monotonic() - self.started, 3)
        self.result["budget_s"] = self.args.budget
        if error:
            self.result["error"] = error
        self.check(
            "the kit finished within its budget",
            self.result["elapsed_s"] <= self.args.budget,
            f"{self.result['elapsed_s']} s of {self.args.budget:g} s",
        )
        failed = [check for check in self.checks if not check["passed"]]
        self.result["passed"] = not failed and not error
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / RESULT_FILE).write_text(json.dumps(self.result, indent=2, sort_keys=True, default=str) + "\n")
        summary = render_summary(self.result)
        (out / SUMMARY_FILE).write_text(summary)
        sys.stdout.write(summary)
        print(f"results: {out / RESULT_FILE}\nsummary: {out / SUMMARY_FILE}")
        return 0 if self.result["passed"] else 1

    def run(self) -> int:
        error = None
        try:
            self.setup()
            self.inventory_idle()
            self.cuda_order()
            if not self.usable_boards():
                raise KitError("no GPU outside MIG mode to start holders on")
            self.accounting_and_lag()
            self.reap_and_gate()
        except (KitError, holders.HolderError, nvml_raw.NvmlError, OSError, subprocess.SubprocessError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self.cleanup()
        return self.finish(error)


def _nspid() -> list:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:]
    return []


def _try(call, *args):
    try:
        return call(*args)
    except nvml_raw.NvmlError as exc:
        return {"error": nvml_raw.error_name(exc.code)}


def _round(value):
    return None if value is None else round(value, 4)


def render_summary(result: dict) -> str:
    lines = [
        f"GPU conformance kit: {'PASSED' if result.get('passed') else 'FAILED'} in {result.get('elapsed_s')} s "
        f"(holders: {result.get('holder_backend')}, "
        f"collection inventory: {result.get('collection_inventory_backend')})",
        f"host {result.get('host')}, driver {result.get('driver_version')}, CUDA {result.get('cuda_driver_version')}",
    ]
    if result.get("error"):
        lines.append(f"ERROR: {result['error']}")
    for board in result.get("boards", []):
        v1, v2 = board.get("idle_memory_v1") or {}, board.get("idle_memory_v2") or {}
        lines.append(
            f"GPU {board['index']} {board['name']} {board['uuid']}: idle used v1 {v1.get('used_mib')} MiB, "
            f"v2 reserved {v2.get('reserved_mib')} MiB used {v2.get('used_mib')} MiB of {v1.get('total_mib')} MiB; "
            f"MIG {board.get('mig_mode')}; refused: {', '.join(board['refused']) or 'none'}"
        )
    lag = result.get("release_lag") or {}
    if lag.get("count"):
        lines.append(
            f"release lag over {lag['count']} holders: min {lag['min_s']} s, median {lag['median_s']} s, "
            f"max {lag['max_s']} s (lab: {lag.get('lab_release_lag_s')} s)"
        )
    for check in result.get("checks", []):
        mark = "ok  " if check["passed"] else "FAIL"
        if check.get("recorded"):
            mark = "rec "
        lines.append(f"  {mark} {check['name']}")
        if not check["passed"]:
            lines.append(f"       {check['detail']}")
    for difference in result.get("differences", []):
        lines.append(f"  differs from the lab: {difference['name']}: {difference['detail']}")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for gpu_kit.json and summary.txt")
    parser.add_argument("--backend", choices=("auto", *holders.BACKENDS), default="auto", help="holder backend")
    parser.add_argument("--max-gpus", type=int, default=2, help="use at most this many GPUs (default 2)")
    parser.add_argument("--holder-mib", type=int, default=4096, help="memory of each orphaned holder (MiB)")
    parser.add_argument("--lag-holder-mib", type=int, default=2048, help="memory of each release-lag holder (MiB)")
    parser.add_argument("--bystander-mib", type=int, default=64, help="memory of the holder the reaper must spare")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds the whole run may take")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_gpus < 1:
        print("--max-gpus must be at least 1", file=sys.stderr)
        return 2
    return Kit(args).run()


if __name__ == "__main__":
    sys.exit(main())
