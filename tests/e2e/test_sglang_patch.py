"""The sglang_patch role on lab hosts, against the real sglang 0.5.23 sources in /opt/sglang/venv.

Each test leaves the sources pristine (restored in ``finally``): the lab reset removes the backups but
not the patched files.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from labutil import SERVICE_LAB_VARS, sh

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests" / "e2e" / "playbooks" / "sglang_patch.yml"
PATCH_AND_SERVICE = REPO / "tests" / "e2e" / "playbooks" / "sglang_patch_service.yml"
EXAMPLE = REPO / "docs" / "patches" / "eagle_lab" / "0001-register-llmops-demo-algorithm.diff"
FILES = REPO / "tests" / "e2e" / "files" / "sglang_patch"
PYTHON = "/opt/sglang/venv/bin/python"
BACKUPS = "/var/lib/llmops/sglang-backups"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SPEC_REGISTRY = "sglang/srt/speculative/spec_registry.py"
SAMPLER = "sglang/srt/layers/sampler.py"
EAGLE_LAB = {"sglang_patch_set_name": "eagle_lab", "sglang_patch_files": [str(EXAMPLE)]}

# Start the simulated server with a speculative algorithm; print its log once it listens or exits.
SIM_START = """
# The venv's bin/ on PATH, as the role's unit has it: the engine compiles its kernels with the venv's ninja.
export PATH=/opt/sglang/venv/bin:$PATH
log=$(mktemp)
{python} -m sglang_sim.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --port 30555 \\
  --speculative-algorithm {algorithm} --speculative-num-steps 2 --speculative-eagle-topk 1 \\
  --speculative-num-draft-tokens 3 --sim-load-time 0 --sim-warmup-time 0 --skip-server-warmup >"$log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q 'Uvicorn running' "$log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -TERM "$pid" 2>/dev/null
