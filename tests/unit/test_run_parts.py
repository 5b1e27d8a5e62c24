"""tests/run_parts.py, what `make test` runs: every part even after one failed, side by side where asked, and each
part's result and duration at the end."""

from __future__ import annotations

import importlib.util
import stat
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("run_parts", REPO / "tests" / "run_parts.py")
run_parts = importlib.util.module_from_spec(SPEC)
sys.modules["run_parts"] = run_parts  # its dataclass looks its module up
SPEC.loader.exec_module(run_parts)

# A stand-in for make, called as `make --no-print-directory PART`. Part "a" waits until part "b" has ended and been
# reaped (so it passes only when both run at once and b's end is seen before a's); part "broken" fails with exit 3;
# every call is logged.
FAKE_MAKE = """\
import os, sys, time
from pathlib import Path
part, work = sys.argv[2], Path(sys.argv[1])
with (work / "calls").open("a") as calls:
    calls.write(part + "\\n")
(work / f"pid-{part}").write_text(str(os.getpid()))
print(f"output of {part}")
if part == "a":
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(int((work / "pid-b").read_text()), 0)
        except (FileNotFoundError, ValueError, ProcessLookupError) as gone:
            if isinstance(gone, ProcessLookupError):
                break
        if time.monotonic() > deadline:
            sys.exit("b did not start and end while a ran")
        time.sleep(0.01)
sys.exit(3 if part == "broken" else 0)
"""


def fake_make(tmp_path: Path) -> str:
    script = tmp_path / "make"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_make.py"} {tmp_path} "$2"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "fake_make.py").write_text(FAKE_MAKE)
    return str(script)


def test_side_by_side_parts_run_at_once_and_their_logs_print_in_order(tmp_path, capfd):
    code = run_parts.main(["--make", fake_make(tmp_path), "--logs", str(tmp_path / "logs"), "--side-by-side", "a", "b"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert out.index("==> make a") < out.index("output of a") < out.index("==> make b") < out.index("output of b")
    assert "(a, b ran side by side: " in out
    seconds = {line.split()[0]: int(line.split()[1]) for line in out.splitlines() if line.endswith(" s  passed")}
    assert seconds["b"] <= seconds["a"], out  # b's own duration, not a's wait
    assert out.rstrip().endswith("make test: passed")


def test_a_failed_part_does_not_stop_the_next_and_fails_the_run(tmp_path, capfd):
    code = run_parts.main(
        [
            "--make", fake_make(tmp_path), "--logs", str(tmp_path / "logs"),
            "--side-by-side", "broken", "fine", "--one-by-one", "broken", "last",
        ]
    )  # fmt: skip
    out = capfd.readouterr().out
    assert code == 1
    assert (tmp_path / "calls").read_text().splitlines()[-2:] == ["broken", "last"]
    lines = out.splitlines()
    tail = lines[lines.index("make test, each part:") :]
    assert [line.split()[0] for line in tail[1:5]] == ["broken", "fine", "broken", "last"]
    assert [line.split(" s  ")[1] for line in tail[1:5]] == ["FAILED (exit 3)", "passed", "FAILED (exit 3)", "passed"]
    assert tail[-1] == "make test: FAILED"


def test_the_makefile_runs_every_part_through_it():
    makefile = (REPO / "Makefile").read_text()
    side_by_side = makefile.split("TEST_SIDE_BY_SIDE := ", 1)[1].split("\n", 1)[0].split()
    one_by_one = makefile.split("TEST_ONE_BY_ONE   := ", 1)[1].split("\n", 1)[0].split()
    assert side_by_side + one_by_one == ["lint", "sanity", "units", "docs", "ee", "e2e", "molecule"]
    assert "tests/run_parts.py" in makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
