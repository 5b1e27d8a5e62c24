"""Raw data of the benchmarks (``make bench``): every sample, with the commit, the machine and the lab settings.

Each benchmark writes ``docs/performance/<run>/<benchmark>.json`` as it goes (a benchmark that fails half-way
leaves what it measured, marked incomplete); ``tests/bench/write_performance.py`` computes every published number
from those files alone. ``<run>`` is ``LLMOPS_BENCH_RUN`` (``make bench`` sets it once for all its parts), else the
UTC time this process started. Times are epoch seconds (``time.time()``): the lab hosts share the controller's
clock, so an interval may start on one and stop on the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from labutil import install_unit, sh

REPO = Path(__file__).resolve().parents[2]
OUT_ROOT = Path(os.environ.get("LLMOPS_BENCH_DIR", REPO / "docs" / "performance"))
RUN = os.environ.get("LLMOPS_BENCH_RUN") or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
RUNS = int(os.environ.get("LLMOPS_BENCH_RUNS", "5"))  # the median of at least 5 runs, as the targets ask
TIMER_PLUGINS = REPO / "tests" / "bench" / "callback_plugins"
OPERATOR = REPO / "tests" / "bench" / "operator"
# The main commit before the restart chain and the host state moved into modules: the "no worse than before" side.
BASELINE = os.environ.get("LLMOPS_BENCH_BASELINE", "d8cbfba")


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def commit_info() -> dict:
    """HEAD and whether the tree differs from it (the benchmarks' own output left out)."""
    status = _git("status", "--porcelain", "--", ".", ":!docs/performance", ":!docs/performance.md")
    return {"sha": _git("rev-parse", "HEAD"), "dirty": bool(status), "dirty_paths": status.splitlines()[:20]}


def machine_info() -> dict:
    with open("/proc/meminfo") as handle:
        mem_kib = int(handle.readline().split()[1])
    ansible = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "ansible": ansible[0] if ansible else "unknown",
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
    }


def in_turn(round_number: int, sides: list) -> list:
    """The sides of a round in the order they run: reversed every other round, so that none always goes first."""
    return list(sides) if round_number % 2 == 0 else list(reversed(sides))


class Recorder:
    """One benchmark's file: its settings, every sample and the duration of each part, written after each change."""

    def __init__(self, name: str, lab, settings: dict):
        self.path = OUT_ROOT / RUN / f"{name}.json"
        self.data = {
            "benchmark": name,
            "run": RUN,
            "commit": commit_info(),
            "machine": machine_info(),
            "lab": {
                "name": lab.name,
                "hosts": len(lab.hosts),
                "gpus_per_host": int(os.environ.get("LLMOPS_LAB_GPUS", "2")),
            },
            "settings": settings,
            "rounds": RUNS,
            "started": time.time(),
            "finished": None,
            "complete": False,
            "skipped": None,
            "parts": [],
            "samples": [],
            "notes": {},
        }
        self._write()

    def sample(self, **fields) -> dict:
        if "start" in fields and "stop" in fields and "seconds" not in fields:
            fields["seconds"] = fields["stop"] - fields["start"]
        self.data["samples"].append(fields)
        self._write()
        return fields

    def note(self, key: str, text: str) -> None:
        self.data["notes"][key] = text
        self._write()

    def skip(self, reason: str) -> None:
        self.data.update(skipped=reason, finished=time.time(), complete=True)
        self._write()

    def finish(self) -> None:
        self.data.update(finished=time.time(), complete=True)
        self._write()

    @contextlib.contextmanager
    def part(self, name: str):
        """A part of the benchmark's budget: printed (pytest -s) and recorded with its start and stop."""
        start = time.time()
        try:
            yield
        finally:
            stop = time.time()
            self.data["parts"].append({"name": name, "start": start, "stop": stop})
            self._write()
            print(f"bench {self.data['benchmark']}: {name}: {stop - start:.1f} s", flush=True)

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.path)


