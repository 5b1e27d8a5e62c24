"""Fixtures shared by the lab's own tests (defined in simgpu_support.py and sim_support.py)."""

from sim_support import lab_env, start  # noqa: F401
from simgpu_support import build, build_dir, env, probe, spawn, state_dir  # noqa: F401
