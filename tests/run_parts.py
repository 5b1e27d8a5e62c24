"""Run the parts of `make test`: every part even after one failed, then each part's result and duration.

The parts named with --side-by-side run at the same time, each into a log of its own, and their logs are printed
in the given order once all ended: they leave each other alone (sanity works on a copy under build/sanity, docs
in docs/build, ee in build/ee) once what they install is installed, and none keeps two cores busy alone. The
parts named with --one-by-one run after them, one at a time, printing as they go: each keeps every core busy.

    python tests/run_parts.py --make make --logs build/test-logs --side-by-side lint sanity --one-by-one e2e
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Outcome:
    part: str
    returncode: int
    seconds: float

    @property
    def result(self) -> str:
        return "passed" if self.returncode == 0 else f"FAILED (exit {self.returncode})"


def make_argv(make: str, part: str) -> list[str]:
    return [*make.split(), "--no-print-directory", part]


def run_side_by_side(make: str, parts: list[str], logs: Path) -> list[Outcome]:
    logs.mkdir(parents=True, exist_ok=True)
    running = []
    for part in parts:
        log = (logs / f"{part}.log").open("wb")
        running.append((part, log, time.monotonic(), subprocess.Popen(make_argv(make, part), stdout=log, stderr=log)))

    def wait(part, log, started, proc) -> Outcome:
        returncode = proc.wait()
        log.close()
        return Outcome(part, returncode, time.monotonic() - started)

    with ThreadPoolExecutor(len(running)) as pool:  # each part's own end, whichever ends first
        outcomes = list(pool.map(lambda entry: wait(*entry), running))
    for part in parts:
        print(f"==> make {part} (log: {logs / f'{part}.log'})", flush=True)
        sys.stdout.buffer.write((logs / f"{part}.log").read_bytes())
        sys.stdout.flush()
    return outcomes


def run_one_by_one(make: str, parts: list[str]) -> list[Outcome]:
    outcomes = []
    for part in parts:
        print(f"==> make {part}", flush=True)
        started = time.monotonic()
        returncode = subprocess.run(make_argv(make, part), check=False).returncode
        outcomes.append(Outcome(part, returncode, time.monotonic() - started))
    return outcomes


def summary(outcomes: list[Outcome], side_by_side: list[str], side_by_side_seconds: float) -> str:
    lines = ["make test, each part:"]
    lines += [f"  {o.part:<10} {round(o.seconds):5d} s  {o.result}" for o in outcomes]
    if len(side_by_side) > 1:
        lines.append(f"  ({', '.join(side_by_side)} ran side by side: {round(side_by_side_seconds)} s in all)")
    lines.append("make test: " + ("passed" if all(o.returncode == 0 for o in outcomes) else "FAILED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make", required=True, help="the make command that runs one part: MAKE PART")
    parser.add_argument("--logs", type=Path, required=True, help="directory of the side-by-side parts' logs")
    parser.add_argument("--side-by-side", nargs="*", default=[], metavar="PART")
    parser.add_argument("--one-by-one", nargs="*", default=[], metavar="PART")
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcomes = run_side_by_side(args.make, args.side_by_side, args.logs) if args.side_by_side else []
    side_by_side_seconds = time.monotonic() - started
    outcomes += run_one_by_one(args.make, args.one_by_one)
    print(summary(outcomes, args.side_by_side, side_by_side_seconds), flush=True)
    return 0 if all(o.returncode == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