class Timed:
    """A finished ansible-playbook run: its process, wall-clock start and stop, and the bench_timer timeline."""

    def __init__(self, proc, start: float, stop: float, timeline: dict):
        self.proc = proc
        self.start = start
        self.stop = stop
        self.timeline = timeline

    @property
    def output(self) -> str:
        return (self.proc.stdout or "")[-6000:] + (self.proc.stderr or "")[-3000:]

    def task(self, name: str, host: str | None = None) -> dict:
        """The one run of the task called ``name`` (on ``host``); fails naming the tasks there were."""
        found = [t for t in self.timeline.get("tasks", []) if t["name"] == name and host in (None, t["host"])]
        names = sorted({t["name"] for t in self.timeline.get("tasks", [])})
        assert len(found) == 1, f"{len(found)} runs of task {name!r} (tasks: {names})\n{self.output}"
        return found[0]

    def task_start(self, name: str) -> float:
        """When the task called ``name`` started (also for includes, which have no per-host start)."""
        starts = [t["start"] for t in self.timeline.get("task_starts", []) if t["name"] == name]
        assert starts, f"no task {name!r} started\n{self.output}"
        return starts[0]


def timed_playbook(
    lab,
    playbook: Path,
    extra_vars: dict | None = None,
    limit: str | None = None,
    inventories: tuple = (),
    collections: Path | None = None,
    timeout: float = 1200,
) -> Timed:
    """Run ``ansible-playbook`` as the operator would, timing the process and, through bench_timer, its tasks.

    ``collections`` replaces the collection path (the baseline commit's checkout)."""
    cmd = ["ansible-playbook", "-i", str(lab.inventory)]
    for inventory in inventories:
        cmd += ["-i", str(inventory)]
    cmd.append(str(playbook))
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    if limit:
        cmd += ["--limit", limit]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        timer_out = Path(handle.name)
    env = lab.env()
    env.update(
        ANSIBLE_CALLBACK_PLUGINS=str(TIMER_PLUGINS),
        ANSIBLE_CALLBACKS_ENABLED="bench_timer",
        LLMOPS_BENCH_TIMER_OUT=str(timer_out),
    )
    if collections is not None:
        env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    try:
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        stop = time.time()
        text = timer_out.read_text()
        timeline = json.loads(text) if text else {}
    finally:
        timer_out.unlink(missing_ok=True)
    return Timed(proc, start, stop, timeline)


@contextlib.contextmanager
def fresh_hosts(lab, count: int):
    """The lab's first ``count`` hosts as a lab of their own, reset before and after (on a 12-host lab, resetting
    only the hosts a benchmark uses saves seconds per host)."""
    assert len(lab.hosts) >= count, f"this benchmark needs {count} lab hosts, the lab has {len(lab.hosts)}"
    part = type(lab)(lab.name, lab.inventory, lab.hosts[:count])
    part.reset()
    try:
        yield part
    finally:
        part.reset()


@contextlib.contextmanager
def baseline_checkout(commit: str = BASELINE):
    """The collection at ``commit`` in a directory of its own (``git archive``; the repository is not touched),
    importable as ``ansible_collections.llmops.inference``. Yields (checkout, collections path, full sha)."""
    sha = _git("rev-parse", f"{commit}^{{commit}}")
    root = Path(tempfile.mkdtemp(prefix=f"llmops-bench-{sha[:8]}-"))
    try:
        tree = root / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", sha], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        link = root / "collections" / "ansible_collections" / "llmops" / "inference"
        link.parent.mkdir(parents=True)
        link.symlink_to(tree)
        baseline_group_vars = tree / "tests" / "lab" / "inventory" / "group_vars" / "lab.yml"
        group_vars = yaml.safe_load(baseline_group_vars.read_text())
        group_vars.update(baseline_vars(group_vars))
        baseline_group_vars.write_text(yaml.safe_dump(group_vars, sort_keys=False))
        yield tree, root / "collections", sha
    finally:
        shutil.rmtree(root, ignore_errors=True)


