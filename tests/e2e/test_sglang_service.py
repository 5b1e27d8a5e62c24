"""The sglang_service role on real systemd with the simulated engine (issue 6 acceptance).

Every test applies the role through a small playbook written to its tmp_path, with the lab's
inventory variables (the simulated engine's module and the venv's Python) passed as extra vars.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time
from pathlib import Path

import pytest
from labutil import SERVICE_LAB_VARS, install_unit, sh, wait_healthy

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
LAB_VARS = SERVICE_LAB_VARS
NAME = LAB_VARS["sglang_service_name"]
UNIT = f"{NAME}.service"
VENV_PYTHON = LAB_VARS["sglang_service_python"]
KNOWN_GOOD = f"/var/lib/llmops/known-good/{NAME}"
LOCK = f"/run/lock/llmops-{NAME}.lock"
HOST_LOCK = "/usr/local/libexec/llmops/host_lock.py"

TRICKY_NAME = "a b%c$d\"e'f\\g"
TRICKY_ENV = "x y$HOME \"q\" 'r' `b` \\ #z %n"
API_KEY = "s3cret key$1"

ROLE_PLAY = """\
- name: Apply the sglang_service role
  hosts: "{{ svc_test_host }}"
  gather_facts: false
  roles:
    - role: llmops.inference.sglang_service
  post_tasks:
    - name: Hand the gate's verdict to the test
      ansible.builtin.copy:
        content: "{{ sglang_service_gate | default({}) | to_json }}"
        dest: "{{ svc_test_result }}"
        mode: "0644"
      delegate_to: localhost
      changed_when: false
"""

DROPIN_PLAY = """\
- name: Apply a speculative point as a drop-in and restart through the chain
  hosts: "{{ svc_test_host }}"
  gather_facts: false
  tasks:
    - name: Write the drop-in
      ansible.builtin.include_role:
        name: llmops.inference.sglang_service
        tasks_from: speculative_dropin
    - name: Restart through the chain
      ansible.builtin.include_role:
        name: llmops.inference.sglang_service
        tasks_from: restart
    - name: Hand the gate's verdict to the test
      ansible.builtin.copy:
        content: "{{ sglang_service_gate | to_json }}"
        dest: "{{ svc_test_result }}"
        mode: "0644"
      delegate_to: localhost
      changed_when: false
"""

# The rollback path: restore files, then restart through the handler topic the patch role uses.
RESTORE_PLAY = """\
- name: Put back the previous known-good files and restart through the llmops_sglang_restart topic
  hosts: "{{ svc_test_host }}"
  gather_facts: false
  tasks:
    - name: Restore
      ansible.builtin.include_role:
        name: llmops.inference.sglang_service
        tasks_from: restore_known_good
    - name: Ask for the gated restart the way sglang_patch does
      ansible.builtin.debug:
        msg: "{{ sglang_service_restore.msg }}"
      changed_when: sglang_service_restore.changed
      notify: llmops_sglang_restart
    - name: Run the handler now
      ansible.builtin.meta: flush_handlers
    - name: Hand the gate's verdict to the test
      ansible.builtin.copy:
        content: "{{ sglang_service_gate | default({}) | to_json }}"
        dest: "{{ svc_test_result }}"
        mode: "0644"
      delegate_to: localhost
      changed_when: false
"""

BAD_UNIT = f"""\
[Unit]
Description=SGLang as found on real hosts
StartLimitIntervalSec=0

