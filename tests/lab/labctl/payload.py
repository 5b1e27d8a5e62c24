"""What each lab host gets on top of the cached rootfs: network, SSH key, simulated GPUs and engine."""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from pathlib import Path

from .image import SGLANG_VENV
from .system import exclusive, run

LAB_DIR = Path(__file__).resolve().parent.parent
SIMGPU_SRC = LAB_DIR / "simgpu"
SIM_SRC = LAB_DIR / "sglang_sim"
NINJA_STANDIN = Path(__file__).resolve().parent / "ninja_standin.py"
MODULE_CODE_CACHE = Path(__file__).resolve().parent / "module_code_cache.py"
# The system Python's site directory: a .pth file there runs at every start of /usr/bin/python3 (not of the
# engine's virtual environment, which does not read the system's site-packages).
SYSTEM_SITE = "/usr/local/lib/python3.11/dist-packages"
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_TOTAL_MIB = 81559
SITE_PACKAGES = f"{SGLANG_VENV}/lib/python3.11/site-packages"
# `lab up --sim-env`: defaults of the simulated engine's knobs (tests/lab/sglang_sim/args.py) for every unit.
SIM_ENV_CONF = "/etc/systemd/system.conf.d/50-llmops-lab-sim-env.conf"
SIM_ENV_RE = re.compile(r"^SGLANG_SIM_[A-Z0-9_]+$")

if str(SIMGPU_SRC) not in sys.path:
    sys.path.insert(0, str(SIMGPU_SRC))
import simgpu_state  # noqa: E402

NET_UNIT = """[Unit]
Description=Lab network on host0
DefaultDependencies=no
Before=network.target ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/ip link set lo up
ExecStart=/usr/sbin/ip addr replace {address} peer {peer} dev host0
ExecStart=/usr/sbin/ip link set host0 up

[Install]
WantedBy=multi-user.target
"""


def build_simgpu(build: Path = SIMGPU_SRC / "build") -> Path:
    """Compile the simulated NVML library and nvidia-smi (make rebuilds only what changed).

    One build at a time: two labs started together would otherwise link the same nvidia-smi at once, and one
    of them copies a half-written binary into its hosts (exec format error on every GPU query)."""
    with exclusive(build / ".lock"):
        run(["make", "-s", "-C", str(SIMGPU_SRC), f"BUILD={build}"])
    return build


def host_gpus(host: str, count: int) -> list:
    return [
        simgpu_state.Gpu(
            index, f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host}.gpu{index}.llmops-lab')}", GPU_TOTAL_MIB, GPU_NAME
        )
        for index in range(count)
    ]


def gpu_lines(host: str, count: int) -> str:
    lines = ["# index\tuuid\ttotal_mib\tname"]
    lines += [f"{g.index}\t{g.uuid}\t{g.total_mib}\t{g.name}" for g in host_gpus(host, count)]
    return "\n".join(lines) + "\n"


def mig_lines(host: str, count: int, mig: dict[int, str]) -> str:
    """The host's `mig` file: MIG devices per GPU from --mig GPU:SPEC (simgpu_state.mig_profiles)."""
    gpus = host_gpus(host, count)
    lines = ["# gpu\tmig_index\tuuid\ttotal_mib\tprofile\tgpu_instance\tcompute_instance"]
    for index in sorted(mig):
        lines += simgpu_state.mig_lines(gpus[index], simgpu_state.mig_profiles(mig[index]))
    return "\n".join(lines) + "\n"


def mig_uuids(host: str, count: int, mig: dict[int, str]) -> list[str]:
    return [line.split("\t")[2] for line in mig_lines(host, count, mig).splitlines() if not line.startswith("#")]


def _write(root: Path, relative: str, content: str, mode: int = 0o644) -> None:
    path = root / relative.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    os.chmod(path, mode)


def _install(root: Path, source: Path, relative: str, mode: int) -> None:
    path = root / relative.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path)
    os.chmod(path, mode)


def install(
    root: Path,
    host: str,
    address: str,
    peer: str,
    public_key: str,
    gpus: int,
    simgpu_build: Path,
    mig: dict[int, str] | None = None,
    reserved_mib: int = simgpu_state.DEFAULT_RESERVED_MIB,
    host_pids: bool = False,
    cache_module_code: bool = False,
    sim_env: dict[str, str] | None = None,
) -> None:
    """Write the per-host files into the host's merged tree (they land in its overlay's upper dir)."""
    _write(root, "/etc/hostname", host + "\n")
    _write(root, "/etc/hosts", f"127.0.0.1 localhost\n127.0.1.1 {host}\n")
    _write(root, "/root/.ssh/authorized_keys", public_key, 0o600)
    os.chmod(root / "root" / ".ssh", 0o700)
    _write(root, "/etc/systemd/system/lab-net.service", NET_UNIT.format(address=address, peer=peer))
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "lab-net.service"
    if not link.is_symlink():
        link.symlink_to("/etc/systemd/system/lab-net.service")

    _install(root, simgpu_build / "libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", 0o755)
    _install(root, simgpu_build / "nvidia-smi", "/usr/bin/nvidia-smi", 0o755)
    _install(root, simgpu_build / "simgpu-claim", "/usr/local/bin/simgpu-claim", 0o755)
    _install(root, simgpu_build / "simgpu_state.py", "/usr/local/lib/simgpu/simgpu_state.py", 0o644)
    _write(root, "/var/lib/simgpu/gpus", gpu_lines(host, gpus))
    _write(root, f"/var/lib/simgpu/{simgpu_state.RESERVED_FILE}", f"{reserved_mib}\n")
    if host_pids:
        _write(
            root, f"/var/lib/simgpu/{simgpu_state.HOST_PID_OFFSET_FILE}", f"{simgpu_state.CONTAINER_HOST_PID_OFFSET}\n"
        )
    if mig:
        _write(root, "/var/lib/simgpu/mig", mig_lines(host, gpus, mig))
    # Any GPU user may claim memory (as /dev/nvidia* are 0666); the sticky bit keeps claims their owners'.
    claims = root / "var/lib/simgpu/claims"
    claims.mkdir(parents=True, exist_ok=True)
    os.chmod(claims, 0o1777)
    # The ninja wheel (an sglang dependency) puts `ninja` in the venv's bin/; SGLang's JIT build runs it bare.
    _write(root, f"{SGLANG_VENV}/bin/ninja", f"#!{SGLANG_VENV}/bin/python\n" + NINJA_STANDIN.read_text(), 0o755)

    target = root / SITE_PACKAGES.lstrip("/") / "sglang_sim"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(SIM_SRC, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if sim_env:
        defaults = " ".join(f'"{name}={value}"' for name, value in sorted(sim_env.items()))
        _write(root, SIM_ENV_CONF, f"[Manager]\nDefaultEnvironment={defaults}\n")
    if cache_module_code:
        _install(root, MODULE_CODE_CACHE, f"{SYSTEM_SITE}/llmops_lab_module_code_cache.py", 0o644)
        _write(root, f"{SYSTEM_SITE}/llmops_lab_module_code_cache.pth", "import llmops_lab_module_code_cache\n")
    run(["ldconfig", "-r", str(root)], check=False)
