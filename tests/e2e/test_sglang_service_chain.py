"""The restart chain and the unit on lab hosts: the stability window, the recovery of a model that did not load,
secrets (never in ps, redacted at -vvv), unit-file injection, the interpreter preflight, check mode. The drain of
requests in flight during a restart is test_stop_drain.py's."""

from __future__ import annotations

import re

import pytest
from labutil import (
    SERVICE_LAB_VARS,
    environ_of,
    fingerprint,
    install_test_engine,
    lock_held,
    role_default,
    run_play,
    sh,
    unit_show,
    wait_until,
)

pytestmark = pytest.mark.lab

NAME = SERVICE_LAB_VARS["sglang_service_name"]
UNIT = f"{NAME}.service"
KNOWN_GOOD = f"/var/lib/llmops/known-good/{NAME}"
LOCK = f"/run/lock/llmops-{NAME}.lock"
WATCHED = f"/etc/systemd/system /etc/llmops /usr/local/libexec/llmops /usr/local/lib/llmops /var/lib/llmops {LOCK}"
KEY = "lab-k3y-9f2c7a"


def settled_state(lab, host: str) -> dict | None:
    """The unit's properties once systemd has finished stopping it, else None."""
    state = unit_show(lab, host, UNIT)
    return None if state["ActiveState"] == "deactivating" else state


