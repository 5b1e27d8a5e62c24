"""The GPU conformance kit (tests/gpu/gpu_kit.py) against a private simgpu: it passes with the lab's assumptions as
its expectations, and a figure that differs from them fails it. No root and no lab host needed; the lab run is
tests/e2e/test_gpu_kit.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

KIT = Path(__file__).resolve().parents[2] / "gpu" / "gpu_kit.py"
KIT_BUDGET_S = 240


def run_kit(env, out: Path, *args) -> tuple:
    done = subprocess.run(
        [sys.executable, str(KIT), "--out", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=KIT_BUDGET_S + 60,
        check=False,
    )
    result = json.loads((out / "gpu_kit.json").read_text())
    return done, result


def lab_env(env, build_dir):
    """The lab's own release lag (the fixture's 0 ms is a test shortcut), simgpu's nvidia-smi on PATH."""
    env = {key: value for key, value in env.items() if key != "SIMGPU_RELEASE_LAG_MS"}
    env["PATH"] = f"{build_dir}:{env.get('PATH', '')}"
    return env


def test_kit_passes_on_simgpu(env, build_dir, tmp_path):
    done, result = run_kit(lab_env(env, build_dir), tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert result["passed"] and result["holder_backend"] == "simgpu"
    assert result["elapsed_s"] < KIT_BUDGET_S
    assert [board["index"] for board in result["boards"]] == [0, 1]
    assert result["release_lag"]["count"] >= 5
    assert result["gate_before_reap"]["passed"] is False and result["gate_after_reap"]["passed"] is True
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary.startswith("GPU conformance kit: PASSED")


def test_kit_fails_where_a_board_differs_from_the_lab(env, build_dir, state_dir, tmp_path):
    """Memory held on an idle board (here: left by a gone process until a GPU reset): the kit fails and names it."""
    (state_dir / "claims" / "gpu0.pid999999").write_text("700 stuck\n")
    done, result = run_kit(lab_env(env, build_dir), tmp_path / "out", "--max-gpus", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [check["name"] for check in result["checks"] if not check["passed"]]
    assert failed == ["GPU 0: idle used (v1) is the lab's", "GPU 0: idle used (v2) is the lab's"], failed
    assert "FAIL GPU 0: idle used (v1) is the lab's" in (tmp_path / "out" / "summary.txt").read_text()
