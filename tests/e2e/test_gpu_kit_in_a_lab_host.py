"""The GPU conformance kit (tests/gpu/gpu_kit.py) inside a lab host, as a user runs it on a GPU host: the checkout's
kit and module_utils copied in, run with the engine's Python (pynvml present, as on a real SGLang host), against the
host's simulated GPUs and its real systemd. It must pass with the lab's assumptions as expectations, within its
4-minute budget."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

# Both conftest modules (tests/e2e and tests/lab/tests) are named conftest: take nothing from either by name.
REPO = Path(__file__).resolve().parents[2]
LAB_CLI = REPO / "tests" / "lab" / "lab"

pytestmark = pytest.mark.lab

KIT_BUDGET_S = 240
DEST = "/root/gpu-kit"
OUT = "/root/gpu-kit-out"
# What the kit needs from the checkout: itself, the collection's module_utils, the role's defaults it reads, and the
# lab parts it borrows (process titles, simgpu's module; the host's installed simgpu module comes first).
PARTS = (
    "tests/gpu",
    "plugins/module_utils",
    "roles/sglang_service/defaults",
    "tests/lab/sglang_sim",
    "tests/lab/simgpu",
)
PYTHON = "/opt/sglang/venv/bin/python"


def _tree() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for part in PARTS:
            archive.add(
                REPO / part,
                arcname=part,
                filter=lambda info: None if "__pycache__" in info.name or info.name.endswith(".o") else info,
            )
    return buffer.getvalue()


def test_kit_passes_in_a_lab_host(clean_lab):
    lab = clean_lab
    host = lab.hosts[0]
    lab.exec(host, f"rm -rf {DEST} {OUT}", check=True)
    copy = subprocess.run(
        [
            str(LAB_CLI),
            "exec",
            "--name",
            lab.name,
            host,
            "--",
            "bash",
            "-c",
            f"rm -rf {DEST} {OUT}; mkdir -p {DEST}; tar -x -C {DEST}",
        ],
        input=_tree(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert copy.returncode == 0, copy.stderr.decode()
    started = time.monotonic()
    run = lab.exec(host, f"cd {DEST} && {PYTHON} tests/gpu/gpu_kit.py --out {OUT}", timeout=KIT_BUDGET_S + 60)
    took = time.monotonic() - started
    result = json.loads(lab.exec(host, f"cat {OUT}/gpu_kit.json", check=True).stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert result["passed"] and result["holder_backend"] == "simgpu"
    assert result["collection_inventory_backend"] == "nvml"
    assert took < KIT_BUDGET_S and result["elapsed_s"] < KIT_BUDGET_S, (took, result["elapsed_s"])
    assert len(result["boards"]) == 2 and result["release_lag"]["count"] >= 5
    # The orphans were reparented to the host's systemd (PID 1); with systemd present the kit also reaped the leftovers
    # of a stopped unit by its cgroup, one per GPU.
    assert all(entry["ppid"] == 1 for entry in result["orphans"].values()), result["orphans"]
    assert len(result["reap_by_unit"]["reaped"]) == len(result["boards"]), result["reap_by_unit"]
    assert "PASSED" in lab.exec(host, f"cat {OUT}/summary.txt", check=True).stdout
