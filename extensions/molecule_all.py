# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run every molecule scenario (``molecule test -s NAME``), WORKERS of them side by side.

Each scenario boots a lab of its own (its ``LLMOPS_LAB_NAME``), so scenarios do not share hosts. A scenario's
output is printed whole when it ends, with its duration; the exit status is 1 when any scenario failed, after
all of them ran. Run from ``extensions/``: ``python molecule_all.py --workers 2``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import sys
import time
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parent / "molecule"


def scenarios(root: Path = SCENARIOS) -> list:
    """The scenario names: directories of ``root`` with a molecule.yml, sorted."""
    return sorted(path.parent.name for path in root.glob("*/molecule.yml"))


def run_scenario(name: str, molecule: str, cwd: Path) -> tuple:
    """``(name, returncode, seconds, output)`` of ``molecule test -s name``."""
    started = time.monotonic()
    proc = subprocess.run(
        [molecule, "test", "-s", name],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    return name, proc.returncode, time.monotonic() - started, proc.stdout


def verdict(code: int) -> str:
    return "passed" if code == 0 else f"FAILED (exit {code})"


def main(argv=None, out=sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="scenarios run side by side (default 2)")
    parser.add_argument("--molecule", default="molecule", help="the molecule command (default: molecule on PATH)")
    parser.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be 1 or more, got {args.workers}")
    known = scenarios()
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; the scenarios are {', '.join(known)}")
    names = args.names or known
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        futures = [pool.submit(run_scenario, name, args.molecule, SCENARIOS.parent) for name in names]
        for future in concurrent.futures.as_completed(futures):
            name, code, seconds, text = future.result()
            results.append((name, code, seconds))
            out.write(f"===== molecule scenario {name}: {verdict(code)} in {seconds:.0f} s =====\n{text}\n")
            out.flush()
    out.write("molecule scenarios:\n")
    for name, code, seconds in sorted(results):
        out.write(f"  {name:<26} {seconds:5.0f} s  {verdict(code)}\n")
    return 1 if any(code for _name, code, _seconds in results) else 0


if __name__ == "__main__":
    sys.exit(main())
