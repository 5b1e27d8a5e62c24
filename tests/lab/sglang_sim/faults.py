"""Faults the simulator can be told to show, per launch: `NAME` or `NAME=VALUE` (a whole number)."""

from __future__ import annotations

from dataclasses import dataclass

GENERATE_HANG = "generate-hang"
HANG_AFTER_REQUESTS = "hang-after-requests"
PROGRESS_STALL = "progress-stall"
NEVER_LOAD = "never-load"
DEGENERATE = "degenerate"
CRASH_ON_LOAD = "crash-on-load"
SLOW_DRAIN = "slow-drain"
ORPHAN_SCHEDULERS = "orphan-schedulers"


@dataclass(frozen=True)
class FaultSpec:
    help: str
    takes_value: bool = False
    needs_value: bool = False
    default: int | None = None


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
                raw = raw.strip()
                if not raw.isdigit():
                    raise ValueError(f"fault {name!r}: {raw!r} is not a whole number 0 or more")
                chosen[name] = int(raw)
            else:
                chosen[name] = spec.default
    return chosen
