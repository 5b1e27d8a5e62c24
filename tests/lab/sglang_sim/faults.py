"""Faults the simulator can be told to show, per launch."""

from __future__ import annotations

GENERATE_HANG = "generate-hang"
NEVER_LOAD = "never-load"
DEGENERATE = "degenerate"
CRASH_ON_LOAD = "crash-on-load"
SLOW_DRAIN = "slow-drain"
ORPHAN_SCHEDULERS = "orphan-schedulers"

FAULTS = {
    GENERATE_HANG: "health and model info answer; /generate and chat completions never complete",
    NEVER_LOAD: "schedulers claim no GPU memory; HTTP is up and /health is 200; generation never completes",
    DEGENERATE: "generated text is one character repeated ('!!!!!!!!')",
    CRASH_ON_LOAD: "a scheduler raises partway through loading the weights; the server exits non-zero",
    SLOW_DRAIN: "on SIGTERM the drain lasts the whole --sim-drain-time (default 90 s with this fault)",
    ORPHAN_SCHEDULERS: "schedulers ignore SIGTERM, do not watch their parent, and keep their GPU claims after it dies",
}


def parse_faults(values: list[str]) -> frozenset[str]:
    """Split repeated and comma-separated fault names; raise ValueError naming an unknown one."""
    names = set()
    for value in values:
        for name in value.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r}; accepted: {', '.join(sorted(FAULTS))}")
            names.add(name)
    return frozenset(names)
