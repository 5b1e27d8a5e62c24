"""extensions/molecule_all.py: every scenario runs, side by side, and one failure fails the run."""

from __future__ import annotations

import importlib.util
import io
import stat
from pathlib import Path

import pytest
import yaml

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


def fake_lab(tmp_path: Path, hosts: int = 5, up_fails: bool = False) -> str:
    """A stand-in for tests/lab/lab: logs each call; ``up`` writes an inventory of ``hosts`` hosts, prints its path."""
    inventory = tmp_path / "lab-inventory.yml"
    rows = "".join(
        f"        molx{i}:\n          ansible_host: 10.0.0.{i}\n          lab_gpu_count: 4\n"
        for i in range(1, hosts + 1)
    )
    inventory.write_text(f"all:\n  children:\n    lab:\n      hosts:\n{rows}      vars:\n        ansible_user: root\n")
    script = tmp_path / "lab"
    up = "echo 'boot failed' >&2; exit 4" if up_fails else f"echo {inventory}"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "lab-calls"}\n[ "$1" = up ] && {{ {up}; }}\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def sharing_molecule(tmp_path: Path, failing: str = "") -> str:
    """A stand-in for molecule that keeps the shared lab's name and the inventory it was given."""
    script = tmp_path / "molecule"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$3 $MOLECULE_SHARED_LAB" >> {tmp_path / "calls"}\n'
        f'cp "$MOLECULE_SHARED_INVENTORY" {tmp_path}/"$3".inventory.yml\n'
        f'[ "$3" = "{failing}" ] && exit 3\nexit 0\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_shared_lab_boots_once_gives_each_scenario_hosts_of_its_own_and_goes_down_after_a_failure(tmp_path):

    out = io.StringIO()
    args = ["--workers", "2", "--shared-lab", "molx", "--lab-cli", fake_lab(tmp_path)]
    code = molecule_all.main([*args, "--molecule", sharing_molecule(tmp_path, failing="sglang_patch")], out=out)
    assert code == 1
    requests = {name: molecule_all.lab_request(name) for name in molecule_all.scenarios()}
    hosts = sum(request["hosts"] for request in requests.values())
    assert (tmp_path / "lab-calls").read_text().splitlines() == [
        f"up --name molx --hosts {hosts} --gpus 4 --cache-module-code --sim-env SGLANG_SIM_SIGTERM_POLL=1",
        "down --name molx",
    ]
    assert sorted((tmp_path / "calls").read_text().splitlines()) == sorted(f"{name} molx" for name in requests)
    given = {}
    for name, request in requests.items():
        inventory = yaml.safe_load((tmp_path / f"{name}.inventory.yml").read_text())["all"]["children"]["lab"]
        # the names the scenario's own files use, each an alias of a host of the shared lab
        assert list(inventory["hosts"]) == [f"{request['lab']}{i}" for i in range(1, request["hosts"] + 1)]
        assert inventory["vars"] == {"ansible_user": "root"}
        for variables in inventory["hosts"].values():
            assert variables["ansible_host"] == f"10.0.0.{variables['lab_host'][4:]}"
            given[variables["lab_host"]] = name
    assert len(given) == hosts  # no host serves two scenarios
    assert requests["sglang_service_failures"] == {"lab": "molf", "hosts": 2, "gpus": 2}


def test_a_shared_lab_that_does_not_boot_fails_every_scenario_and_is_taken_down(tmp_path):
    out = io.StringIO()
    args = ["--shared-lab", "molx", "--lab-cli", fake_lab(tmp_path, up_fails=True), "sglang_patch"]
    code = molecule_all.main([*args, "--molecule", sharing_molecule(tmp_path)], out=out)
    assert code == 1
    assert not (tmp_path / "calls").exists()
    assert (tmp_path / "lab-calls").read_text().splitlines()[-1] == "down --name molx"
    assert "lab up --name molx failed (exit 4)" in out.getvalue() and "boot failed" in out.getvalue()
    assert "sglang_patch               " in out.getvalue() and "FAILED (exit 1)" in out.getvalue()