[Service]
Environment=SGLANG_SIM_FAULTS=orphan-schedulers,slow-drain
ExecStart={VENV_PYTHON} -m sglang_sim.launch_server --model-path Qwen/Qwen3-8B --tp-size 2 --sim-load-time 1
KillMode=process
TimeoutStopSec=60
Restart=on-failure
RestartSec=1
"""

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)
WATCHED = f"/etc/systemd/system /etc/llmops /usr/local/libexec/llmops /usr/local/lib/llmops /var/lib/llmops {LOCK}"


class Run:
    def __init__(self, proc, result_path: Path):
        self.proc = proc
        self.output = proc.stdout + proc.stderr
        self.result_path = result_path

    @property
    def ok(self) -> bool:
        return self.proc.returncode == 0

    def changed(self, host: str) -> int:
        counts = {match[0]: int(match[2]) for match in RECAP.findall(self.proc.stdout)}
        return counts[host]

    def gate(self) -> dict:
        return json.loads(self.result_path.read_text()) if self.result_path.exists() else {}


def run_play(lab, tmp_path: Path, host: str, play: str, extra: dict | None = None, label: str = "run") -> Run:
    playbook = tmp_path / f"{label}.yml"
    playbook.write_text(play)
    result = tmp_path / f"{label}.gate.json"
    extra_vars = {**LAB_VARS, **(extra or {}), "svc_test_host": host, "svc_test_result": str(result)}
    return Run(lab.playbook(playbook, extra_vars), result)


def unit_show(lab, host: str) -> dict:
    text = sh(lab, host, f"systemctl show {UNIT} -p ActiveState,SubState,MainPID,NRestarts,Result")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def alive(lab, host: str, pid: int) -> bool:
    return lab.exec(host, f"test -d /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status").returncode == 0


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.5)


def fingerprint(lab, host: str) -> str:
    """Every file the role could write, with its checksum (missing paths are simply absent)."""
    return sh(lab, host, f"find {WATCHED} -type f -exec sha256sum {{}} + 2>/dev/null | sort; true")


def proc_strings(lab, host: str, path: str) -> list:
    """The NUL-separated strings of a /proc file such as cmdline or environ, exactly as the kernel has them."""
    raw = base64.b64decode(sh(lab, host, f"base64 -w0 {path}"))
    return [part.decode() for part in raw.split(b"\0") if part]


def argv_of(lab, host: str, pid: int) -> list:
    return proc_strings(lab, host, f"/proc/{pid}/cmdline")


def environ_of(lab, host: str, pid: int) -> dict:
    return dict(item.split("=", 1) for item in proc_strings(lab, host, f"/proc/{pid}/environ") if "=" in item)


def test_fresh_host_serves_quoted_arguments_and_a_rerun_changes_nothing(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    settings = {
        "sglang_service_served_model_name": TRICKY_NAME,
        "sglang_service_environment": {"LLMOPS_TEST_VALUE": TRICKY_ENV},
        "sglang_service_api_key": API_KEY,
    }
    first = run_play(clean_lab, tmp_path, host, ROLE_PLAY, settings, "first")
    assert first.ok, first.output
    gate = first.gate()
    assert gate["healthy"] is True, gate
    assert set(gate["gpu_memory_mib"]) == {"0", "1"}

    unit = sh(clean_lab, host, f"cat /etc/systemd/system/{UNIT}")
    for line in (
        "KillMode=control-group",
        "TimeoutStopSec=10",
        "Restart=on-failure",
        "StartLimitBurst=3",
        f"EnvironmentFile=/etc/llmops/{NAME}.env",
        "--api-key ${SGLANG_API_KEY}",
    ):
        assert line in unit
    assert "ExecStartPre=" in unit and "gpu-free --gpus 0,1" in unit
    assert "ExecStartPost=" in unit and "ready --url http://127.0.0.1:30000/health" in unit
    assert "s3cret" not in unit
    assert sh(clean_lab, host, f"stat -c %a /etc/llmops/{NAME}.env").strip() == "600"

    pid = int(unit_show(clean_lab, host)["MainPID"])
    argv = argv_of(clean_lab, host, pid)
    assert argv[argv.index("--served-model-name") + 1] == TRICKY_NAME
    assert argv[argv.index("--api-key") + 1] == API_KEY
    assert environ_of(clean_lab, host, pid)["LLMOPS_TEST_VALUE"] == TRICKY_ENV

    manifest = json.loads(sh(clean_lab, host, f"cat {KNOWN_GOOD}/current/manifest.json"))
    assert set(manifest["files"]) == {"unit", "environment"}
    live_sum = sh(clean_lab, host, f"sha256sum /etc/systemd/system/{UNIT}").split()[0]
    assert manifest["files"]["unit"]["sha256"] == live_sum
    assert manifest["patch_state_id"] == "unknown"
    assert sh(clean_lab, host, f"stat -c %a {KNOWN_GOOD}").strip() == "700"
    assert json.loads(sh(clean_lab, host, f"python3 {HOST_LOCK} status --path {LOCK}"))["held"] is False

    second = run_play(clean_lab, tmp_path, host, ROLE_PLAY, settings, "second")
    assert second.ok, second.output
    assert second.changed(host) == 0, second.output
    assert second.gate() == {}
    after = unit_show(clean_lab, host)
    assert int(after["MainPID"]) == pid
    assert after["NRestarts"] == "0"

    # The ExecStartPre gate refuses to start while another process holds GPU memory, and names it.
    sh(clean_lab, host, f"systemctl stop {UNIT}")
    hog = int(
        sh(
            clean_lab,
            host,
            "setsid bash -c 'exec -a gpu-hog python3 /usr/local/bin/simgpu-claim --hold --gpu 1 --mib 2000' "
            "</dev/null >/dev/null 2>&1 & echo $!",
        )
    )
    wait_until(
        lambda: str(hog) in sh(clean_lab, host, "nvidia-smi --query-compute-apps=pid --format=csv,noheader"),
        20,
        "the GPU hog to claim memory",
    )
    refused = clean_lab.exec(host, f"systemctl start {UNIT}")
    assert refused.returncode != 0
    journal = sh(clean_lab, host, f"journalctl -u {UNIT} --no-pager -n 40")
    assert f"refusing to start {UNIT}: 1 GPU(s) hold more than 1024 MiB" in journal
    assert f"pid {hog} 'gpu-hog' 2000 MiB" in journal
    sh(clean_lab, host, f"kill {hog}")


def test_restart_loop_of_a_bad_unit_is_ended_its_orphans_reaped_and_the_gate_passes(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    install_unit(clean_lab, host, UNIT, BAD_UNIT)
    sh(clean_lab, host, f"systemctl start {UNIT}")
    wait_healthy(clean_lab, host)
    # What systemd does at TimeoutStopSec with KillMode=process: SIGKILL for the main process only.
    sh(clean_lab, host, f"systemctl kill --signal=SIGKILL --kill-whom=main {UNIT}")
    orphans = [int(pid) for pid in sh(clean_lab, host, "pgrep -f '^sglang::scheduler' || true").split()]
    assert len(orphans) == 2
    wait_until(lambda: int(unit_show(clean_lab, host)["NRestarts"]) >= 2, 60, "the restart loop")

    run = run_play(
        clean_lab,
        tmp_path,
        host,
        ROLE_PLAY,
        {"sglang_service_environment": {"SGLANG_SIM_FAULTS": "orphan-schedulers,slow-drain"}},
    )
    assert run.ok, run.output
    assert run.gate()["healthy"] is True
    assert not [pid for pid in orphans if alive(clean_lab, host, pid)]
    first = unit_show(clean_lab, host)
    assert first["ActiveState"] == "active" and first["NRestarts"] == "0"
    time.sleep(3)
    assert unit_show(clean_lab, host)["MainPID"] == first["MainPID"]
    assert "llmops-gate gpu-free: GPUs free" in sh(clean_lab, host, f"journalctl -u {UNIT} --no-pager -n 200")


def test_never_loading_model_fails_on_the_gpu_tier_and_the_unit_does_not_flap(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    sh(clean_lab, host, f"rm -rf {KNOWN_GOOD}")
    run = run_play(
        clean_lab,
        tmp_path,
        host,
        ROLE_PLAY,
        {"sglang_service_environment": {"SGLANG_SIM_FAULTS": "never-load"}, "sglang_service_probe_wait_timeout": 5},
    )
    assert not run.ok
    assert f"{UNIT} failed its gate: gpu tier: " in run.output
    assert "last 30 journal lines:" in run.output
    first = unit_show(clean_lab, host)
    time.sleep(3)
    second = unit_show(clean_lab, host)
    assert first["ActiveState"] == second["ActiveState"] == "active"
    assert first["MainPID"] == second["MainPID"] and second["NRestarts"] == "0"
    assert clean_lab.exec(host, f"test -e {KNOWN_GOOD}/current").returncode != 0, run.output
    assert json.loads(sh(clean_lab, host, f"python3 {HOST_LOCK} status --path {LOCK}"))["held"] is False


def test_crash_on_load_ends_failed_within_the_start_limit(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    run = run_play(
        clean_lab, tmp_path, host, ROLE_PLAY, {"sglang_service_environment": {"SGLANG_SIM_FAULTS": "crash-on-load"}}
    )
    assert not run.ok
    assert f"{UNIT} failed its gate: unit tier: " in run.output
    assert "StartLimitBurst=3 starts within StartLimitIntervalSec=" in run.output
    wait_until(lambda: unit_show(clean_lab, host)["ActiveState"] == "failed", 60, "the unit to end in failed")
    state = unit_show(clean_lab, host)
    assert int(state["NRestarts"]) <= 3
    assert "Start request repeated too quickly" in sh(clean_lab, host, f"journalctl -u {UNIT} --no-pager -n 50")
    time.sleep(3)
    assert unit_show(clean_lab, host) == state


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"sglang_service_tp_size": 0}, "sglang_service_tp_size must be an integer >= 1; got 0"),
        (
            {"sglang_service_speculative_algorithm": "EAGLE", "sglang_service_speculative_num_steps": -1},
            "sglang_service_speculative_num_steps must be null or an integer >= 1; got -1",
        ),
        (
            {"sglang_service_speculative_algorithm": "MEDUSA"},
            "sglang_service_speculative_algorithm must be empty (no speculative decoding) or one of EAGLE, EAGLE3, "
            "NEXTN, STANDALONE, NGRAM, DFLASH, UNO, DSPARK, FROZEN_KV_MTP (the list in "
            'sglang_service_speculative_algorithms); got \\"MEDUSA\\"',
        ),
        ({"sglang_service_port": 70000}, "sglang_service_port must be an integer from 1 to 65535; got 70000"),
    ],
    ids=["tp-0", "steps-negative", "unknown-algorithm", "port-70000"],
)
def test_bad_variables_fail_in_preflight_and_leave_the_host_unchanged(clean_lab, tmp_path, bad, message):
    host = clean_lab.hosts[0]
    before = fingerprint(clean_lab, host)
    run = run_play(clean_lab, tmp_path, host, ROLE_PLAY, bad)
    assert not run.ok
    assert message in run.output
    assert fingerprint(clean_lab, host) == before


def test_second_run_fails_naming_the_holder_of_the_host_lock(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    helper = (REPO / "roles/sglang_service/files/host_lock.py").read_text()
    sh(clean_lab, host, f"mkdir -p {Path(HOST_LOCK).parent} && cat > {HOST_LOCK} <<'PYEOF'\n{helper}PYEOF")
    owner = json.dumps({"controller": "other-controller", "play": "deploy"})
    sh(
        clean_lab,
        host,
        f"python3 {HOST_LOCK} acquire --path {LOCK} --timeout 1 --lease 120 --owner {shlex.quote(owner)}",
    )

    run = run_play(clean_lab, tmp_path, host, ROLE_PLAY, {"sglang_service_lock_timeout": 2})
    assert not run.ok
    assert f"{LOCK} is held by controller=other-controller, play=deploy" in run.output
    assert "gave up after waiting 2.0 s" in run.output
    assert clean_lab.exec(host, f"test -e /etc/systemd/system/{UNIT}").returncode != 0
    sh(clean_lab, host, f"python3 {HOST_LOCK} break --path {LOCK}")


def test_speculative_dropin_then_restore_through_the_restart_topic(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    assert run_play(clean_lab, tmp_path, host, ROLE_PLAY, label="base").ok
    base_unit = sh(clean_lab, host, f"sha256sum /etc/systemd/system/{UNIT}")

    point = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    dropin = run_play(clean_lab, tmp_path, host, DROPIN_PLAY, {"sglang_service_speculative_point": point}, "dropin")
    assert dropin.ok, dropin.output
    gate = dropin.gate()
    assert gate["healthy"] is True
    assert gate["speculative"]["num_steps"] == 3 and gate["speculative"]["num_draft_tokens"] == 4
    assert sh(clean_lab, host, f"sha256sum /etc/systemd/system/{UNIT}") == base_unit
    conf = sh(clean_lab, host, f"cat /etc/systemd/system/{UNIT}.d/50-speculative.conf")
    assert "ExecStart=\nExecStart=" in conf and "--speculative-num-steps 3" in conf
    current = json.loads(sh(clean_lab, host, f"cat {KNOWN_GOOD}/current/manifest.json"))
    previous = json.loads(sh(clean_lab, host, f"cat {KNOWN_GOOD}/previous/manifest.json"))
    assert "dropins/50-speculative.conf" in current["files"]
    assert "dropins/50-speculative.conf" not in previous["files"]

    restore = run_play(clean_lab, tmp_path, host, RESTORE_PLAY, {"sglang_service_restore_from": "previous"}, "restore")
    assert restore.ok, restore.output
    assert restore.gate()["healthy"] is True
    assert restore.gate()["speculative"]["num_steps"] is None
    assert clean_lab.exec(host, f"test -e /etc/systemd/system/{UNIT}.d/50-speculative.conf").returncode != 0
    assert json.loads(sh(clean_lab, host, f"python3 {HOST_LOCK} status --path {LOCK}"))["held"] is False
