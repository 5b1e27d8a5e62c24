"""nvidia_reap on real systemd: orphaned schedulers keep GPU memory after a KillMode=process stop.

Bystanders that must survive every run: `t-foreign.service`, an active unit whose GPU holder is titled
`sglang::foreign` (so a `^sglang::` pattern matches it and only the other-unit rule protects it), and a
plain `simgpu-claim` started with setsid outside every unit and selector.
"""

from __future__ import annotations

import base64
import re
import shlex
from pathlib import Path

import pytest
from labutil import SERVICE_PATH, install_unit, sh, wait_ready

pytestmark = pytest.mark.lab

MODULE = "llmops.inference.nvidia_reap"
VENV_PYTHON = "/opt/sglang/venv/bin/python"
PORT = 30000
GRACE = 2
REPO = Path(__file__).resolve().parents[2]

REAP_UNIT = f"""\
[Unit]
Description=nvidia_reap test server (KillMode=process leaves its schedulers behind)

[Service]
Environment=SGLANG_SIM_FAULTS=orphan-schedulers
Environment={SERVICE_PATH}
ExecStart={VENV_PYTHON} -m sglang_sim.launch_server --model-path /models/test --tp-size 2 --host 127.0.0.1 --port {PORT}
KillMode=process
TimeoutStopSec=60
"""

FOREIGN_UNIT = """\
[Unit]
Description=Someone else's GPU job

[Service]
ExecStart=/bin/bash -c 'exec -a sglang::foreign /usr/bin/python3 /usr/local/bin/simgpu-claim --hold --gpu 0 --mib 1000'
"""

WAIT_HOLDER = """
for _ in $(seq 1 100); do
  nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits | grep -qx "$1" && exit 0
  sleep 0.1
done
echo "pid $1 never held GPU memory"; exit 1
"""

WAIT_UNIT_DOWN = """
for _ in $(seq 1 600); do
  state=$(systemctl show -P ActiveState "$1")
  case "$state" in inactive|failed) echo "$state"; exit 0;; esac
  sleep 0.2
done
echo "still $state"; exit 1
"""


def pids(lab, host, pattern: str) -> list:
    """PIDs whose command line matches ``pattern``; anchor it or bracket a letter so the shell does not match."""
    proc = lab.exec(host, f"pgrep -f {shlex.quote(pattern)} || true")
    return sorted(int(pid) for pid in proc.stdout.split())


def alive(lab, host, pid: int) -> bool:
    return lab.exec(host, f"test -d /proc/{pid} && ! grep -q '^[^)]*) [ZX]' /proc/{pid}/stat").returncode == 0