wait "$pid"
cat "$log"
"""


def run_role(lab, host, tmp_path, extra: dict, check=False, diff=False, playbook=PLAYBOOK):
    """Run the role on one host; returns (CompletedProcess, the role's facts or None when it failed)."""
    out = tmp_path / "facts"
    out.mkdir(exist_ok=True)
    (out / f"{host}.json").unlink(missing_ok=True)
    extra_vars = {"sglang_patch_python": PYTHON, "sglang_patch_test_result_dir": str(out), **extra}
    proc = lab.playbook(playbook, extra_vars, check=check, diff=diff, limit=host)
    facts_file = out / f"{host}.json"
    return proc, json.loads(facts_file.read_text()) if facts_file.exists() else None


def recap(proc, host) -> dict:
    match = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", proc.stdout, re.MULTILINE)
    assert match, f"no PLAY RECAP for {host}:\n{proc.stdout}\n{proc.stderr}"
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def succeeded(proc, host, facts) -> dict:
    assert proc.returncode == 0 and facts is not None, f"rc={proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr}"
    assert recap(proc, host)["failed"] == 0
    return facts


def failed_with(proc, host, *fragments):
    assert proc.returncode != 0 and recap(proc, host)["failed"] == 1, proc.stdout[-4000:]
    for fragment in fragments:
        assert fragment in proc.stdout, f"{fragment!r} not in the output:\n{proc.stdout[-4000:]}"


def verify(lab, host) -> dict:
    result = lab.module(host, "llmops.inference.source_patch", {"python": PYTHON, "state": "verified"})
    assert result["_status"] == "SUCCESS", result
    return result


def sim_log(lab, host, algorithm) -> str:
    proc = lab.exec(host, SIM_START.format(python=PYTHON, algorithm=shlex.quote(algorithm)), timeout=120)
    return proc.stdout + proc.stderr


def restore_pristine(lab, host):
    lab.module(
        host, "llmops.inference.source_patch", {"python": PYTHON, "state": "restored", "target_state_id": "pristine"}
    )


def assert_pristine(lab, host):
    report = verify(lab, host)
    assert report["verify"]["pristine"], report["verify"]
    assert report["verify"]["checked"] > 1000 and report["state_id"] == "pristine"


def test_apply_makes_the_sim_accept_the_new_algorithm_and_restore_brings_the_wheel_back(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    try:
        assert_pristine(lab, host)
        assert "Unknown speculative algorithm name: LLMOPS_DEMO" in sim_log(lab, host, "LLMOPS_DEMO")

        proc, facts = run_role(lab, host, tmp_path, EAGLE_LAB, check=True, diff=True)
        assert succeeded(proc, host, facts)["changed"] is True
        assert "+    LLMOPS_DEMO = auto()" in proc.stdout
        assert_pristine(lab, host)
        assert lab.exec(host, f"test -e {BACKUPS} || echo absent").stdout.strip() == "absent"

        proc, facts = run_role(lab, host, tmp_path, EAGLE_LAB)
        applied = succeeded(proc, host, facts)
        assert applied["changed"] is True and applied["state_id"] not in ("pristine", "modified")
        assert applied["version"] == "0.5.23" and applied["result"]["files"] == [SPEC_INFO]
        assert "Report that SGLang must restart" in proc.stdout
        assert verify(lab, host)["verify"]["modified"] == [SPEC_INFO]
        mode = lab.exec(host, f"stat -c %a {BACKUPS}/{applied['backup_id']}").stdout.strip()
        assert mode == "700"

        proc, facts = run_role(lab, host, tmp_path, EAGLE_LAB)
        again = succeeded(proc, host, facts)
        assert again["changed"] is False and again["state_id"] == applied["state_id"]
        assert recap(proc, host)["changed"] == 0

        log = sim_log(lab, host, "LLMOPS_DEMO")
        assert "Uvicorn running" in log and "'speculative_algorithm': 'LLMOPS_DEMO'" in log, log

        proc, facts = run_role(lab, host, tmp_path, {"sglang_patch_state": "restored"})
        restored = succeeded(proc, host, facts)
        assert restored["changed"] is True and restored["state_id"] == "pristine"
        proc, facts = run_role(
            lab, host, tmp_path, {"sglang_patch_state": "verified", "sglang_patch_verify_require_pristine": True}
        )
        assert succeeded(proc, host, facts)["result"]["verify"]["pristine"] is True
        assert "Unknown speculative algorithm name: LLMOPS_DEMO" in sim_log(lab, host, "LLMOPS_DEMO")
    finally:
        restore_pristine(lab, host)


def test_an_interrupted_apply_is_rolled_back_by_the_next_run(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    two_files = {
        "sglang_patch_set_name": "eagle_lab",
        "sglang_patch_files": [str(EXAMPLE), str(FILES / "0002-spec-registry-comment.diff")],
    }
    try:
        proc, facts = run_role(lab, host, tmp_path, two_files)
        backup = succeeded(proc, host, facts)["backup_id"]
        # What a kill between the two files leaves: the manifest still pending, the first file patched,
        # the second one original, and a temporary file of the interrupted write.
        site = verify(lab, host)["sglang"]["base_dir"]
        lab.exec(
            host,
            f"""set -e
            cd {BACKUPS}/{backup}
            {PYTHON} -c 'import json; m = json.load(open("manifest.json")); m["state"] = "pending"; \
json.dump(m, open("manifest.json", "w"))'
            cp files/{SPEC_REGISTRY} {site}/{SPEC_REGISTRY}
            echo half > {site}/sglang/srt/speculative/.spec_registry.py.x1y2.llmops-tmp
        """,
            check=True,
        )
        assert verify(lab, host)["state_id"] == "interrupted"

        proc, facts = run_role(lab, host, tmp_path, two_files)
        recovered = succeeded(proc, host, facts)
        assert recovered["changed"] is True
        assert [r["backup_id"] for r in recovered["result"]["recovered"]] == [backup]
        assert sorted(verify(lab, host)["verify"]["modified"]) == [SPEC_INFO, SPEC_REGISTRY]
        assert lab.exec(host, f"ls -a {site}/sglang/srt/speculative | grep -c llmops-tmp").stdout.strip() == "0"

        proc, facts = run_role(lab, host, tmp_path, {"sglang_patch_state": "restored"})
        assert succeeded(proc, host, facts)["state_id"] == "pristine"
        assert_pristine(lab, host)
    finally:
        restore_pristine(lab, host)


def test_bad_input_is_refused_with_a_clear_error_and_nothing_changes(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    try:
        proc = run_role(lab, host, tmp_path, {"sglang_patch_set_name": "x", "sglang_patch_files": ["nope.diff"]})[0]
        failed_with(proc, host, "not found on the controller: nope.diff")

        proc = run_role(
            lab,
            host,
            tmp_path,
            {"sglang_patch_set_name": "stale", "sglang_patch_files": [str(FILES / "stale-context.diff")]},
        )[0]
        failed_with(
            proc, host, "patch stale-context.diff: hunk #1", f"does not apply to {SPEC_INFO}", "nothing was changed"
        )

        proc = run_role(
            lab,
            host,
            tmp_path,
            {"sglang_patch_set_name": "escape", "sglang_patch_files": [str(FILES / "path-escape.diff")]},
        )[0]
        failed_with(proc, host, "paths containing '..' are refused")
        assert lab.exec(host, "test -e /etc/llmops-escape.py || echo absent").stdout.strip() == "absent"

        proc = run_role(lab, host, tmp_path, {**EAGLE_LAB, "sglang_patch_python": "/usr/bin/python3"})[0]
        failed_with(proc, host, "python /usr/bin/python3", "cannot import 'sglang'")

        proc = run_role(
            lab,
            host,
            tmp_path,
            {"sglang_patch_state": "restored", "sglang_patch_restore_backup_id": "20990101T000000Z-nope"},
        )[0]
        failed_with(proc, host, "backup id '20990101T000000Z-nope' not found")

        assert_pristine(lab, host)
        backups = lab.exec(host, f"ls {BACKUPS} 2>/dev/null").stdout.split()
        assert backups == [], backups
    finally:
        restore_pristine(lab, host)


def test_a_patch_that_does_not_compile_is_refused_unless_compile_check_is_warn(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    broken = {"sglang_patch_set_name": "broken", "sglang_patch_files": [str(FILES / "broken-syntax.diff")]}
    try:
        proc = run_role(lab, host, tmp_path, broken)[0]
        failed_with(proc, host, f"do not compile: {SPEC_INFO}: SyntaxError at line 48", "compile_check=warn")
        assert_pristine(lab, host)

        # Failure 3's first half: with compile_check=warn the broken module reaches the server, whose load crashes.
        proc, facts = run_role(lab, host, tmp_path, {**broken, "sglang_patch_compile_check": "warn"})
        installed = succeeded(proc, host, facts)
        assert installed["changed"] is True and SPEC_INFO in installed["result"]["compile_errors"]
        log = sim_log(lab, host, "EAGLE")
        assert "SyntaxError" in log and "Uvicorn running" not in log, log

        proc, facts = run_role(lab, host, tmp_path, {"sglang_patch_state": "restored"})
        assert succeeded(proc, host, facts)["state_id"] == "pristine"
        assert "Uvicorn running" in sim_log(lab, host, "EAGLE")
    finally:
        restore_pristine(lab, host)


def test_a_patch_that_makes_the_output_degenerate_fails_the_gate_until_restored_and_restarted(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    unit = f"{SERVICE_LAB_VARS['sglang_service_name']}.service"
    known_good = f"/var/lib/llmops/known-good/{SERVICE_LAB_VARS['sglang_service_name']}/current/manifest.json"
    degenerate = {"sglang_patch_set_name": "degenerate", "sglang_patch_files": [str(FILES / "degenerate-sampler.diff")]}

    def both_roles(extra):
        return run_role(lab, host, tmp_path, {**SERVICE_LAB_VARS, **extra}, playbook=PATCH_AND_SERVICE)

    def main_pid() -> int:
        return int(sh(lab, host, f"systemctl show -p MainPID --value {unit}"))

    try:
        proc, facts = both_roles({"sglang_patch_state": "verified", "sglang_patch_verify_require_pristine": True})
        assert succeeded(proc, host, facts)["gate"]["healthy"] is True
        assert json.loads(sh(lab, host, f"cat {known_good}"))["patch_state_id"] == "pristine"
        before_patch = main_pid()

        # Failure 3's second half: the patch applies and compiles, and the restart it notifies serves "!!!!!!!!".
        proc, facts = both_roles(degenerate)
        failed_with(
            proc,
            host,
            "RUNNING HANDLER [llmops.inference.sglang_service : Restart SGLang through the gated chain]",
            f"{unit} failed its gate: generate tier: degenerate output: '!!!!",
        )
        assert verify(lab, host)["verify"]["modified"] == [SAMPLER]
        patched = main_pid()
        assert patched not in (0, before_patch)
        journal = sh(lab, host, f"journalctl -u {unit} --no-pager")
        assert f"the modified source {SAMPLER} declares faults: degenerate" in journal, journal
        saved = json.loads(sh(lab, host, f"cat {known_good}"))
        assert saved["patch_state_id"] == "pristine", saved

        # Back to the wheel's sources, the patch state of the known-good snapshot; the restore notifies the same
        # topic, so the service role restarts cleanly through its chain.
        proc, facts = both_roles({"sglang_patch_state": "restored", "sglang_patch_restore_state_id": "pristine"})
        restored = succeeded(proc, host, facts)
        assert restored["patch_state_id"] == "pristine"
        gate = restored["gate"]
        assert gate["healthy"] is True and int(gate["service"]["main_pid"]) not in (before_patch, patched), gate
        generate = next(tier for tier in gate["gate"]["tiers"] if tier["name"] == "generate")
        assert generate["status"] == "ok" and "degenerate" not in generate["reason"], generate
        assert_pristine(lab, host)
        assert json.loads(sh(lab, host, f"cat {known_good}"))["patch_state_id"] == "pristine"
    finally:
        restore_pristine(lab, host)
