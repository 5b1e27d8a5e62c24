"""Write docs/performance.md from the figures the benchmarks recorded (build/bench/figures.json)."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "build" / "bench" / "figures.json"
SWEEP = ROOT / "build" / "bench" / "spec_sweep.json"
OUTPUT = ROOT / "docs" / "performance.md"

HEADER = """# Performance

Measured by `make bench`, which boots a lab, runs the benchmarks in `tests/e2e/test_bench.py`
(pytest marker `bench`) and rewrites this page. Ratios are measured within one run, so they compare
like with like on the same (shared, noisy) machine; absolute times are given for context only.
Targets come from the issues; the test suite never asserts them.

Reproduce: `make bench` as root (it installs what it needs and removes its lab afterwards).

Machine: {machine}. Measured {when}.

| issue | figure | measured | target | met |
|---|---|---|---|---|
"""


def machine() -> str:
    cpus = os.cpu_count()
    with open("/proc/meminfo") as handle:
        mem_kib = int(handle.readline().split()[1])
    return (
        f"{platform.system()} {platform.release()}, {cpus} CPU cores, {mem_kib / 1024 / 1024:.0f} GiB memory, "
        f"Python {platform.python_version()}; lab hosts are systemd-nspawn containers on the same machine"
    )


def sweep_figures() -> dict:
    """The sweep benchmark (tests/e2e/test_spec_sweep.py -k benchmark) writes its own file."""
    if not SWEEP.exists():
        return {}
    bench = json.loads(SWEEP.read_text())["benchmark"]
    overhead = bench["overhead_ratio_one_host"]["measured"]
    speedup = bench["speedup_three_hosts"]["measured"]
    one = bench["one_host"]
    return {
        "sweep_overhead": {
            "issue": "spec_sweep.yml",
            "figure": f"sweep wall time / sum of its loads and benchmark runs, one host ({bench['setup']})",
            "value": f"{overhead:.2f} ({one['sweep_wall_s']:.0f} s / {one['load_bench_sum_s']:.0f} s)",
            "target": "<= 1.15",
            "met": overhead <= 1.15,
        },
        "sweep_speedup": {
            "issue": "spec_sweep.yml",
            "figure": "3 hosts vs 1 on the same grid: speedup of the sweep",
            "value": f"{speedup:.2f}x",
            "target": ">= 2.4x",
            "met": speedup >= 2.4,
        },
    }


def main() -> int:
    if not FIGURES.exists():
        print(f"no figures at {FIGURES}: run the benchmarks first (make bench)", file=sys.stderr)
        return 1
    figures = json.loads(FIGURES.read_text())
    figures.update(sweep_figures())
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [HEADER.format(machine=machine(), when=when)]
    for figure in sorted(figures.values(), key=lambda item: (item["issue"], item["figure"])):
        met = "yes" if figure["met"] else "**no**"
        lines.append(f"| {figure['issue']} | {figure['figure']} | {figure['value']} | {figure['target']} | {met} |\n")
    notes = [figure["note"] for figure in figures.values() if figure.get("note")]
    if notes:
        lines.append("\n## Notes\n\n" + "".join(f"- {note}\n" for note in notes))
    OUTPUT.write_text("".join(lines))
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