# The operator's side of a comparison: plain units and scripts on the lab hosts.
UNIT = "sglang.service"  # the lab inventory's sglang_service_name
OPERATOR_UNIT = "t-op-sglang.service"
URL = "http://127.0.0.1:30000"
BENCH_DIR = "/root/bench"
PLAYS = REPO / "tests" / "e2e" / "playbooks"
LAB_INVENTORY = REPO / "tests" / "lab" / "inventory"
BENCH_MODEL = "Qwen/Qwen3-8B"


def lab_group_vars() -> dict:
    merged = {}
    for path in sorted((LAB_INVENTORY / "group_vars").glob("*.yml")):
        merged.update(yaml.safe_load(path.read_text()) or {})
    return merged


# The baseline commit's unit sets no PATH, and the faithful lab's engine, like SGLang 0.5.23's JIT kernels, runs
# the venv's bare `ninja` (tests/lab/README.md): without the venv's bin/ on PATH that commit's engine never loads.
# Its side gets the one line an operator of that commit had to add to run 0.5.23, nothing else.
BASELINE_PATH = "/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def baseline_vars(variables: dict) -> dict:
    """``variables`` with the venv's bin/ on the engine's PATH, for the baseline commit's role."""
    environment = {**variables.get("sglang_service_environment", {}), "PATH": BASELINE_PATH}
    return {**variables, "sglang_service_environment": environment}


def engine_vars(load_s: float) -> dict:
    """The lab inventory's engine, with this load time: the same on every side of a comparison."""
    environment = dict(lab_group_vars().get("sglang_service_environment", {}))
    environment["SGLANG_SIM_LOAD_TIME"] = f"{load_s:g}"
    return {
        "sglang_service_model_path": BENCH_MODEL,
        "sglang_service_tp_size": 2,
        "sglang_service_environment": environment,
    }


def chain_restart(lab, host: str, variables: dict, tmp_path: Path, collections=None, inventory=LAB_INVENTORY) -> dict:
    """One restart through tests/e2e/playbooks/bench_restart.yml: the sample fields of the chain's task interval."""
    result = tmp_path / f"gate-{host}.json"
    result.unlink(missing_ok=True)
    run = timed_playbook(
        lab,
        PLAYS / "bench_restart.yml",
        {"bench_host": host, "bench_result": str(result), **variables},
        inventories=(inventory,),
        collections=collections,
        timeout=1800,
    )
    gate = json.loads(result.read_text()) if result.exists() else {}
    ok = run.proc.returncode == 0 and bool(gate.get("healthy"))
    starts = {task["name"]: task["start"] for task in run.timeline.get("task_starts", [])}
    return {
        "start": starts.get("Run the restart chain", run.start),
        "stop": starts.get("Hand the gate's verdict to the benchmark", run.stop),
        "process_start": run.start,
        "process_stop": run.stop,
        "gate_elapsed_s": gate.get("elapsed_s"),
        "chain_steps": [{"name": step["name"], "elapsed_s": step["elapsed_s"]} for step in gate.get("steps") or []],
        "ok": ok,
        "error": None if ok else run.output[-1500:],
    }


def push_operator_scripts(lab, host: str) -> None:
    """tests/bench/operator/ to BENCH_DIR on the host."""
    for script in sorted(OPERATOR.iterdir()):
        text = script.read_text()
        sh(
            lab,
            host,
            f"mkdir -p {BENCH_DIR} && cat > {BENCH_DIR}/{script.name} <<'EOF'\n{text}EOF\n"
            f"chmod +x {BENCH_DIR}/{script.name}",
        )


