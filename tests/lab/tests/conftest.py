"""Fixtures shared by the lab's own tests (defined in simgpu_support.py and sim_support.py)."""

from sim_support import lab_env, start
from simgpu_support import build, build_dir, env, probe, spawn, state_dir

__all__ = ["build", "build_dir", "env", "lab_env", "probe", "spawn", "start", "state_dir"]
