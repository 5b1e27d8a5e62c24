"""extensions/molecule_all.py: every scenario runs, side by side, and one failure fails the run."""

from __future__ import annotations

import importlib.util
import io
import stat
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("molecule_all", REPO / "extensions" / "molecule_all.py")
molecule_all = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(molecule_all)


def fake_molecule(tmp_path: Path, failing: str = "") -> str:
    """A stand-in for molecule: logs each call, fails for the scenario named ``failing``."""
    script = tmp_path / "molecule"
    log = tmp_path / "calls"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\necho "converged $3"\n[ "$3" = "{failing}" ] && exit 3\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_the_scenarios_are_the_directories_with_a_molecule_yml():
    names = molecule_all.scenarios()
    assert {"sglang_service", "sglang_service_failures", "sglang_patch", "sglang_gateway"} <= set(names)
    assert "shared" not in names


def test_every_scenario_runs_and_each_output_and_duration_is_shown(tmp_path):
    out = io.StringIO()
    code = molecule_all.main(["--workers", "2", "--molecule", fake_molecule(tmp_path)], out=out)
    assert code == 0
    calls = sorted((tmp_path / "calls").read_text().splitlines())
    assert calls == sorted(f"test -s {name}" for name in molecule_all.scenarios())
    text = out.getvalue()
    for name in molecule_all.scenarios():
        assert f"===== molecule scenario {name}: passed in " in text
        assert f"converged {name}" in text


def test_one_failed_scenario_fails_the_run_after_the_others_ran(tmp_path):
    out = io.StringIO()
    code = molecule_all.main(
        [
            "--workers",
            "1",
            "--molecule",
            fake_molecule(tmp_path, failing="sglang_gateway"),
            "sglang_gateway",
            "sglang_patch",
        ],
        out=out,
    )
    assert code == 1
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    assert "sglang_gateway: FAILED (exit 3)" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"), [(["--workers", "0"], "--workers must be 1 or more"), (["nope"], "unknown scenario(s) nope")]
)
def test_bad_input_is_named_and_runs_nothing(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        molecule_all.main([*args, "--molecule", fake_molecule(tmp_path)])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "calls").exists()
