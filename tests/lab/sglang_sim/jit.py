"""SGLang's JIT kernel build, as a scheduler meets it while loading (sglang/kernels/jit/utils/compile/).

`loader.load_jit` looks for a cached build under `cache.cache_root()` (SGLANG_JIT_CACHE_DIR, else
"~/.cache/sglang/jit", expanded with pathlib's expanduser: $HOME, else the passwd entry):
`<root>/<target>/<module>/build-<key>/deps-<key>/<module>.so`. A hit loads it and needs nothing else. A miss
takes `_build_lock` (`scope.mkdir(parents=True, exist_ok=True)` and a `.lock` file: an unwritable home fails
here with PermissionError), builds in `.staging-<uuid>` with `ninja.build`, which runs a bare
`subprocess.run(["ninja", "-f", "build.ninja"], cwd=..., capture_output=True, text=True, timeout=1800)`
(no ninja on PATH: FileNotFoundError; a failed build: RuntimeError "Failed to build JIT module ..."), then
publishes the staging directory by renaming it to the leaf.

The simulated kernel is the KV-cache store (sglang/kernels/ops/kvcache/kvcache.py loads "kvcache" from
csrc/elementwise/kvcache.cuh); its leaf's dependency list names that header, so editing the installed header
makes the next load rebuild, as the real cache's self-verifying leaves do.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import uuid

MODULE_NAME = "sgl_kernel_jit_kvcache"
TARGET = "sm90a"  # arch.py: 9.x gets the "a" suffix
SOURCE = "kernels/jit/csrc/elementwise/kvcache.cuh"
DEPS_FILE = "sgl_deps.json"
NINJA_TIMEOUT_S = 1800

BUILD_FILE = f"""ninja_required_version = 1.3
cxx = c++
nvcc = nvcc

rule compile_cuda
  depfile = $out.d
  command = $nvcc -MD -MF "$out.d" -c "$in" -o "$out"

rule link
  command = $cxx $in -o "$out"

build kvcache_0.o: compile_cuda kvcache.cu

build {MODULE_NAME}.so: link kvcache_0.o

default {MODULE_NAME}.so
"""


def cache_root() -> pathlib.Path:
    """cache.py: `envs.SGLANG_JIT_CACHE_DIR.get() or "~/.cache/sglang/jit"`, expanded."""
    configured = os.environ.get("SGLANG_JIT_CACHE_DIR") or "~/.cache/sglang/jit"
    return pathlib.Path(configured).expanduser()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()[:16]


def _dependency(package_dir: pathlib.Path | None) -> list[dict]:
    if package_dir is None:
        return []
    path = package_dir / SOURCE
    try:
        return [{"root": "sglang", "relpath": SOURCE, "digest": _digest(path.read_bytes())}]
    except OSError:
        return []


def _deps_key(entries: list[dict]) -> str:
    return "deps-" + _digest(json.dumps(entries, sort_keys=True).encode())


def _find_prebuilt(scope: pathlib.Path, deps_leaf: str) -> pathlib.Path | None:
    candidate = scope / deps_leaf / f"{MODULE_NAME}.so"
    try:
        return candidate if candidate.is_file() else None
    except OSError:
        return None


def load_kernel(package_dir: pathlib.Path | None) -> str:
    """Load (building on a miss) the KV-cache kernel; returns 'cached' or 'built'. Raises as SGLang would."""
    scope = cache_root() / TARGET / MODULE_NAME / ("build-" + _digest(BUILD_FILE.encode()))
    entries = _dependency(package_dir)
    leaf_name = _deps_key(entries)
    if _find_prebuilt(scope, leaf_name) is not None:
        return "cached"
    scope.mkdir(parents=True, exist_ok=True)
    handle = os.open(scope / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _find_prebuilt(scope, leaf_name) is not None:
            return "cached"
        staging = scope / f".staging-{uuid.uuid4().hex}"
        try:
            staging.mkdir(parents=True, exist_ok=True)
            (staging / "kvcache.cu").write_text('#include "elementwise/kvcache.cuh"\n')
            (staging / "build.ninja").write_text(BUILD_FILE)
            completed = subprocess.run(
                ["ninja", "-f", "build.ninja"],
                cwd=str(staging),
                capture_output=True,
                text=True,
                timeout=NINJA_TIMEOUT_S,
                check=False,
            )
            if completed.returncode != 0:
                raise RuntimeError(
                    f"Failed to build JIT module {MODULE_NAME} in {staging}\n"
                    f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
                )
            if not (staging / f"{MODULE_NAME}.so").is_file():
                raise RuntimeError(f"Failed to load JIT module {MODULE_NAME}: no {MODULE_NAME}.so in {staging}")
            (staging / DEPS_FILE).write_text(json.dumps(entries))
            leaf = scope / leaf_name
            try:
                os.rename(staging, leaf)
            except OSError:
                if not leaf.is_dir():
                    raise
            return "built"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        os.close(handle)