def gpu_used(lab, host) -> list:
    out = sh(lab, host, "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
    return [int(line) for line in out.split()]


def start_healthy(lab, host) -> None:
    sh(lab, host, "systemctl start t-reap.service")
    try:
        wait_ready(lab, host, PORT)
    except AssertionError:
        journal = lab.exec(host, "journalctl -u t-reap.service --no-pager -n 30").stdout
        raise AssertionError(f"t-reap.service never answered /ready 200:\n{journal}") from None


def stop_leaving_orphans(lab, host) -> list:
    """Start the server, stop it, and return the schedulers KillMode=process left behind."""
    start_healthy(lab, host)
    sh(lab, host, "systemctl stop t-reap.service")
    orphans = pids(lab, host, "^sglang::scheduler_TP")
    assert len(orphans) == 2, f"expected 2 orphaned schedulers, found {orphans}"
    return orphans


@pytest.fixture
def bystanders(clean_lab):
    """The foreign unit and the plain holder; yields (host, foreign_pid, plain_pid)."""
    lab = clean_lab
    host = lab.hosts[0]
    install_unit(lab, host, "t-foreign.service", FOREIGN_UNIT)
    install_unit(lab, host, "t-reap.service", REAP_UNIT)
    sh(lab, host, "systemctl start t-foreign.service")
    plain = int(sh(lab, host, "setsid simgpu-claim --hold --gpu 1 --mib 500 </dev/null >/dev/null 2>&1 & echo $!"))
    try:
        foreign = int(sh(lab, host, "systemctl show -P MainPID t-foreign.service"))
        for pid in (foreign, plain):
            sh(lab, host, f"bash -c {shlex.quote(WAIT_HOLDER)} _ {pid}")
        yield host, foreign, plain
    finally:
        lab.exec(host, f"kill -KILL {plain}")


def assert_bystanders_alive(lab, host, foreign: int, plain: int) -> None:
    assert alive(lab, host, foreign), "the foreign unit's GPU process was killed"
    assert alive(lab, host, plain), "the plain GPU process outside every selector was killed"
    assert sh(lab, host, "systemctl is-active t-foreign.service").strip() == "active"


def test_reap_unit_leftovers_after_killmode_process_stop(clean_lab, bystanders):
    lab = clean_lab
    host, foreign, plain = bystanders
    orphans = stop_leaving_orphans(lab, host)
    used = gpu_used(lab, host)
    assert used[0] > 1000 + 1 and used[1] > 500 + 1, f"orphans should hold memory: {used}"

    # Failure 1: the next start runs out of GPU memory and fails.
    sh(lab, host, "systemctl start t-reap.service")
    down = lab.exec(host, f"bash -c {shlex.quote(WAIT_UNIT_DOWN)} _ t-reap.service", timeout=180)
    assert down.stdout.strip() == "failed", down.stdout + down.stderr

    args = {"unit": "t-reap.service", "match": "^sglang::", "grace": GRACE, "timeout": 30}
    holders = pids(lab, host, "^sglang::")
    assert set(orphans) <= set(holders)
    preview = lab.module(host, MODULE, args, check=True, diff=True)
    assert preview["_rc"] == 0, preview
    assert preview["changed"] is True
    assert set(orphans) <= {entry["pid"] for entry in preview["reaped"]} <= set(holders)
    assert all(entry["signals"] == [] for entry in preview["reaped"])
    assert all(alive(lab, host, pid) for pid in orphans), "check mode must not signal"
    orphans = sorted(entry["pid"] for entry in preview["reaped"])

    result = lab.module(host, MODULE, args)
    assert result["_rc"] == 0, result
    assert result["changed"] is True
    assert result["backend"] == "nvidia-smi", "the default interpreter has no pynvml"
    reaped = {entry["pid"]: entry for entry in result["reaped"]}
    assert sorted(reaped) == orphans
    assert all(entry["signals"] == ["SIGTERM", "SIGKILL"] and entry["exited"] for entry in reaped.values())
    assert result["unkillable"] == [] and result["unreapable"] == []
    print(f"nvidia_reap: SIGTERM-ignoring schedulers reaped in {result['elapsed_s']}s with grace {GRACE}s")
    # The driver releases memory a moment after its holder is gone: the reap returns only once it has.
    # GPUs 0 and 1 keep the bystanders' memory; any further GPU of the host (a 4-GPU lab) is idle.
    idle = [1] * (len(used) - 2)
    assert [gpu["used_mib"] - gpu["reserved_mib"] for gpu in result["gpus_after"]] == [1 + 1000, 1 + 500, *idle]
    assert gpu_used(lab, host) == [1 + 1000, 1 + 500, *idle]
    assert result["released_mib"] > 0
    assert not any(alive(lab, host, pid) for pid in orphans)

    again = lab.module(host, MODULE, args)
    assert again["_rc"] == 0 and again["changed"] is False and again["reaped"] == [], again

    start_healthy(lab, host)
    assert_bystanders_alive(lab, host, foreign, plain)


def test_reap_orphaned_schedulers_by_pattern_through_nvml(clean_lab, bystanders):
    lab = clean_lab
    host, foreign, plain = bystanders
    orphans = stop_leaving_orphans(lab, host)
    venv = {"ansible_python_interpreter": VENV_PYTHON}
    args = {"match": "^sglang::", "orphans_only": True, "gpus": ["0", "1"], "grace": GRACE, "released_below_mib": 1100}

    result = lab.module(host, MODULE, args, extra_vars=venv)
    assert result["_rc"] == 0, result
    assert result["backend"] == "nvml"
    assert sorted(entry["pid"] for entry in result["reaped"]) == orphans
    excluded = {entry["pid"]: entry["reason"] for entry in result["excluded"]}
    assert "t-foreign.service" in excluded.get(foreign, ""), result["excluded"]
    assert plain not in excluded, "a process outside every selector is not in scope"
    assert [gpu["used_mib"] - gpu["reserved_mib"] for gpu in result["gpus_after"]] == [1 + 1000, 1 + 500]

    again = lab.module(host, MODULE, args, extra_vars=venv)
    assert again["_rc"] == 0 and again["changed"] is False, again
    assert_bystanders_alive(lab, host, foreign, plain)


BAD_INPUTS = [
    ({"gpus": ["7"]}, "gpus"),
    ({"gpus": ["GPU-00000000-dead-beef-0000-000000000000"]}, "gpus"),
    ({"grace": -1}, "grace"),
    ({"timeout": -5}, "timeout"),
    ({"match": "(sglang"}, "match"),
    ({"pids": [1]}, "pids"),
    ({"kill_timeout": 0}, "kill_timeout"),
    ({"unaccounted_threshold_mib": -1}, "unaccounted_threshold_mib"),
]


def test_bad_input_fails_naming_the_option_and_signals_nothing(clean_lab, bystanders):
    lab = clean_lab
    host, foreign, plain = bystanders
    for args, option in BAD_INPUTS:
        result = lab.module(host, MODULE, {"pids": [plain], **args})
        assert result["_rc"] != 0 and result["_status"].startswith("FAILED"), (args, result)
        assert result["msg"].startswith(f"{option}: "), (args, result["msg"])
    no_selector = lab.module(host, MODULE, {"orphans_only": False, "grace": 1})
    assert no_selector["_status"].startswith("FAILED"), no_selector
    assert no_selector["msg"].startswith("unit: no scope selector given"), no_selector
    running = lab.module(host, MODULE, {"unit": "t-foreign.service"})
    assert running["_status"].startswith("FAILED"), running
    assert running["msg"].startswith("unit: t-foreign.service is active"), running
    assert_bystanders_alive(lab, host, foreign, plain)


# Memory nobody can free, MIG -----------------------------------------------------------------------

ZOMBIE_PARENT = "t-zombie-parent.service"
MIG_GPU = 1
MIG_UNIT = "t-mig.service"
MIG_UNIT_TEXT = f"""\
[Unit]
Description=nvidia_reap test server on one MIG device

[Service]
Environment=SGLANG_SIM_FAULTS=orphan-schedulers
Environment=CUDA_VISIBLE_DEVICES={{uuid}}
Environment={SERVICE_PATH}
ExecStart={VENV_PYTHON} -m sglang_sim.launch_server --model-path /models/test --host 127.0.0.1 --port {PORT}
KillMode=process
"""


def listed_holders(lab, host) -> list:
    return [
        int(pid) for pid in sh(lab, host, "nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits").split()
    ]


def test_a_zombie_holding_memory_fails_the_reap_fast_with_the_evidence(clean_lab, bystanders):
    lab = clean_lab
    host, foreign, plain = bystanders
    # A process whose main thread exited while a thread stuck in the driver keeps its GPU context: a zombie that
    # NVML still lists with its memory. Its parent belongs to another unit, which a reap must not touch.
    sh(lab, host, f"systemd-run --unit {ZOMBIE_PARENT} simgpu-claim --zombie --gpu 1 --mib 5000")
    parent = int(sh(lab, host, f"systemctl show -P MainPID {ZOMBIE_PARENT}"))
    zombie = int(sh(lab, host, f"until pgrep -P {parent} >/dev/null; do sleep 0.05; done; pgrep -P {parent}"))
    sh(lab, host, f"until grep -q '^[^)]*) Z' /proc/{zombie}/stat; do sleep 0.05; done", timeout=30)
    sh(lab, host, f"bash -c {shlex.quote(WAIT_HOLDER)} _ {zombie}")
    args = {"match": "^sglang::", "orphans_only": True, "gpus": ["1"], "grace": 1, "kill_timeout": 2, "timeout": 30}

    preview = lab.module(host, MODULE, args, check=True)
    assert preview["_rc"] == 0, "check mode reports what looks unreapable without failing"
    assert [(entry["pid"], entry["state"]) for entry in preview["unreapable"]] == [(zombie, "Z")]

    result = lab.module(host, MODULE, args)
    assert result["_status"].startswith("FAILED"), result
    assert result["msg"].startswith(f"GPU 1 needs a reset or a reboot: pid {zombie} "), result["msg"]
    assert f"is a zombie (state Z, parent {parent}) holding 5000 MiB" in result["msg"]
    assert result["reset_gpus"] == [1]
    assert result["elapsed_s"] < args["timeout"], "fails once kill_timeout has passed, without waiting out timeout"
    assert alive(lab, host, parent), "the zombie's parent is not signalled"
    assert_bystanders_alive(lab, host, foreign, plain)
    refused = lab.exec(host, "simgpu-claim --reset-gpu 1")
    assert refused.returncode == 1 and "in use by process" in refused.stdout + refused.stderr, refused

    # Ending the parent lets init reap the zombie; the driver then releases its memory and the reap passes.
    sh(lab, host, f"systemctl stop {ZOMBIE_PARENT}")
    after = lab.module(host, MODULE, args)
    assert after["_rc"] == 0 and after["unreapable"] == [] and after["changed"] is False, after
    assert gpu_used(lab, host)[1] == 1 + 500


def test_memory_left_by_a_process_that_no_longer_exists_is_unreapable(clean_lab, bystanders):
    lab = clean_lab
    host, foreign, plain = bystanders
    stuck = sh(lab, host, "simgpu-claim --stuck --gpu 1 --mib 30000")
    gone = int(re.search(r"held by PID (\d+), which no longer exists", stuck).group(1))
    assert listed_holders(lab, host) == sorted([foreign, plain]), "NVML lists live processes only"
    assert gpu_used(lab, host)[1] == 1 + 500 + 30000
    args = {"match": "^sglang::", "orphans_only": True, "gpus": ["1"], "kill_timeout": 2}
    venv = {"ansible_python_interpreter": VENV_PYTHON}
    result = lab.module(host, MODULE, args, extra_vars=venv)
    assert result["_status"].startswith("FAILED"), result
    # 30000 MiB of the gone PID plus the driver's 1 MiB, beside the plain holder's 500 MiB.
    assert result["msg"] == (
        "GPU 1 needs a reset or a reboot: 30001 MiB used beyond the driver's 454 MiB reservation that no listed "
        "process holds (more than 1024 MiB)"
    ), result["msg"]
    assert [(entry["gpu"], entry["pid"], entry["state"], entry["mib"]) for entry in result["unreapable"]] == [
        (1, None, None, 30001)
    ]
    assert gone not in [entry["pid"] for entry in result["unreapable"]]
    reported = lab.module(host, MODULE, {**args, "fail_on_unreapable": False}, extra_vars=venv)
    assert reported["_rc"] == 0 and reported["reset_gpus"] == [1], reported
    assert_bystanders_alive(lab, host, foreign, plain)


@pytest.fixture
def mig_gpu(clean_lab):
    """GPU 1 of the first host in MIG mode with two 3g.40gb devices; yields their UUIDs; leaves MIG mode after."""
    lab = clean_lab
    host = lab.hosts[0]
    sh(lab, host, f"simgpu-claim --mig {MIG_GPU}:2")
    try:
        listing = sh(lab, host, "nvidia-smi -L")
        yield re.findall(r"MIG 3g\.40gb\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)", listing)
    finally:
        lab.reset()
        sh(lab, host, f"simgpu-claim --mig-off {MIG_GPU}")


def test_an_orphan_on_a_mig_device_is_reaped_by_the_devices_uuid(clean_lab, mig_gpu):
    lab = clean_lab
    host = lab.hosts[0]
    assert len(mig_gpu) == 2, mig_gpu
    mine, other = mig_gpu
    venv = {"ansible_python_interpreter": VENV_PYTHON}
    install_unit(lab, host, MIG_UNIT, MIG_UNIT_TEXT.format(uuid=mine))
    sh(lab, host, f"systemctl start {MIG_UNIT}")
    wait_ready(lab, host, PORT)

    probe = "llmops.inference.sglang_probe"
    on_mine = lab.module(
        host, probe, {"unit": MIG_UNIT, "tiers": ["unit", "gpu"], "expected_gpus": [mine]}, extra_vars=venv
    )
    assert on_mine["healthy"] is True and on_mine["gpu_memory_mib"][mine] > 1024, on_mine
    on_other = lab.module(
        host,
        probe,
        {"unit": MIG_UNIT, "tiers": ["gpu"], "expected_gpus": [other], "fail_on_unhealthy": False},
        extra_vars=venv,
    )
    assert on_other["failed_tier"] == "gpu", on_other
    assert (
        on_other["reason"]
        == "the unit's processes hold 0 MiB on GPU 1 MIG device 1 (1 MiB used on the GPU in all): model not loaded"
    )

    # The main process dies alone (as under KillMode=process after a SIGKILL); its scheduler keeps the MIG memory.
    sh(lab, host, f"systemctl kill --kill-whom=main --signal=SIGKILL {MIG_UNIT}")
    sh(lab, host, f'until [ "$(systemctl show -P ActiveState {MIG_UNIT})" = failed ]; do sleep 0.1; done', timeout=60)
    orphans = pids(lab, host, "^sglang::scheduler")
    assert len(orphans) == 1, orphans

    args = {"unit": MIG_UNIT, "match": "^sglang::", "gpus": [mine], "grace": 1}
    preview = lab.module(host, MODULE, args, check=True, extra_vars=venv)
    (device,) = preview["gpus_before"]
    assert device["uuid"] == mine and device["parent_uuid"].startswith("GPU-") and device["mig_index"] == 0, device
    assert [entry["pid"] for entry in preview["reaped"]] == orphans

    result = lab.module(host, MODULE, args, extra_vars=venv)
    assert result["_rc"] == 0 and result["changed"] is True, result
    assert [entry["pid"] for entry in result["reaped"]] == orphans
    (after,) = result["gpus_after"]
    assert (after["uuid"], after["used_mib"], after["processes"]) == (mine, 1, []), after
    assert not alive(lab, host, orphans[0])


# The files the role installs for the unit's gate (its vars/main.yml lists them), so the test runs the same code.
GATE_FILES = (
    "__init__.py",
    *re.findall(r"module_utils_src \}\}/(\w+\.py)", (REPO / "roles/sglang_service/vars/main.yml").read_text()),
)
GATE_DIR = "/tmp/llmops-gate-test"
RESERVED_FILE = "/var/lib/simgpu/reserved_mib"


def install_gate_code(lab, host) -> None:
    """The collection's GPU code where a unit's gate runs it (the role installs the same files)."""
    package = f"{GATE_DIR}/ansible_collections/llmops/inference/plugins/module_utils"
    source = REPO / "plugins" / "module_utils"
    commands = [f"mkdir -p {package}"]
    for part in ("ansible_collections", "ansible_collections/llmops", "ansible_collections/llmops/inference"):
        commands.append(f": > {GATE_DIR}/{part}/__init__.py")
    commands.append(f": > {GATE_DIR}/ansible_collections/llmops/inference/plugins/__init__.py")
    for name in GATE_FILES:
        encoded = base64.b64encode((source / name).read_bytes()).decode() if (source / name).exists() else ""
        commands.append(f"echo {encoded} | base64 -d > {package}/{name}")
    sh(lab, host, " && ".join(commands))


def gate(lab, host, python: str, backend: str, gpus: str) -> tuple:
    code = (
        f"import sys; sys.path.insert(0, {GATE_DIR!r}); "
        "from ansible_collections.llmops.inference.plugins.module_utils.gpu_gate import main; "
        f"sys.exit(main(['gpu-free', '--gpus', {gpus!r}, '--threshold-mib', '1024', '--backend', {backend!r}]))"
    )
    done = lab.exec(host, f"{python} -c {shlex.quote(code)}")
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("reserved", [600, 1536])
def test_a_boards_reservation_never_reads_as_a_holder(clean_lab, reserved):
    """Idle GPUs whose driver reserves 600 or 1536 MiB (NVML v1 used includes it, v2 reports it apart): the GPU-free
    gate passes them and refuses a GPU with a 2 GiB foreign holder, and the reaper calls no idle GPU "needs a
    reset", through NVML and through nvidia-smi."""
    lab = clean_lab
    host = lab.hosts[0]
    before = sh(lab, host, f"cat {RESERVED_FILE}").strip()
    sh(lab, host, f"echo {reserved} > {RESERVED_FILE}")
    holder = None
    try:
        install_gate_code(lab, host)
        smi = sh(lab, host, "nvidia-smi --query-gpu=memory.used,memory.reserved --format=csv,noheader,nounits")
        assert smi.split("\n")[0].replace(" ", "") == f"1,{reserved}", smi
        reap = {"match": "^no-such-process$", "gpus": ["0", "1"], "kill_timeout": 1, "timeout": 5}
        for python, backend in ((VENV_PYTHON, "nvml"), ("/usr/bin/python3", "nvidia-smi")):
            rc, out = gate(lab, host, python, backend, "0,1")
            assert rc == 0, out
            assert f"GPU 0 1 MiB beyond the driver's {reserved} MiB reservation" in out, out
            result = lab.module(host, MODULE, reap, extra_vars={"ansible_python_interpreter": python})
            assert result["_rc"] == 0, result
            assert result["backend"] == backend
            assert (result["unreapable"], result["reset_gpus"]) == ([], []), result
            assert [gpu["reserved_mib"] for gpu in result["gpus_before"]] == [reserved, reserved]
            assert not any("needs a reset" in warning for warning in result.get("warnings", [])), result

        hold = "setsid simgpu-claim --hold --gpu 1 --mib 2048 </dev/null >/dev/null 2>&1 & echo $!"
        holder = int(sh(lab, host, hold))
        sh(lab, host, f"bash -c {shlex.quote(WAIT_HOLDER)} _ {holder}")
        for python, backend in ((VENV_PYTHON, "nvml"), ("/usr/bin/python3", "nvidia-smi")):
            rc, out = gate(lab, host, python, backend, "0,1")
            assert rc == 1, out
            assert "refusing to start the service: 1 GPU(s) hold more than 1024 MiB" in out, out
            assert "GPU 1 (GPU-" in out and f"uses 2049 MiB beyond the driver's {reserved} MiB reservation" in out
            assert f"pid {holder} " in out and "2048 MiB" in out, out
            assert gate(lab, host, python, backend, "0")[0] == 0
    finally:
        if holder is not None:
            lab.exec(host, f"kill -KILL {holder}")
        lab.exec(host, f"echo {before} > {RESERVED_FILE}; rm -rf {GATE_DIR}")
