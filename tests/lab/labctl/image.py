"""The lab's Debian rootfs: built once with debootstrap, cached under a hash of its recipe."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from .system import LabError, exclusive, run

CACHE_ROOT = Path(os.environ.get("LLMOPS_LAB_CACHE", "/var/cache/llmops-lab"))
WHEEL_DIR = CACHE_ROOT / "wheels"
SGLANG_VENV = "/opt/sglang/venv"
WHEELHOUSE = "/opt/llmops-wheels"

# Everything that decides the image's content. Change it and the cache key changes.
RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "mirror": os.environ.get("LLMOPS_LAB_MIRROR", "http://deb.debian.org/debian"),
    "packages": [
        "systemd",
        "systemd-sysv",
        "dbus",
        "openssh-server",
        "python3",
        "python3-venv",
        "procps",
        "iproute2",
        "psmisc",
    ],
    "venv": SGLANG_VENV,
    "wheels": ["sglang==0.5.23", "nvidia-ml-py==13.615.71"],
    # An offline wheelhouse in the image: the real gateway (smg) and what pip resolves for it on Python 3.11.
    "wheelhouse": {
        "path": WHEELHOUSE,
        "wheels": [
            "smg==1.13.0",
            "grpcio==1.85.3",
            "grpcio-health-checking==1.85.1",
            "protobuf==7.36.2",
            "pyyaml==6.0.4",
            "setproctitle==1.3.8",
            "typing-extensions==4.16.0",
        ],
    },
    "steps": 2,
}


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_path() -> Path:
    return CACHE_ROOT / f"rootfs-{recipe_hash()}"


def ensure_wheels() -> list[Path]:
    """Download the pinned wheels for the hosts' Python (3.11, manylinux) on this machine."""
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    wanted = []
    for spec in RECIPE["wheels"]:
        name, version = spec.split("==")
        prefix = f"{name.replace('-', '_')}-{version}-"
        found = sorted(WHEEL_DIR.glob(f"{prefix}*.whl"))
        if not found:
            run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.11",
                    "--implementation",
                    "cp",
                    "--platform",
                    "manylinux_2_34_x86_64",
                    "--platform",
                    "any",
                    "-d",
                    str(WHEEL_DIR),
                    spec,
                ]
            )
            found = sorted(WHEEL_DIR.glob(f"{prefix}*.whl"))
        if not found:
            raise LabError(f"could not download {spec} into {WHEEL_DIR}")
        wanted.append(found[-1])
    return wanted


def ensure_wheelhouse() -> list[Path]:
    """Download the wheelhouse's pinned wheels (each with --no-deps; the list is the whole resolved set)."""
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    wanted = []
    for spec in RECIPE["wheelhouse"]["wheels"]:
        name, version = spec.split("==")
        prefix = f"{name.replace('-', '_')}-{version}-"
        found = sorted(WHEEL_DIR.glob(f"{prefix}*.whl"))
        if not found:
            # smg, protobuf and grpcio ship abi3 and manylinux2014 wheels as well as cp311 ones.
            platforms = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "any"]
            run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--python-version", "3.11", "--implementation", "cp",
                 "--abi", "cp311", "--abi", "abi3", "--abi", "none",
                 *[option for platform in platforms for option in ("--platform", platform)],
                 "-d", str(WHEEL_DIR), spec]
            )  # fmt: skip
            found = sorted(WHEEL_DIR.glob(f"{prefix}*.whl"))
        if not found:
            raise LabError(f"could not download {spec} into {WHEEL_DIR}")
        wanted.append(found[-1])
    return wanted


def _install_wheelhouse(rootfs: Path, wheels: list[Path]) -> None:
    target = rootfs / RECIPE["wheelhouse"]["path"].lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, target / wheel.name)


def ensure_image(rebuild: bool = False, log=print) -> Path:
    """Return the cached rootfs for the current recipe, building it first if needed."""
    target = rootfs_path()
    if target.is_dir() and not rebuild:
        return target
    # Labs started side by side on a fresh machine would each debootstrap into the same partial directory.
    with exclusive(CACHE_ROOT / ".image.lock"):
        if target.is_dir() and not rebuild:
            return target
        return _build_image(target, log)


def _build_image(target: Path, log) -> Path:
    wheels = ensure_wheels()
    wheelhouse = ensure_wheelhouse()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log(f"building lab rootfs {target} (debootstrap {RECIPE['suite']}, about two minutes)")
    try:
        run(
            [
                "debootstrap",
                f"--variant={RECIPE['variant']}",
                f"--include={','.join(RECIPE['packages'])}",
                RECIPE["suite"],
                str(partial),
                RECIPE["mirror"],
            ]
        )
        _install_sglang_venv(partial, wheels)
        _install_wheelhouse(partial, wheelhouse)
        _finish(partial)
    except BaseException:
        if not os.environ.get("LLMOPS_LAB_KEEP_PARTIAL"):
            shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    _prune_old_images(keep=target)
    return target


def _in_rootfs(rootfs: Path, *command: str) -> None:
    run(["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "-D", str(rootfs), *command])


def _install_sglang_venv(rootfs: Path, wheels: list[Path]) -> None:
    # Not /tmp: systemd-nspawn mounts a fresh tmpfs there.
    staging = rootfs / "var" / "tmp" / "wheels"
    staging.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, staging / wheel.name)
    _in_rootfs(rootfs, "/usr/bin/python3", "-m", "venv", SGLANG_VENV)
    _in_rootfs(
        rootfs,
        f"{SGLANG_VENV}/bin/pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-deps",
        *[f"/var/tmp/wheels/{wheel.name}" for wheel in wheels],
    )
    shutil.rmtree(staging)


def _finish(rootfs: Path) -> None:
    # Each host gets its own name and machine id at boot; the image must not carry the builder's.
    for leftover in ("etc/hostname", "etc/machine-id"):
        path = rootfs / leftover
        if path.exists():
            path.unlink()
    (rootfs / "etc" / "machine-id").write_text("")
    (rootfs / ".llmops-lab-recipe.json").write_text(json.dumps(RECIPE, indent=2, sort_keys=True))


def _prune_old_images(keep: Path) -> None:
    mounts = Path("/proc/self/mountinfo").read_text()
    for old in CACHE_ROOT.glob("rootfs-*"):
        if old != keep and old.is_dir() and str(old) not in mounts:
            shutil.rmtree(old, ignore_errors=True)
