"""Faults the simulator can be told to show, per launch: `NAME` or `NAME=VALUE` (a whole number)."""

from __future__ import annotations

import math
from dataclasses import dataclass

GENERATE_HANG = "generate-hang"
HANG_AFTER_REQUESTS = "hang-after-requests"
PROGRESS_STALL = "progress-stall"
NEVER_LOAD = "never-load"
DEGENERATE = "degenerate"
CRASH_ON_LOAD = "crash-on-load"
SLOW_DRAIN = "slow-drain"
ORPHAN_SCHEDULERS = "orphan-schedulers"
OUTPUT_DRIFT = "output-drift"
SLOWDOWN = "slowdown"
LOSSY_STEPS = "lossy-steps"


@dataclass(frozen=True)
class FaultSpec:
    help: str
    takes_value: bool = False
    needs_value: bool = False
    default: int | float | None = None
    number: type = int  # int: a whole number 0 or more; float: a number above 0


FAULTS = {
    GENERATE_HANG: FaultSpec("every generation after the warm-up hangs: the scheduler is stuck in a forward pass"),
    HANG_AFTER_REQUESTS: FaultSpec(
        "=N: serves N generations after the warm-up, then the scheduler is stuck (every later one hangs)",
        takes_value=True,
        needs_value=True,
    ),
    PROGRESS_STALL: FaultSpec(
        "[=N]: after N generations (default 0) requests are admitted and queue but no token is ever produced",
        takes_value=True,
        default=0,
    ),
    NEVER_LOAD: FaultSpec("schedulers claim no GPU memory and never generate (the warm-up never finishes)"),
    DEGENERATE: FaultSpec("generated text is one character repeated ('!!!!!!!!')"),
    CRASH_ON_LOAD: FaultSpec("a scheduler raises partway through loading the weights; the server is killed"),
    SLOW_DRAIN: FaultSpec("a SIGTERM finds one long request in flight; it lasts --sim-drain-time (default 90 s)"),
    ORPHAN_SCHEDULERS: FaultSpec(
        "schedulers ignore SIGTERM and ShutdownReq, get no parent-death signal and escape kill_process_tree"
    ),
    OUTPUT_DRIFT: FaultSpec(
        "[=K]: the numerics drift: greedy output differs from token K on (default 8), plausible text, "
        "every logprob from there shifted",
        takes_value=True,
        default=8,
    ),
    LOSSY_STEPS: FaultSpec(
        "=S: speculative decoding with --speculative-num-steps S is not lossless (output-drift from token 8 then)",
        True,
        True,
    ),
    SLOWDOWN: FaultSpec("=F: every decode step takes F times as long (F a number above 0)", True, True, number=float),
}


def parse_faults(values: list[str]) -> dict[str, int | None]:
    """Split repeated and comma-separated `NAME[=N]`; raise ValueError naming an unknown or malformed one."""
    chosen: dict[str, int | None] = {}
    for value in values:
        for item in value.split(","):
            item = item.strip().lower()
            if not item:
                continue
            name, sep, raw = item.partition("=")
            name = name.strip()
            spec = FAULTS.get(name)
            if spec is None:
                raise ValueError(f"unknown fault {name!r}; accepted: {', '.join(sorted(FAULTS))}")
            if sep and not spec.takes_value:
                raise ValueError(f"fault {name!r} takes no value, got {item!r}")
            if not sep and spec.needs_value:
                raise ValueError(f"fault {name!r} needs a value: {name}=N (N a whole number)")
            if sep:
                chosen[name] = _number(name, spec, raw.strip())
            else:
                chosen[name] = spec.default
    return chosen


def _number(name: str, spec: FaultSpec, raw: str) -> int | float:
    if spec.number is int:
        if not raw.isdigit():
            raise ValueError(f"fault {name!r}: {raw!r} is not a whole number 0 or more")
        return int(raw)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if math.isnan(value) or value <= 0 or value == float("inf"):
        raise ValueError(f"fault {name!r}: {raw!r} is not a number above 0")
    return value
