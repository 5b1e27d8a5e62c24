"""Fixtures shared by the lab's own tests (the simgpu ones live in simgpu_support.py)."""

from simgpu_support import build, build_dir, env, probe, spawn, state_dir  # noqa: F401
