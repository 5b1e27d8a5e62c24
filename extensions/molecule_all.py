# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run every molecule scenario (``molecule test -s NAME``), WORKERS of them side by side.

Run alone, each scenario boots a lab of its own (its ``LLMOPS_LAB_NAME``). With ``--shared-lab NAME`` this script
boots one lab with every scenario's hosts instead (one boot instead of one per scenario), gives each scenario
hosts of its own under the names its files use (``molf1``, ... as aliases of the shared lab's hosts, through an
inventory in ``MOLECULE_SHARED_INVENTORY``; ``MOLECULE_SHARED_LAB`` tells shared/create.yml and destroy.yml to leave
the lab alone), and takes the lab down at the end, also when a scenario failed or the run was interrupted.
A scenario's output is printed whole when it ends, with its duration; the exit status is 1 when any scenario
failed, after all of them ran. Run from ``extensions/``: ``python molecule_all.py --workers 2 --shared-lab molx``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SCENARIOS = Path(__file__).resolve().parent / "molecule"
LAB_CLI = Path(__file__).resolve().parents[1] / "tests" / "lab" / "lab"
sys.path.insert(0, str(LAB_CLI.parent))
from labctl.cli import TEST_LAB_OPTIONS  # noqa: E402 - the lab's package, found through the path above

# ${VAR:-default} in a molecule.yml (molecule's interpolation): the value a scenario run alone gets.
DEFAULT_OF = re.compile(r"\$\{\w+:-([^}]*)\}")


def scenarios(root: Path = SCENARIOS) -> list:
    """The scenario names: directories of ``root`` with a molecule.yml, sorted."""
    return sorted(path.parent.name for path in root.glob("*/molecule.yml"))


def run_scenario(name: str, molecule: str, cwd: Path, env: dict | None = None) -> tuple:
    """``(name, returncode, seconds, output)`` of ``molecule test -s name`` (with ``env`` added to this process's)."""
    started = time.monotonic()
    proc = subprocess.run(
        [molecule, "test", "-s", name],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    return name, proc.returncode, time.monotonic() - started, proc.stdout


def lab_request(name: str, root: Path = SCENARIOS) -> dict:
    """What scenario ``name`` asks of its lab when run alone: ``{"lab": name, "hosts": n, "gpus": n}``."""
    text = DEFAULT_OF.sub(r"\1", (root / name / "molecule.yml").read_text())
    env = (yaml.safe_load(text).get("ansible") or {}).get("env") or {}
    return {
        "lab": str(env["LLMOPS_LAB_NAME"]),
        "hosts": int(env.get("LLMOPS_LAB_HOSTS", 1)),
        "gpus": int(env.get("LLMOPS_LAB_GPUS", 2)),
    }


def share_hosts(lab_inventory: dict, requests: dict) -> dict:
    """{scenario: inventory}: each scenario gets hosts of its own of the shared lab, named as its lab would name
    them (``<its lab><i>``, with ``lab_host`` the shared lab's name of the host, for ``tests/lab/lab exec``)."""
    group = lab_inventory["all"]["children"]["lab"]
    free = list(group["hosts"].items())
    inventories = {}
    for scenario, request in requests.items():
        taken, free = free[: request["hosts"]], free[request["hosts"] :]
        if len(taken) < request["hosts"]:
            raise ValueError(f"the shared lab has too few hosts for scenario {scenario}")
        hosts = {
            f"{request['lab']}{index}": {**variables, "lab_host": real}
            for index, (real, variables) in enumerate(taken, start=1)
        }
        inventories[scenario] = {"all": {"children": {"lab": {"hosts": hosts, "vars": group.get("vars", {})}}}}
    return inventories


def boot_shared_lab(lab_cli: str, name: str, requests: dict) -> Path:
    """Boot one lab with every scenario's hosts (the most GPUs any asks for); return its inventory's path."""
    hosts = sum(request["hosts"] for request in requests.values())
    gpus = max(request["gpus"] for request in requests.values())
    proc = subprocess.run(
        [lab_cli, "up", "--name", name, "--hosts", str(hosts), "--gpus", str(gpus), *TEST_LAB_OPTIONS],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"lab up --name {name} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


def run_all(names: list, workers: int, molecule: str, envs: dict, out) -> list:
    """Run the scenarios, ``workers`` side by side; print each one's output when it ends; return the results."""
    results = []
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(run_scenario, name, molecule, SCENARIOS.parent, envs.get(name)) for name in names]
        for future in concurrent.futures.as_completed(futures):
            name, code, seconds, text = future.result()
            results.append((name, code, seconds))
            out.write(f"===== molecule scenario {name}: {verdict(code)} in {seconds:.0f} s =====\n{text}\n")
            out.flush()
    return results


def run_on_shared_lab(names: list, args, out) -> list:
    """Boot the shared lab, run the scenarios on their hosts of it, and take it down whatever happened."""
    requests = {name: lab_request(name) for name in names}
    workdir = Path(tempfile.mkdtemp(prefix="molecule-shared-"))
    # A SIGTERM ends the run through the finally below, so the lab does not outlive it.
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        try:
            inventory = boot_shared_lab(args.lab_cli, args.shared_lab, requests)
        except RuntimeError as exc:
            out.write(f"molecule: {exc}\n")
            return [(name, 1, 0.0) for name in names]
        envs = {}
        for name, scenario_inventory in share_hosts(yaml.safe_load(inventory.read_text()), requests).items():
            path = workdir / f"{name}.inventory.yml"
            path.write_text(yaml.safe_dump(scenario_inventory, sort_keys=False))
            envs[name] = {"MOLECULE_SHARED_LAB": args.shared_lab, "MOLECULE_SHARED_INVENTORY": str(path)}
        return run_all(names, args.workers, args.molecule, envs, out)
    finally:
        down = subprocess.run(
            [args.lab_cli, "down", "--name", args.shared_lab], capture_output=True, text=True, check=False
        )
        if down.returncode != 0:
            out.write(f"molecule: lab down --name {args.shared_lab} failed:\n{down.stdout}\n{down.stderr}\n")
        shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


def verdict(code: int) -> str:
    return "passed" if code == 0 else f"FAILED (exit {code})"


def main(argv=None, out=sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="scenarios run side by side (default 2)")
    parser.add_argument("--molecule", default="molecule", help="the molecule command (default: molecule on PATH)")
    parser.add_argument(
        "--shared-lab",
        metavar="NAME",
        help="boot one lab NAME for all scenarios, each on hosts of its own, and take it down at the end "
        "(default: each scenario boots a lab of its own)",
    )
    parser.add_argument("--lab-cli", default=str(LAB_CLI), help="the lab command (default: tests/lab/lab)")
    parser.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be 1 or more, got {args.workers}")
    known = scenarios()
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; the scenarios are {', '.join(known)}")
    names = args.names or known
    if args.shared_lab:
        results = run_on_shared_lab(names, args, out)
    else:
        results = run_all(names, args.workers, args.molecule, {}, out)
    out.write("molecule scenarios:\n")
    for name, code, seconds in sorted(results):
        out.write(f"  {name:<26} {seconds:5.0f} s  {verdict(code)}\n")
    return 1 if any(code for _name, code, _seconds in results) else 0


if __name__ == "__main__":
    sys.exit(main())
