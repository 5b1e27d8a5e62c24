"""The lab CLI: input validation, prerequisites, and that `down` leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB_DIR))

from labctl import cli, hosts, system  # noqa: E402
from labctl.state import LabState, addresses  # noqa: E402

LAB = [str(LAB_DIR / "lab")]


def run_lab(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*LAB, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hosts", "0"], "--hosts must be from 1 to 127, got 0"),
        (["--hosts", "two"], "--hosts must be an integer from 1 to 127, got 'two'"),
        (["--hosts", "128"], "--hosts must be from 1 to 127, got 128"),
        (["--gpus", "0"], "--gpus must be from 1 to 16, got 0"),
        (["--mig", "0:4"], "--mig 0:4: MIG split 4: accepted counts are 1, 2, 3 and 7"),
        (["--mig", "two"], "--mig must be GPU:SPEC"),
        (["--gpus", "2", "--mig", "2:2"], "--mig names GPU 2 but hosts have 2 GPU(s)"),
        (["--gpu-reserved-mib", "-1"], "--gpu-reserved-mib must be from 0 to 81558, got -1"),
        (["--sim-env", "PATH=/tmp"], "--sim-env must be SGLANG_SIM_NAME=VALUE"),
        (["--sim-env", "SGLANG_SIM_SIGTERM_POLL"], "--sim-env must be SGLANG_SIM_NAME=VALUE"),
        (["--sim-env", "SGLANG_SIM_FAULTS=a b"], "--sim-env must be SGLANG_SIM_NAME=VALUE"),
        (["--name", "Lab_1"], "--name must be 1-6 lowercase letters or digits"),
        (["--name", "lab1"], "--name must be 1-6 lowercase letters or digits"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(args, message):
    state = LabState("badin")
    result = run_lab("up", "--name", "badin", *args) if "--name" not in args else run_lab("up", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not state.run_dir.exists()
    assert not hosts.lab_nspawn_pids(state)


def test_not_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(system.LabError, match="needs root"):
        system.require_root()


def test_missing_tools_name_the_packages(monkeypatch):
    monkeypatch.setattr(
        system.shutil, "which", lambda tool: None if tool in ("debootstrap", "systemd-nspawn") else "/x"
    )
    with pytest.raises(system.LabError) as err:
        system.require_tools()
    assert "debootstrap, systemd-nspawn" in str(err.value)
    assert "apt-get install -y debootstrap systemd-container" in str(err.value)


def test_addresses_fill_the_24_in_pairs():
    assert addresses(5, 1) == ("10.213.5.1", "10.213.5.2")
    assert addresses(5, 127) == ("10.213.5.253", "10.213.5.254")


def test_exec_names_unknown_host(capsys):
    assert cli.main(["exec", "--name", "nolab", "ghost", "--", "true"]) == 1
    assert "no host 'ghost' in lab nolab" in capsys.readouterr().err


def leftovers(name: str) -> list[str]:
    return hosts.leftover_report(LabState(name))


@pytest.mark.lab
def test_up_then_down_leaves_nothing():
    name = "cleana"
    try:
        up = run_lab("up", "--name", name, "--hosts", "1")
        assert up.returncode == 0, up.stderr
        inventory = Path(up.stdout.strip().splitlines()[-1])
        assert "ansible_host" in inventory.read_text()
        state = LabState(name)
        assert hosts.lab_nspawn_pids(state) and hosts.lab_mounts(state) and hosts.lab_links(state)
        probe = run_lab("exec", "--name", name, f"{name}1", "--", "systemctl", "is-system-running")
        assert probe.stdout.strip() in ("running", "degraded")
    finally:
        down = run_lab("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []
    assert not LabState(name).run_dir.exists()


@pytest.mark.lab
def test_up_killed_half_way_then_down_leaves_nothing():
    name = "cleanb"
    state = LabState(name)
    proc = subprocess.Popen(
        [*LAB, "up", "--name", name, "--hosts", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # Kill `up` as soon as the first container exists: mounts, links and nspawn are half made.
        assert system.wait_for(lambda: bool(hosts.lab_nspawn_pids(state)) or proc.poll() is not None, timeout=600)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert leftovers(name), "the killed run should have left something for down to clean"
    finally:
        down = run_lab("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []


@pytest.mark.lab
def test_up_cleans_a_stale_lab_of_the_same_name():
    name = "cleanc"
    try:
        first = run_lab("up", "--name", name, "--hosts", "1")
        assert first.returncode == 0, first.stderr
        old_pids = hosts.lab_nspawn_pids(LabState(name))
        second = run_lab("up", "--name", name, "--hosts", "1")
        assert second.returncode == 0, second.stderr
        new_pids = hosts.lab_nspawn_pids(LabState(name))
        assert len(new_pids) == 1
        assert not set(old_pids) & set(new_pids)
    finally:
        run_lab("down", "--name", name)
    assert leftovers(name) == []


@pytest.mark.lab
def test_each_host_has_cgroups_of_its_own():
    # Two hosts run a unit of the same name; stopping it on one (KillMode=control-group) leaves the other's.
    name = "cgrp"
    unit = "systemd-run --unit=twin --property=KillMode=control-group sleep 600"
    try:
        up = run_lab("up", "--name", name, "--hosts", "2")
        assert up.returncode == 0, up.stderr
        state = LabState(name)
        assert all(cgroup.is_dir() for host in ("cgrp1", "cgrp2") for cgroup in hosts.host_cgroups(state, host))
        for host in ("cgrp1", "cgrp2"):
            started = run_lab("exec", "--name", name, host, "--", "sh", "-c", unit)
            assert started.returncode == 0, started.stderr
        stopped = run_lab("exec", "--name", name, "cgrp1", "--", "systemctl", "stop", "twin.service")
        assert stopped.returncode == 0, stopped.stderr
        other = run_lab("exec", "--name", name, "cgrp2", "--", "systemctl", "show", "-P", "SubState", "twin.service")
        assert other.stdout.strip() == "running"
        again = run_lab("exec", "--name", name, "cgrp1", "--", "sh", "-c", unit)
        assert again.returncode == 0, again.stderr
    finally:
        down = run_lab("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []


def test_each_host_gets_the_venvs_ninja_a_shared_claims_dir_and_its_mig_devices(tmp_path, monkeypatch):
    from labctl import payload

    build = tmp_path / "build"
    build.mkdir()
    for name in ("libnvidia-ml.so.1", "nvidia-smi", "simgpu-claim"):
        (build / name).write_text("")
    (build / "simgpu_state.py").write_text((payload.SIMGPU_SRC / "simgpu_state.py").read_text())
    monkeypatch.setattr(payload, "run", lambda *a, **k: None)  # ldconfig
    root = tmp_path / "root"
    payload.install(root, "lab1", "10.213.0.2", "10.213.0.1", "ssh-ed25519 AAAA\n", 4, build, {1: "2", 3: "1g.10gb"})
    ninja = root / "opt/sglang/venv/bin/ninja"
    assert ninja.read_text().startswith("#!/opt/sglang/venv/bin/python\n") and ninja.stat().st_mode & 0o777 == 0o755
    assert (root / "var/lib/simgpu/claims").stat().st_mode & 0o7777 == 0o1777
    assert (root / "usr/local/lib/simgpu/simgpu_state.py").exists()
    gpus = payload.simgpu_state.read_gpus(root / "var/lib/simgpu")
    assert [len(g.mig) for g in gpus] == [0, 2, 0, 1]
    assert [m.profile for m in gpus[1].mig] == ["3g.40gb", "3g.40gb"] and gpus[3].mig[0].total_mib == 9984
    assert payload.mig_uuids("lab1", 4, {1: "2", 3: "1g.10gb"}) == [m.uuid for g in gpus for m in g.mig]
    # The driver's reservation: simgpu's default (an idle H100 80GB HBM3's), or the lab's --gpu-reserved-mib.
    assert payload.simgpu_state.reserved_mib(root / "var/lib/simgpu") == payload.simgpu_state.DEFAULT_RESERVED_MIB
    assert not (root / payload.SIM_ENV_CONF.lstrip("/")).exists()
    payload.install(root, "lab1", "10.213.0.2", "10.213.0.1", "ssh-ed25519 AAAA\n", 4, build, reserved_mib=1536,
                    sim_env={"SGLANG_SIM_SIGTERM_POLL": "1", "SGLANG_SIM_LOAD_TIME": "0.5"})  # fmt: skip
    assert payload.simgpu_state.reserved_mib(root / "var/lib/simgpu") == 1536
    # --sim-env: systemd's default environment for every unit the host starts.
    assert (root / payload.SIM_ENV_CONF.lstrip("/")).read_text() == (
        '[Manager]\nDefaultEnvironment="SGLANG_SIM_LOAD_TIME=0.5" "SGLANG_SIM_SIGTERM_POLL=1"\n'
    )
    version = [sys.executable, str(payload.NINJA_STANDIN), "--version"]
    stand_in = subprocess.run(version, capture_output=True, text=True, check=True)
    assert stand_in.stdout == "1.13.0\n"
