"""Fixtures for end-to-end tests on lab hosts (real systemd, real sshd, simulated GPUs and engine).

One lab is booted per test session and shared; ``lab.reset()`` puts every host back to a
blank state, ``lab.reset_used()`` only the hosts used since their last reset (what ``clean_lab`` does
before and after each test). ``LLMOPS_LAB_NAME`` picks the lab instance (default ``e2e``), so
several sessions on one machine do not collide; under pytest-xdist each worker boots a lab of its
own, the name with the worker's letter (``e2ea``, ``e2eb``, ...).

Test files run heaviest first: the collected items are ordered by their file's duration in
``durations.json`` (seconds per file, measured; a file not listed counts as DEFAULT_FILE_SECONDS).
Under ``--dist loadfile --no-loadscope-reorder`` xdist hands out whole files in that order, so the
longest files start first instead of last. ``--record-durations`` writes the durations this run
measured back into ``durations.json``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "lab"))
from labctl.cli import TEST_LAB_OPTIONS, exec_argv  # noqa: E402 - the lab's package, found through the path above

LAB_CLI = REPO / "tests" / "lab" / "lab"
COLLECTIONS_PATH = REPO / "build" / "collections"
TEST_UNIT_PREFIX = "t-"
DURATIONS = Path(__file__).resolve().parent / "durations.json"
DEFAULT_FILE_SECONDS = 120

# Run from standard input (``bash -s``), so that no pkill pattern below matches its own command line.
RESET_SCRIPT = f"""
set +e
for unit in $(systemctl list-units --all --plain --no-legend '{TEST_UNIT_PREFIX}*' 'sglang*' | awk '{{print $1}}'); do
  systemctl kill --signal=SIGKILL "$unit" 2>/dev/null
  systemctl stop "$unit" 2>/dev/null
  systemctl reset-failed "$unit" 2>/dev/null
