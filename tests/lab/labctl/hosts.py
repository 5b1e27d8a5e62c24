"""Boot lab hosts (overlay + systemd-nspawn + veth) and tear down everything a lab made."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

from .image import WHEEL_DIR
from .state import LabState
from .system import LabError, run, wait_for

BOOT_TIMEOUT = 120.0
# The cgroup hierarchies systemd-nspawn and the hosts' systemd use on a hybrid (v1 + v2) machine.
CGROUP_HIERARCHIES = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
CGROUP_LAB_DIR = "llmops-lab"


def mount_overlay(lower: Path, host_dir: Path) -> Path:
    upper, work, merged = host_dir / "upper", host_dir / "work", host_dir / "merged"
    for path in (upper, work, merged):
        path.mkdir(parents=True, exist_ok=True)
    run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)])
    return merged


def host_cgroups(state: LabState, host: str = "") -> list[Path]:
    """The lab's (or one host's) cgroup directories, in every hierarchy that this machine mounts."""
    parts = [CGROUP_LAB_DIR, state.name] + ([host] if host else [])
    return [root.joinpath(*parts) for root in CGROUP_HIERARCHIES if (root / "cgroup.procs").exists()]


def _enter_cgroups(cgroups: list[Path]):
    def enter() -> None:
        for cgroup in cgroups:
            (cgroup / "cgroup.procs").write_text("0")

    return enter


def start_container(host: str, merged: Path, log_path: Path, cgroups: list[Path]) -> int:
    """Start systemd-nspawn detached in its own session and cgroups; return its PID.

    With --keep-unit and no systemd outside, nspawn puts the container under its own cgroup. Started from
    one cgroup, every host would share one tree: one host's systemd would then remove, kill and count
    the processes of another host's unit of the same name. So each host gets a cgroup of its own first.
    """
    for cgroup in cgroups:
        cgroup.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                "systemd-nspawn",
                "-D",
                str(merged),
                "-M",
                host,
                "-b",
                "--register=no",
                "--keep-unit",
                "--network-veth",
                "--console=read-only",
                # The pinned wheels, read-only: tests reinstall pristine sglang sources from them.
                f"--bind-ro={WHEEL_DIR}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_enter_cgroups(cgroups),  # noqa: PLW1509 - writes only its own pid to cgroup files
        )
    return proc.pid


def container_init(nspawn_pid: int) -> int | None:
    """PID (outside) of the container's systemd: the nspawn process's child."""
    try:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def veth_name(host: str) -> str:
    return f"ve-{host}"


def configure_host_link(host: str, address: str, peer: str) -> None:
    link = veth_name(host)
    if not wait_for(lambda: link_exists(link), timeout=30):
        raise LabError(f"{host}: veth link {link} did not appear")
    run(["ip", "addr", "replace", address, "peer", peer, "dev", link])
    run(["ip", "link", "set", link, "up"])


def system_state(init_pid: int) -> str:
    proc = run(["nsenter", "-t", str(init_pid), "-a", "systemctl", "is-system-running"], check=False)
    return proc.stdout.strip()


def sshd_answers(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=1) as sock:
            sock.settimeout(2)
            return sock.recv(16).startswith(b"SSH-")
    except OSError:
        return False


def wait_booted(host: str, nspawn_pid: int, peer: str, log_path: Path) -> int:
    """Wait until systemd in the host reports running and sshd answers; return the init PID."""
    init_pid: list[int] = []

    def booted() -> bool:
        if not Path(f"/proc/{nspawn_pid}").exists():
            raise LabError(f"{host}: systemd-nspawn exited during boot; see {log_path}")
        if not init_pid:
            found = container_init(nspawn_pid)
            if found is None:
                return False
            init_pid.append(found)
        return system_state(init_pid[0]) in ("running", "degraded")

    if not wait_for(booted, timeout=BOOT_TIMEOUT, interval=0.2):
        raise LabError(f"{host}: systemd did not reach 'running' within {BOOT_TIMEOUT:.0f}s; see {log_path}")
    if not wait_for(lambda: sshd_answers(peer), timeout=60, interval=0.2):
        raise LabError(f"{host}: sshd on {peer}:22 did not answer within 60s")
    return init_pid[0]


def lab_nspawn_pids(state: LabState) -> list[int]:
    """Every systemd-nspawn process booted from this lab's host directories (state file or not)."""
    marker = f"{state.hosts_dir}/"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        is_nspawn = bool(argv) and argv[0].endswith(b"systemd-nspawn")
        if is_nspawn and any(arg.decode(errors="replace").startswith(marker) for arg in argv):
            pids.append(int(entry.name))
    return pids


def lab_mounts(state: LabState) -> list[str]:
    """Mount points under this lab's host directories, deepest first."""
    prefix = f"{state.hosts_dir}/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def lab_links(state: LabState) -> list[str]:
    pattern = re.compile(rf"^ve-{re.escape(state.name)}\d+$")
    try:
        return sorted(name for name in os.listdir("/sys/class/net") if pattern.match(name))
    except OSError:
        return []


def stop_containers(pids: list[int], timeout: float = 20.0) -> None:
    """SIGTERM asks nspawn to power the container off cleanly; SIGKILL whatever is left."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    if not wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=timeout):
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def teardown(state: LabState) -> list[str]:
    """Remove everything the lab made: containers, mounts, links, directories. Returns leftovers."""
    stop_containers(lab_nspawn_pids(state))
    for point in lab_mounts(state):
        if run(["umount", point], check=False).returncode != 0:
            run(["umount", "-l", point], check=False)
    for link in lab_links(state):
        run(["ip", "link", "del", link], check=False)
    remove_cgroups(state)
    leftovers = leftover_report(state)
    if not leftovers:
        run(["rm", "-rf", "--one-file-system", str(state.hosts_dir), str(state.run_dir)], check=False)
    return leftovers


def remove_cgroups(state: LabState, timeout: float = 15.0) -> None:
    """Remove the lab's cgroup trees, deepest first. A container whose nspawn was killed still has processes dying
    in them for a moment (longer on a busy machine): they are SIGKILLed and the removal tried again until it holds
    or ``timeout`` passes (what stays is then reported as a leftover)."""

    def removed() -> bool:
        for top in host_cgroups(state):
            if not top.is_dir():
                continue
            for directory, _subdirs, _files in sorted(os.walk(top), key=lambda entry: len(entry[0]), reverse=True):
                _kill_members(Path(directory))
                try:
                    os.rmdir(directory)
                except OSError:
                    pass
        return not any(top.is_dir() for top in host_cgroups(state))

    wait_for(removed, timeout=timeout, interval=0.2)


def _kill_members(cgroup: Path) -> None:
    try:
        pids = [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def leftover_report(state: LabState) -> list[str]:
    report = [f"process {pid} (systemd-nspawn)" for pid in lab_nspawn_pids(state)]
    report += [f"mount {point}" for point in lab_mounts(state)]
    report += [f"link {link}" for link in lab_links(state)]
    report += [f"cgroup {cgroup}" for cgroup in host_cgroups(state) if cgroup.is_dir()]
    return report