# Set by systemd for each start, not part of what the unit gives its engine.
PER_START_VARIABLES = (
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "SYSTEMD_EXEC_PID",
    "MANAGERPID",
    "NOTIFY_SOCKET",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "MONITOR_",
)


def engine_of(lab, host: str, unit: str = UNIT) -> dict:
    """The running engine's command line and environment (Environment=, EnvironmentFile= and systemd's own), as
    /proc has them for the unit's main process."""
    pid = sh(lab, host, f"systemctl show -P MainPID {unit}").strip()
    argv = sh(lab, host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
    environ = sh(lab, host, f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    environment = sorted(item for item in environ if item and not item.startswith(PER_START_VARIABLES))
    return {"argv": argv, "environment": environment}


def install_operator_unit(lab, host: str, engine: dict) -> None:
    """An operator's plain unit for the same engine (its command line and environment), systemd's defaults otherwise;
    started and waited for like the operator's restart."""
    lines = ["[Unit]", "Description=SGLang, an operator's plain unit", "[Service]"]
    lines += [f"Environment={shlex.quote(item)}" for item in engine["environment"]]
    lines.append("ExecStart=" + " ".join(shlex.quote(arg) for arg in engine["argv"]))
    install_unit(lab, host, OPERATOR_UNIT, "\n".join(lines) + "\n")
    started = operator_restart(lab, host)
    assert started["ok"], started["error"]


def ssh_argv(lab, host: str) -> list:
    """`ssh root@host` as an operator types it on the controller: a new connection each time (no ControlMaster)."""
    hosts = yaml.safe_load(Path(lab.inventory).read_text())["all"]["children"]["lab"]
    return [
        "ssh", "-i", hosts["vars"]["ansible_ssh_private_key_file"], "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
        f"root@{hosts['hosts'][host]['ansible_host']}",
    ]  # fmt: skip


def over_ssh(lab, host: str, command: str, stdin: str | None = None, timeout: float = 960) -> tuple:
    """``ssh host command`` from the controller: (its process start and exit on the controller's clock, the
    completed process)."""
    lab.used.add(host)
    began = time.time()
    proc = subprocess.run(
        [*ssh_argv(lab, host), command], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    return began, time.time(), proc


def operator_restart(lab, host: str, script: str = "restart.sh", *args, ssh: bool = False) -> dict:
    """An operator's restart script of tests/bench/operator/ on the host (restart.sh: restart and a /health loop):
    the sample fields of its wall-clock start, stop and, where it says, when the engine served (``serving``).

    With ``ssh`` the script runs as ``ssh host script`` from the controller, and start and stop are that process's on
    the controller (the lab's hosts share the controller's clock); the script's own are kept as host_start and
    host_stop."""
    began = time.time()
    command = " ".join([f"{BENCH_DIR}/{script}", OPERATOR_UNIT, URL, *map(str, args)])
    if ssh:
        began, ended, proc = over_ssh(lab, host, command)
    else:
        proc = lab.exec(host, command, timeout=960)
    if proc.returncode != 0:
        return {"start": began, "stop": time.time(), "ok": False, "error": (proc.stdout + proc.stderr)[-1500:]}
    times = [float(value) for value in proc.stdout.split()]
    if ssh:
        fields = {"start": began, "stop": ended, "host_start": times[0], "host_stop": times[-1], "ok": True}
    else:
        fields = {"start": times[0], "stop": times[-1], "ok": True}
    if len(times) == 3:
        fields["serving"] = times[1]
    return fields


def apply_role(lab, hosts: str, variables: dict, collections=None, inventory=LAB_INVENTORY) -> None:
    """The sglang_service role on ``hosts`` (tests/e2e/playbooks/bench_service.yml) with ``variables``."""
    run = timed_playbook(
        lab,
        PLAYS / "bench_service.yml",
        {"bench_host": hosts, **variables},
        inventories=(inventory,),
        collections=collections,
        timeout=1800,
    )
    assert run.proc.returncode == 0, run.output