done
rm -rf /etc/systemd/system/{TEST_UNIT_PREFIX}* /etc/systemd/system/sglang*
systemctl daemon-reload
pkill -KILL -f '^sglang::' 2>/dev/null
pkill -KILL -f '[s]glang_sim' 2>/dev/null  # bracket: do not match this script's own command line
pkill -KILL -f '[s]imgpu-claim' 2>/dev/null
pkill -KILL -f '^python3 /run/' 2>/dev/null  # load and request clients a failed test left running on the host
pkill -KILL -f '^timeout [0-9]+ sh -c' 2>/dev/null
rm -rf /run/systemd/system/{TEST_UNIT_PREFIX}* /run/systemd/system/sglang*
rm -rf /var/lib/simgpu/claims/* /var/lib/llmops /run/lock/llmops*
# What the sglang_service tests leave: a service user, test interpreters and engines, config files.
userdel -r sglang-t 2>/dev/null; groupdel sglang-t 2>/dev/null
rm -rf /opt/fakepy /opt/nosglang /run/llmops-test-* /etc/llmops
rm -f /opt/sglang/venv/lib/python3.11/site-packages/llmops_test_engine.py
# The route to the other lab hosts that gateway_lab.connect_hosts adds (host0 is point-to-point: no /24 of its own).
ip -4 route show dev host0 | awk '$2 == "via" && $1 ~ /[/]24$/ {{print $1}}' | while read -r net; do
  ip route del "$net" dev host0
done
"""

# A test that patched sglang and failed before restoring must not leak into the next one. Hashing every source
# against the wheel's RECORD costs about 0.2 s of CPU per host and reset, so it runs only when a source's inode,
# size or ctime (which every write and every restored mtime changes) differs from the last verified state; what
# differs is then written again from the wheel (files/restore_sglang_sources.py) and hashed once more.
RESTORE_SOURCES = (Path(__file__).parent / "files" / "restore_sglang_sources.py").read_text()
PRISTINE_SCRIPT = (
    """
VENV=/opt/sglang/venv
SITE=$VENV/lib/python3.11/site-packages
VERIFIED=/var/cache/llmops-lab/sglang-sources.verified
sources_state() {
  find $SITE/sglang $SITE/sglang-*.dist-info \\( -name '*.py' -o -name RECORD \\) -printf '%P %i %s %C@\\n' \\
    | sort | sha256sum
}
pristine() {
  $VENV/bin/python -c 'import sys; from sglang_sim import sources as s; sys.exit(bool(s.modified_sources(s.locate())))'
}
[ -s $VERIFIED ] && [ "$(sources_state)" = "$(cat $VERIFIED)" ] && exit 0
pristine || { $VENV/bin/python - <<'RESTORE_SOURCES'
"""
    + RESTORE_SOURCES
    + """RESTORE_SOURCES
pristine; } && sources_state > $VERIFIED
"""
)


class Lab:
    """A booted lab: inventory, host names, and helpers to drive Ansible and the hosts."""

    def __init__(self, name: str, inventory: Path, hosts: list[str]):
        self.name = name
        self.inventory = inventory
        self.hosts = hosts
        # Hosts that a command, a module or a playbook reached since their last reset: what reset_used() resets.
        self.used: set[str] = set()

    def _use(self, pattern: str | None) -> None:
        """Note the hosts a command reaches: a host of the lab by name, else (a group, a pattern) all of them."""
        names = [part for part in str(pattern or "").replace(",", ":").split(":") if part]
        self.used.update(names if names and all(name in self.hosts for name in names) else self.hosts)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update(
            ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS_PATH),
            ANSIBLE_HOST_KEY_CHECKING="False",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            ANSIBLE_RETRY_FILES_ENABLED="False",
            ANSIBLE_DEPRECATION_WARNINGS="False",
            ANSIBLE_PIPELINING="True",
            ANSIBLE_CONFIG=str(REPO / "tests" / "e2e" / "ansible.cfg"),
        )
        return env

    def exec(self, host: str, command: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a shell command inside a lab host (no SSH; for setting up and inspecting)."""
        self._use(host)
        return self._exec(host, command, check, timeout)

    def _exec(self, host: str, command: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        return self._run_in(host, ["bash", "-c", command], check=check, timeout=timeout)

    def _run_in(
        self, host: str, argv: list, stdin: str | None = None, check: bool = False, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        # `lab exec`'s command line, built here: starting the lab CLI for each command costs about 0.1 s of CPU.
        return subprocess.run(
            exec_argv(self.name, host, argv), input=stdin, capture_output=True, text=True, check=check, timeout=timeout
        )

    def module(
        self,
        host: str,
        module: str,
        args: dict,
        check: bool = False,
        diff: bool = False,
        timeout: float = 600,
        extra_vars: dict | None = None,
    ) -> dict:
        """Run one module over SSH with ad-hoc Ansible; return its result dict (with ``_rc``).

        ``extra_vars`` (e.g. ``{"ansible_python_interpreter": "/opt/sglang/venv/bin/python"}``) go to ``-e``.
        """
        self._use(host)
        cmd = ["ansible", host, "-i", str(self.inventory), "-m", module, "-a", json.dumps(args), "-o"]
        if extra_vars:
            cmd += ["-e", json.dumps(extra_vars)]
        if check:
            cmd.append("--check")
        if diff:
            cmd.append("--diff")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False)
        return parse_oneline(proc.stdout, proc.stderr, proc.returncode)

    def playbook(
        self,
        playbook: str | Path,
        extra_vars: dict | None = None,
        check: bool = False,
        diff: bool = False,
        limit: str | None = None,
        timeout: float = 1200,
        inventories: tuple = (),
        verbosity: int = 0,
        tags: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a playbook against the lab's inventory, with ``inventories`` (paths) layered over it; ``tags`` goes to
        ``--tags``."""
        # The plays of tests/e2e/playbooks run on svc_test_host; any other playbook may reach every host.
        self._use(limit or (extra_vars or {}).get("svc_test_host"))
        cmd = ["ansible-playbook", "-i", str(self.inventory)]
        if verbosity:
            cmd.append("-" + "v" * verbosity)
        for inventory in inventories:
            cmd += ["-i", str(inventory)]
        cmd.append(str(playbook))
        if extra_vars:
            cmd += ["-e", json.dumps(extra_vars)]
        if check:
            cmd.append("--check")
        if diff:
            cmd.append("--diff")
        if limit:
            cmd += ["--limit", limit]
        if tags:
            cmd += ["--tags", tags]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False)

    def reset(self, hosts: list[str] | None = None) -> None:
        """Every host (or ``hosts``) back to blank, side by side (each waits mostly on its own systemd)."""
        hosts = list(self.hosts if hosts is None else hosts)
        if not hosts:
            return
        with concurrent.futures.ThreadPoolExecutor(len(hosts)) as pool:
            list(pool.map(self._reset_host, hosts))

    def reset_used(self) -> None:
        """Back to blank the hosts used since their last reset; the others are blank already."""
        self.reset([host for host in self.hosts if host in self.used])

    def _reset_host(self, host: str) -> None:
        proc = self._run_in(host, ["bash", "-s"], stdin=RESET_SCRIPT + PRISTINE_SCRIPT, timeout=180)
        assert proc.returncode == 0, f"resetting {host} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        self.used.discard(host)


def parse_oneline(stdout: str, stderr: str, rc: int) -> dict:
    """Parse ``ansible -o`` output: ``host | STATUS => {json}``, or ``host | UNREACHABLE!: message``."""
    for line in stdout.splitlines():
        if " | UNREACHABLE!: " in line:
            return {"_rc": rc, "_status": "UNREACHABLE", "unreachable": True, "msg": line.split(": ", 1)[1]}
        if " => " in line:
            status = line.split(" | ", 1)[1].split(" => ", 1)[0].strip() if " | " in line else ""
            try:
                result = json.loads(line.split(" => ", 1)[1])
            except json.JSONDecodeError:
                continue
            result["_rc"] = rc
            result["_status"] = status
            return result
    raise AssertionError(f"no module result in ansible output (rc={rc}):\n{stdout}\n{stderr}")


def shell_quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def lab_name(suffix: str = "") -> str:
    """This session's lab name (``LLMOPS_LAB_NAME``, default ``e2e``), with the xdist worker's letter and ``suffix``;
    at most 6 characters, as the lab CLI accepts."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest-xdist
    letter = chr(ord("a") + int(worker[2:])) if worker.startswith("gw") else ""
    base = os.environ.get("LLMOPS_LAB_NAME", "e2e")
    return base[: 6 - len(letter) - len(suffix)] + letter + suffix


def lab_options(session) -> list[str]:
    """``lab up`` options for this session's labs: TEST_LAB_OPTIONS, none for a session that runs a benchmark."""
    return [] if any(item.get_closest_marker("bench") for item in session.items) else list(TEST_LAB_OPTIONS)


@pytest.fixture(scope="session")
def lab(request):
    name = lab_name()
    hosts = int(os.environ.get("LLMOPS_LAB_HOSTS", "3"))
    gpus = int(os.environ.get("LLMOPS_LAB_GPUS", "2"))
    yield from boot_lab(name, hosts, gpus, lab_options(request.session))


@pytest.fixture(scope="module")
def lab_gpus4(request):
    """A lab host with 4 GPUs: the session's lab when it has them (LLMOPS_LAB_GPUS=4), else a one-host lab of its own
    (LLMOPS_LAB4_NAME, default the session lab's name ending in 'q')."""
    if int(os.environ.get("LLMOPS_LAB_GPUS", "2")) >= 4:
        yield request.getfixturevalue("lab")
        return
    name = os.environ.get("LLMOPS_LAB4_NAME") or lab_name("q")
    yield from boot_lab(name, 1, 4, lab_options(request.session))


def boot_lab(name: str, hosts: int, gpus: int, options: list[str]):
    """Boot a lab with ``lab up`` ``options``, yield it, take it down (unless LLMOPS_LAB_KEEP=1)."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root")
    try:
        out = subprocess.run(
            [str(LAB_CLI), "up", "--name", name, "--hosts", str(hosts), "--gpus", str(gpus), *options],
            capture_output=True,
            text=True,
            check=True,
            timeout=1800,
        )
    except subprocess.CalledProcessError as exc:
        subprocess.run([str(LAB_CLI), "down", "--name", name], check=False)
        raise AssertionError(f"lab up failed:\n{exc.stdout}\n{exc.stderr}") from exc
    inventory = Path(out.stdout.strip().splitlines()[-1])
    booted = Lab(name, inventory, [f"{name}{i}" for i in range(1, hosts + 1)])
    try:
        yield booted
    finally:
        # LLMOPS_LAB_KEEP=1 leaves the lab up to look at its hosts after a failure; `tests/lab/lab down` ends it.
        if os.environ.get("LLMOPS_LAB_KEEP") != "1":
            subprocess.run([str(LAB_CLI), "down", "--name", name], check=False, timeout=300)


@pytest.fixture
def clean_lab(lab):
    """The shared lab with every host blank; after the test, the hosts it used are reset."""
    lab.reset_used()
    yield lab
    lab.reset_used()


# -- heaviest files first, from durations.json --------------------------------------------------------------


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        default=False,
        help=f"write each test file's measured duration (setup, call and teardown) into {DURATIONS.name}",
    )


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def heaviest_files_first(nodeids: list[str], durations: dict[str, float]) -> list[str]:
    """``nodeids`` with whole files ordered by their duration, longest first; a file keeps its tests' order."""
    first_seen = {}
    for index, nodeid in enumerate(nodeids):
        first_seen.setdefault(file_of(nodeid), index)

    def weight(nodeid: str) -> tuple:
        name = file_of(nodeid)
        return (-durations.get(name, DEFAULT_FILE_SECONDS), first_seen[name])

    return sorted(nodeids, key=weight)


def pytest_collection_modifyitems(session, config, items):
    order = {
        nodeid: index for index, nodeid in enumerate(heaviest_files_first([i.nodeid for i in items], load_durations()))
    }
    items.sort(key=lambda item: order[item.nodeid])


_measured: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    _measured[file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not config.getoption("record_durations", False) or hasattr(config, "workerinput"):
        return  # under xdist the controller, which gets every worker's reports, writes the file
    durations = load_durations()
    durations.update({name: round(seconds) for name, seconds in _measured.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(durations.items())), indent=2) + "\n")