def test_an_engine_that_exits_0_right_after_it_became_ready_fails_the_gate_and_gets_no_snapshot(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    install_test_engine(clean_lab, host)
    run = run_play(
        clean_lab,
        tmp_path,
        host,
        "service_role",
        {
            "sglang_service_launch_module": "llmops_test_engine",
            "sglang_service_environment": {"LLMOPS_TEST_EXIT_AFTER_READY": "3"},
            # The role's own window (5 s) refuses an engine that exits 3 s after it became ready.
            "sglang_service_probe_stability_window": role_default("sglang_service_probe_stability_window"),
        },
    )
    assert not run.ok
    assert f"{UNIT} failed its gate: unit tier: unit {UNIT} is " in run.output
    assert "(exited 0): its main process exited with status 0" in run.output
    assert "within the stability window" in run.output
    assert clean_lab.exec(host, f"test -e {KNOWN_GOOD}/current").returncode != 0
    # systemd may still be stopping what is left of the unit's group (the engine under the exited wrapper drains).
    state = wait_until(lambda: settled_state(clean_lab, host), 30, f"{UNIT} to finish stopping", interval=0.2)
    assert state["ActiveState"] == "inactive" and state["Result"] == "success"


def test_a_model_that_did_not_load_once_is_recovered_by_the_chain(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    install_test_engine(clean_lab, host)
    sh(clean_lab, host, "rm -f /run/llmops-test-never-load-once")
    run = run_play(
        clean_lab,
        tmp_path,
        host,
        "service_role",
        {
            "sglang_service_launch_module": "llmops_test_engine",
            "sglang_service_environment": {"LLMOPS_TEST_NEVER_LOAD_ONCE": "/run/llmops-test-never-load-once"},
        },
    )
    assert run.ok, run.output
    gate = run.gate()
    assert gate["healthy"] is True
    assert gate["gate"]["attempts"] == 2
    assert gate["gate"]["per_attempt"][0]["failed_tier"] == "gpu"
    assert clean_lab.exec(host, f"test -e {KNOWN_GOOD}/current").returncode == 0


def test_the_api_key_is_never_in_ps_and_its_file_is_private(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    run = run_play(clean_lab, tmp_path, host, "service_role", {"sglang_service_api_key": KEY})
    assert run.ok, run.output
    assert KEY not in sh(clean_lab, host, "ps -eo pid,args ww")
    assert KEY not in sh(clean_lab, host, f"systemctl cat {UNIT}; systemctl show {UNIT}")
    assert sh(clean_lab, host, f"stat -c '%a %U %G' /etc/llmops/{NAME}.yaml").strip() == "600 root root"
    assert KEY not in run.output


def test_a_service_user_gets_a_home_and_a_writable_sglang_cache(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    # The simulated GPUs' claims stand for /dev/nvidia*, which every user may open on a real host.
    sh(clean_lab, host, "chmod 1777 /var/lib/simgpu/claims")
    user = {"sglang_service_user": "sglang-t", "sglang_service_group": "sglang-t", "sglang_service_api_key": KEY}
    run = run_play(clean_lab, tmp_path, host, "service_role", user)
    assert run.ok, run.output
    assert run.gate()["healthy"] is True
    home = sh(clean_lab, host, "getent passwd sglang-t | cut -d: -f6").strip()
    assert home == f"/var/lib/{NAME}"
    pid = int(unit_show(clean_lab, host, UNIT)["MainPID"])
    assert sh(clean_lab, host, f"stat -c %U /proc/{pid}").strip() == "sglang-t"
    assert environ_of(clean_lab, host, pid)["HOME"] == home
    sh(clean_lab, host, f"runuser -u sglang-t -- sh -c 'test -w {home} && touch {home}/.cache/sglang/probe'")
    assert sh(clean_lab, host, f"stat -c '%a %U %G' /etc/llmops/{NAME}.yaml").strip() == "600 sglang-t sglang-t"
    second = run_play(clean_lab, tmp_path, host, "service_role", user, "second")
    assert second.ok and second.changed(host) == 0, second.output


def test_a_key_the_engine_logs_is_redacted_from_the_failure_even_at_vvv(clean_lab, tmp_path):
    """The engine crashes while loading and logs its arguments first (server_args={..., 'api_key': '...'},
    as SGLang does); the failure carries the journal's tail. The key must not appear anywhere in the play's output."""
    host = clean_lab.hosts[0]
    install_test_engine(clean_lab, host)
    settings = {
        "sglang_service_api_key": KEY,
        # The engine reads the key from its --config file and logs it, as SGLang does.
        "sglang_service_launch_module": "llmops_test_engine",
        "sglang_service_environment": {"SGLANG_SIM_FAULTS": "crash-on-load", "LLMOPS_TEST_CONFIG_TO_ARGS": "1"},
        # Without the log filter the key reaches the journal (systemd 252 has no LogFilterPatterns=).
        "sglang_service_log_filter": False,
    }
    run = run_play(clean_lab, tmp_path, host, "service_role", settings, verbosity=3)
    assert not run.ok
    assert "WARNING: sglang_service_log_filter is false and systemd on" in run.output
    assert "last 30 journal lines:" in run.output
    # SGLang 0.5.23 logs server_args as a dict (srt/entrypoints/engine.py), and so does the lab's engine.
    assert "'api_key': '********'" in run.output
    assert KEY in sh(clean_lab, host, f"journalctl -u {UNIT} --no-pager -n 200"), "the engine did not log its key"
    hits = [line for line in run.output.splitlines() if KEY in line]
    assert hits == [], hits


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("sglang_service_description", "SGLang\nExecStartPre=/bin/touch /tmp/injected"),
        ("sglang_service_working_directory", "/\nExecStartPre=/bin/touch /tmp/injected"),
    ],
)
def test_a_line_break_in_a_unit_value_fails_naming_the_variable_and_changes_nothing(
    clean_lab, tmp_path, variable, value
):
    host = clean_lab.hosts[0]
    before = fingerprint(clean_lab, host, WATCHED)
    run = run_play(clean_lab, tmp_path, host, "service_role", {variable: value})
    assert not run.ok
    # Ansible prints the message inside JSON at times, with its backslash doubled.
    assert re.search(rf"{variable}: a line break \(\\+n\) at character \d+ is not allowed", run.output), run.output
    assert fingerprint(clean_lab, host, WATCHED) == before
    assert clean_lab.exec(host, "test -e /tmp/injected").returncode != 0


OLD_PYTHON = """\
#!/opt/sglang/venv/bin/python
# A Python that reports 3.10.12, for the preflight test (the lab image has only 3.11).
import sys
sys.version_info = (3, 10, 12, "final", 0)
code = sys.argv[sys.argv.index("-c") + 1]
sys.argv = ["-c"] + sys.argv[sys.argv.index("-c") + 2 :]
exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
"""


@pytest.mark.parametrize(
    ("python", "message"),
    [
        (
            "/opt/fakepy/bin/python",
            "sglang_service_python /opt/fakepy/bin/python is Python 3.10.12; sglang needs Python >= 3.11",
        ),
        ("/opt/nosglang/bin/python", "sglang_service_python /opt/nosglang/bin/python cannot run SGLang: "),
    ],
    ids=["python-3.10", "no-sglang"],
)
def test_an_interpreter_that_cannot_run_sglang_is_refused_before_anything_changes(clean_lab, tmp_path, python, message):
    host = clean_lab.hosts[0]
    sh(
        clean_lab,
        host,
        f"mkdir -p /opt/fakepy/bin && cat > /opt/fakepy/bin/python <<'PYEOF'\n{OLD_PYTHON}PYEOF\n"
        "chmod 755 /opt/fakepy/bin/python; python3 -m venv --without-pip /opt/nosglang",
    )
    before = fingerprint(clean_lab, host, WATCHED)
    run = run_play(clean_lab, tmp_path, host, "service_role", {"sglang_service_python": python})
    assert not run.ok
    assert message in run.output
    assert fingerprint(clean_lab, host, WATCHED) == before


def test_a_wrong_sglang_version_is_refused(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    before = fingerprint(clean_lab, host, WATCHED)
    run = run_play(clean_lab, tmp_path, host, "service_role", {"sglang_service_version": "0.4.0"})
    assert not run.ok
    assert "has sglang 0.5.23, but version 0.4.0 is required" in run.output
    assert fingerprint(clean_lab, host, WATCHED) == before


def test_check_mode_reports_the_restart_plan_and_changes_nothing(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    assert run_play(clean_lab, tmp_path, host, "service_role", label="up").ok
    pid = unit_show(clean_lab, host, UNIT)["MainPID"]
    before = fingerprint(clean_lab, host, WATCHED)
    run = run_play(clean_lab, tmp_path, host, "service_restart", label="check", check=True, diff=True)
    assert run.ok, run.output
    gate = run.gate()
    assert gate["plan"]["stop"]["mode"] == "drain"
    assert gate["plan"]["start"] == f"systemctl start --no-block {UNIT}"
    assert "MainPID=(new)" in run.output
    assert unit_show(clean_lab, host, UNIT)["MainPID"] == pid
    assert fingerprint(clean_lab, host, WATCHED) == before
    assert lock_held(clean_lab, host, LOCK) is False


def test_gpu_memory_that_cannot_be_freed_stops_the_chain_before_the_start(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    assert run_play(clean_lab, tmp_path, host, "service_role", label="up").ok
    sh(clean_lab, host, f"systemctl stop {UNIT}")
    # 8000 MiB on GPU 1 that no live process holds (the driver still counts a gone holder's memory).
    sh(clean_lab, host, "simgpu-claim --stuck --gpu 1 --mib 8000")
    run = run_play(clean_lab, tmp_path, host, "service_restart", label="restart")
    assert not run.ok
    assert f"{UNIT} restart chain failed at reap: GPU 1 needs a reset or a reboot" in run.output
    state = unit_show(clean_lab, host, UNIT)
    assert state["ActiveState"] in ("inactive", "failed") and state["MainPID"] == "0"


# Left by a server started by hand whose shell is gone: outside every unit, below the GPU-free gate's threshold, so
# only the chain's reap of orphans ends it (an unclean stop, as the chain sees it).
ORPHAN = (
    "setsid bash -c 'exec -a sglang::scheduler_TP1 python3 /usr/local/bin/simgpu-claim --hold --gpu 1 --mib 512' "
    "</dev/null >/dev/null 2>&1 & echo $!"
)


def test_a_restart_that_reaps_leftover_holders_soaks_the_new_engine(clean_lab, tmp_path):
    host = clean_lab.hosts[0]
    first = run_play(clean_lab, tmp_path, host, "service_role", label="first")
    assert first.ok, first.output
    assert first.gate()["gate"]["soak"] == 0
    orphan = int(sh(clean_lab, host, ORPHAN))
    wait_until(
        lambda: str(orphan) in sh(clean_lab, host, "nvidia-smi --query-compute-apps=pid --format=csv,noheader"),
        10,
        f"the orphan {orphan} to hold GPU memory",
        interval=0.2,
    )

    run = run_play(clean_lab, tmp_path, host, "service_role", {"sglang_service_served_model_name": "soaked"}, "second")

    assert run.ok, run.output
    gate = run.gate()
    assert orphan in [entry["pid"] for entry in gate["gpu"]["reaped"]], gate["gpu"]
    assert gate["gate"]["soak"] == 3  # sglang_service_probe_soak's default
    soak = next(tier for tier in gate["gate"]["tiers"] if tier["name"] == "soak")
    assert soak["status"] == "ok" and soak["reason"].startswith("3 requests"), soak
    # On the engine: the gate's generation and the soak's three, as the new engine's access log has them.
    invocation = sh(clean_lab, host, f"systemctl show -P InvocationID {UNIT}").strip()
    access = sh(clean_lab, host, f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    assert len(re.findall(r'"POST /generate HTTP/1\.1" 200', access)) == 1 + 3, access[-3000:]
