"""The sglang_service role on real systemd with the simulated engine.

Every test applies the role through a play in tests/e2e/playbooks/, with the lab's inventory variables (the
simulated engine's module and the venv's Python) passed as extra vars. A restart loop of a unit as found on real
hosts (orphaned schedulers) and a model that never loads are the molecule scenario sglang_service_failures'.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from labutil import (
    SERVICE_LAB_VARS,
    argv_of,
    environ_of,
    fingerprint,
    lock_held,
    restore_known_good,
    run_play,
    sh,
    unit_show,
    wait_until,
)

pytestmark = pytest.mark.lab

LAB_VARS = SERVICE_LAB_VARS
NAME = LAB_VARS["sglang_service_name"]
UNIT = f"{NAME}.service"
VENV_PYTHON = LAB_VARS["sglang_service_python"]
KNOWN_GOOD = f"/var/lib/llmops/known-good/{NAME}"
LOCK = f"/run/lock/llmops-{NAME}.lock"
CONFIG = f"/etc/llmops/{NAME}.yaml"

TRICKY_NAME = "a b%c$d\"e'f\\g"
TRICKY_ENV = "x y$HOME \"q\" 'r' `b` \\ #z %n"
API_KEY = "s3cret key$1"

WATCHED = f"/etc/systemd/system /etc/llmops /usr/local/libexec/llmops /usr/local/lib/llmops /var/lib/llmops {LOCK}"


def show(lab, host: str) -> dict:
    return unit_show(lab, host, UNIT)


def test_fresh_host_serves_quoted_arguments_and_a_rerun_changes_nothing(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    settings = {
        "sglang_service_served_model_name": TRICKY_NAME,
        "sglang_service_environment": {"LLMOPS_TEST_VALUE": TRICKY_ENV},
        "sglang_service_api_key": API_KEY,
    }
    first = run_play(clean_lab, tmp_path, host, "service_role", settings, "first")
    assert first.ok, first.output
    gate = first.gate()
    assert gate["healthy"] is True, gate
    assert {"0", "1"} <= set(gate["gpu"]["memory_mib"])  # the unit's GPUs, among all the host has

    unit = sh(clean_lab, host, f"cat /etc/systemd/system/{UNIT}")
    for line in (
        "KillMode=control-group",
        # drain 5 s + SGLang's drain check 5 s + scheduler exit 2 s + shutdown tail 10 s + margin 10 s
        "TimeoutStopSec=32",
        "Restart=on-failure",
        "StartLimitBurst=3",
        f"EnvironmentFile=/etc/llmops/{NAME}.env",
        f"--config {CONFIG}",
        'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID" "CUDA_VISIBLE_DEVICES=0,1"',
        "--pid ${MAINPID}",
    ):
        assert line in unit
    assert "ExecStartPre=" in unit and "gpu-free --gpus 0,1" in unit
    assert "ExecStartPost=" in unit and "ready --url http://127.0.0.1:30000/health" in unit
    assert "ExecStop=" in unit and "drain --url http://127.0.0.1:30000 --timeout 5 --tail 17" in unit
    assert "s3cret" not in unit
    assert sh(clean_lab, host, f"stat -c %a /etc/llmops/{NAME}.env").strip() == "600"
    # The key reaches the engine through the --config file, byte for byte, and never its command line.
    assert sh(clean_lab, host, f"stat -c '%a %U' {CONFIG}").strip() == "600 root"
    assert yaml.safe_load(sh(clean_lab, host, f"cat {CONFIG}")) == {"api-key": API_KEY}

    pid = int(show(clean_lab, host)["MainPID"])
    argv = argv_of(clean_lab, host, pid)
    assert argv[argv.index("--served-model-name") + 1] == TRICKY_NAME
    assert argv[argv.index("--config") + 1] == CONFIG
    assert "s3cret" not in " ".join(argv)
    environ = environ_of(clean_lab, host, pid)
    assert environ["LLMOPS_TEST_VALUE"] == TRICKY_ENV
    assert environ["PATH"].startswith("/opt/sglang/venv/bin:")
    assert environ["CUDA_VISIBLE_DEVICES"] == "0,1"

    manifest = json.loads(sh(clean_lab, host, f"cat {KNOWN_GOOD}/current/manifest.json"))
    assert set(manifest["files"]) == {"unit", "environment", "config"}
    live_sum = sh(clean_lab, host, f"sha256sum /etc/systemd/system/{UNIT}").split()[0]
    assert manifest["files"]["unit"]["sha256"] == live_sum
    assert manifest["patch_state_id"] == "unknown"
    assert sh(clean_lab, host, f"stat -c %a {KNOWN_GOOD}").strip() == "700"
    assert lock_held(clean_lab, host, LOCK) is False

    second = run_play(clean_lab, tmp_path, host, "service_role", settings, "second")
    assert second.ok, second.output
    assert second.changed(host) == 0, second.output
    assert second.gate() == {}
    after = show(clean_lab, host)
    assert int(after["MainPID"]) == pid
    assert after["NRestarts"] == "0"

    # --tags sglang_service_restart: the restart chain runs (a new engine, through the gate), nothing else changes.
    files = f"/etc/systemd/system/{UNIT} /etc/llmops/{NAME}.env {CONFIG}"
    written = sh(clean_lab, host, f"stat -c '%n %Y %s' {files}; sha256sum {files}")
    forced = run_play(clean_lab, tmp_path, host, "service_role", settings, "forced", tags="sglang_service_restart")
    assert forced.ok, forced.output
    # The fact sglang_service_gate comes from the chain's module alone.
    assert forced.gate()["healthy"] is True, forced.gate()
    # Two changes: the request for the restart and the chain it notified.
    assert forced.changed(host) == 2, forced.output
    assert sh(clean_lab, host, f"stat -c '%n %Y %s' {files}; sha256sum {files}") == written
    forced_pid = int(show(clean_lab, host)["MainPID"])
    assert forced_pid not in (0, pid), (pid, forced_pid)
    assert show(clean_lab, host)["NRestarts"] == "0"  # systemd did not restart it on its own: the chain did
    pid = forced_pid

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


def test_crash_on_load_ends_failed_within_the_start_limit(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    run = run_play(
        clean_lab,
        tmp_path,
        host,
        "service_role",
        {"sglang_service_environment": {"SGLANG_SIM_FAULTS": "crash-on-load"}},
    )
    assert not run.ok
    assert f"{UNIT} failed its gate: unit tier: " in run.output
    assert "StartLimitBurst=3 starts within StartLimitIntervalSec=" in run.output
    wait_until(lambda: show(clean_lab, host)["ActiveState"] == "failed", 60, "the unit to end in failed")
    state = show(clean_lab, host)
    assert int(state["NRestarts"]) <= 3
    assert "Start request repeated too quickly" in sh(clean_lab, host, f"journalctl -u {UNIT} --no-pager -n 50")
    # Ended by the start limit: systemd starts the unit no more (no restart job is pending, whatever the wait).
    assert sh(clean_lab, host, f"systemctl list-jobs --no-legend {UNIT}").strip() == "", state


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
    before = fingerprint(clean_lab, host, WATCHED)
    run = run_play(clean_lab, tmp_path, host, "service_role", bad)
    assert not run.ok
    assert message in run.output
    assert fingerprint(clean_lab, host, WATCHED) == before


def test_second_run_fails_naming_the_holder_of_the_host_lock(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    owner = {"controller": "other-controller", "play": "deploy"}
    # Taken by ad-hoc ansible, whose run ends at once: a lock nobody renews, held for its period plus margin.
    held = {"path": LOCK, "owner": owner, "keep": False, "renew_margin": 300}
    taken = clean_lab.module(host, "llmops.inference.host_lock", held)
    assert taken["token"], taken

    run = run_play(clean_lab, tmp_path, host, "service_role", {"sglang_service_lock_timeout": 2})
    assert not run.ok
    assert f"{LOCK} is held by controller=other-controller, play=deploy" in run.output
    # The wait it reports is the one measured: 2.0 s, or a tenth more when the machine is loaded.
    waited = re.search(r"gave up after waiting (\d+\.\d) s", run.output)
    assert waited and 2.0 <= float(waited.group(1)) < 10, run.output[-3000:]
    assert clean_lab.exec(host, f"test -e /etc/systemd/system/{UNIT}").returncode != 0
    broken = clean_lab.module(host, "llmops.inference.host_lock", {"path": LOCK, "state": "absent", "force": True})
    assert broken["changed"] is True and broken["broken"]["owner"] == owner


def test_speculative_dropin_then_restore_through_the_restart_topic(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    assert run_play(clean_lab, tmp_path, host, "service_role", label="base").ok
    base_unit = sh(clean_lab, host, f"sha256sum /etc/systemd/system/{UNIT}")

    point = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    dropin = run_play(
        clean_lab, tmp_path, host, "service_dropin", {"sglang_service_speculative_point": point}, "dropin"
    )
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

    restored = restore_known_good(clean_lab, host, KNOWN_GOOD, "previous", f"/etc/systemd/system/{UNIT}.d")
    assert restored["removed"] == [f"/etc/systemd/system/{UNIT}.d/50-speculative.conf"]
    restore = run_play(clean_lab, tmp_path, host, "service_topic_restart", label="restore")
    assert restore.ok, restore.output
    assert restore.gate()["healthy"] is True
    assert restore.gate()["speculative"]["num_steps"] is None
    assert clean_lab.exec(host, f"test -e /etc/systemd/system/{UNIT}.d/50-speculative.conf").returncode != 0
    assert lock_held(clean_lab, host, LOCK) is False
