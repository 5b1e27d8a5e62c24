"""Known-good snapshots that can always be restored, on a 2-host lab fleet (real systemd, sshd, sglang sources).

Deploy patch set A, then patch set B (each with its own unit), then rollback.yml: every host returns to A's unit
files and to A's sources byte for byte (checked against the checksums A's snapshot recorded), serving, through the
gate. Rolling back again toggles to B (the contract in docs/fleet_scale.md). Sources reinstalled from the wheel
behind the collection's back come back with `rollback_snapshot=current`. A snapshot whose stored content is
missing or damaged is refused before any host changes, naming what is missing. The tests run in order and share
the fleet's state. Every snapshot checked is the one the playbooks' restart chains saved: the tests never save one
themselves, so a chain that stopped recording the sources fails them. Two hosts show that every host of a
batch returns (each keeps snapshots of its own); a third would repeat the same steps.
"""

from __future__ import annotations

import pytest
from labutil import (
    DEPLOY,
    FLEET_KNOWN_GOOD,
    FLEET_UNIT_FILE,
    FORCE_REINSTALL,
    REPO,
    ROLLBACK,
    batch_ran,
    fleet_of,
    known_good,
    main_pid,
    outcomes,
    output,
    serves,
    sh,
    sha256,
    verify_sources,
)
from labutil import run_playbook as run

pytestmark = pytest.mark.lab

FILES = REPO / "tests" / "e2e" / "files"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SPEC_REGISTRY = "sglang/srt/speculative/spec_registry.py"
NOTE = "sglang/srt/speculative/llmops_note.py"
# Patch set A registers a speculative algorithm, and its unit serves with it.
DEPLOY_A = {
    "sglang_patch_set_name": "eagle_lab",
    "sglang_patch_files": [str(REPO / "docs" / "patches" / "eagle_lab" / "0001-register-llmops-demo-algorithm.diff")],
    "sglang_service_speculative_algorithm": "LLMOPS_DEMO",
    "sglang_service_speculative_algorithms": ["EAGLE", "LLMOPS_DEMO"],
    "deploy_batch": "100%",
}
# Patch set B changes another file and adds one; its unit has no speculative algorithm.
DEPLOY_B = {
    "sglang_patch_set_name": "registry_note",
    "sglang_patch_files": [str(FILES / "sglang_patch" / "0002-spec-registry-comment.diff")],
    "sglang_patch_replacements": [{"src": str(FILES / "known_good" / "llmops_note.py.txt"), "dest": NOTE}],
    "deploy_batch": "100%",
}
SITE = "/opt/sglang/venv/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def fleet(lab):
    lab.reset_used()
    yield fleet_of(lab, 2)
    lab.reset()


def sources_now(lab, host, paths) -> dict:
    """{path: sha256 or None} of the installed files ``paths`` (relative to site-packages)."""
    found = {}
    for rel in paths:
        answer = lab.exec(host, f"test -e {SITE}/{rel} && sha256sum {SITE}/{rel} | cut -d' ' -f1")
        found[rel] = answer.stdout.strip() or None
    return found


def assert_sources_are(lab, host, snapshot: dict) -> None:
    """The host's sources are exactly the snapshot's: its files with its checksums, every other file the wheel's."""
    recorded = snapshot["sources"]["files"]
    assert sources_now(lab, host, recorded) == {rel: entry["sha256"] for rel, entry in recorded.items()}
    verify = verify_sources(lab, host)["verify"]
    differing = set(verify["modified"]) | set(verify["missing"]) | set(verify["unrecorded"])
    assert differing == set(recorded), verify


def state_of(lab) -> dict:
    return {
        host: {"unit": sha256(lab, host, FLEET_UNIT_FILE), "pid": main_pid(lab, host), "kg": known_good(lab, host)}
        for host in lab.hosts
    }


def test_deploy_a_then_b_then_rollback_returns_to_a_byte_for_byte(fleet, tmp_path):
    proc, records = run(fleet, DEPLOY, tmp_path, "deploy_a", DEPLOY_A)
    assert proc.returncode == 0 and outcomes(records) == dict.fromkeys(fleet.hosts, "deployed"), output(proc)
    a = state_of(fleet)
    for host in fleet.hosts:
        assert set(a[host]["kg"]["current"]["sources"]["files"]) == {SPEC_INFO}
        assert_sources_are(fleet, host, a[host]["kg"]["current"])

    proc, records = run(fleet, DEPLOY, tmp_path, "deploy_b", DEPLOY_B)
    assert proc.returncode == 0 and outcomes(records) == dict.fromkeys(fleet.hosts, "deployed"), output(proc)
    b = state_of(fleet)
    for host in fleet.hosts:
        assert set(b[host]["kg"]["current"]["sources"]["files"]) == {SPEC_REGISTRY, NOTE}
        assert b[host]["kg"]["previous"]["saved_at"] == a[host]["kg"]["current"]["saved_at"]
        assert b[host]["unit"] != a[host]["unit"]

    proc, records = run(fleet, ROLLBACK, tmp_path, "rollback")
    assert proc.returncode == 0, output(proc)
    assert outcomes(records) == dict.fromkeys(fleet.hosts, "returned"), output(proc)
    for host in fleet.hosts:
        record = records[host]
        assert record["gate"]["healthy"] and record["gate"]["restarted"], record
        assert record["after"]["patch_state"] == a[host]["kg"]["current"]["patch_state_id"], record
        assert sha256(fleet, host, FLEET_UNIT_FILE) == a[host]["unit"]
        assert_sources_are(fleet, host, a[host]["kg"]["current"])
        assert serves(fleet, host)["healthy"]


def test_rollback_again_toggles_back_to_b(fleet, tmp_path):
    # The rollback's gate passed, so A's state is current now and B's, which it replaced, previous.
    now = state_of(fleet)
    for host in fleet.hosts:
        assert set(now[host]["kg"]["current"]["sources"]["files"]) == {SPEC_INFO}
        assert set(now[host]["kg"]["previous"]["sources"]["files"]) == {SPEC_REGISTRY, NOTE}
    b_sources = {host: now[host]["kg"]["previous"] for host in fleet.hosts}

    proc, records = run(fleet, ROLLBACK, tmp_path, "rollback_again")
    assert proc.returncode == 0, output(proc)
    assert outcomes(records) == dict.fromkeys(fleet.hosts, "returned"), output(proc)
    for host in fleet.hosts:
        assert records[host]["gate"]["healthy"] and records[host]["gate"]["restarted"], records[host]
        assert_sources_are(fleet, host, b_sources[host])
        assert serves(fleet, host)["healthy"]

    # Re-asserting the state the hosts are in restarts nothing.
    pids = {host: main_pid(fleet, host) for host in fleet.hosts}
    proc, records = run(fleet, ROLLBACK, tmp_path, "rollback_current", {"rollback_snapshot": "current"})
    assert proc.returncode == 0 and outcomes(records) == dict.fromkeys(fleet.hosts, "unchanged"), output(proc)
    assert {host: main_pid(fleet, host) for host in fleet.hosts} == pids


def test_sources_reinstalled_from_the_wheel_come_back_with_the_current_snapshot(fleet, tmp_path):
    current = {host: known_good(fleet, host)["current"] for host in fleet.hosts}
    for host in fleet.hosts:
        assert set(current[host]["sources"]["files"]) == {SPEC_REGISTRY, NOTE}
        sh(fleet, host, f"{FORCE_REINSTALL} && rm -f {SITE}/{NOTE}")
        assert verify_sources(fleet, host)["verify"]["pristine"]

    proc, records = run(fleet, ROLLBACK, tmp_path, "rollback_reinstalled", {"rollback_snapshot": "current"})
    assert proc.returncode == 0, output(proc)
    assert outcomes(records) == dict.fromkeys(fleet.hosts, "returned"), output(proc)
    for host in fleet.hosts:
        assert records[host]["gate"]["healthy"] and records[host]["gate"]["restarted"], records[host]
        assert_sources_are(fleet, host, current[host])
        assert serves(fleet, host)["healthy"]


@pytest.mark.parametrize("damage", ["missing", "damaged"])
def test_a_snapshot_whose_stored_content_is_gone_is_refused_before_any_host_changes(fleet, tmp_path, damage):
    host = fleet.hosts[0]
    previous = known_good(fleet, host)["previous"]
    content = previous["sources"]["files"][SPEC_INFO]["sha256"]
    path = f"{FLEET_KNOWN_GOOD}/objects/{content}"
    kept = sh(fleet, host, f"base64 -w0 {path}")
    before = state_of(fleet)
    sources = {name: sources_now(fleet, name, [SPEC_INFO, SPEC_REGISTRY, NOTE]) for name in fleet.hosts}
    sh(fleet, host, f"rm {path}" if damage == "missing" else f"echo damaged > {path}")
    try:
        proc, _records = run(fleet, ROLLBACK, tmp_path, f"rollback_{damage}")
    finally:
        sh(fleet, host, f"echo {kept} | base64 -d > {path}")
    assert proc.returncode != 0, output(proc)
    state = "is missing" if damage == "missing" else "does not match its checksum"
    assert f"the stored content of {SPEC_INFO} ({path}) {state}" in proc.stdout, output(proc)
    assert not batch_ran(proc), "the rollback got past its preflight"
    assert state_of(fleet) == before
    assert {name: sources_now(fleet, name, [SPEC_INFO, SPEC_REGISTRY, NOTE]) for name in fleet.hosts} == sources


def test_a_snapshot_whose_unit_copy_is_damaged_is_refused_before_any_host_changes(fleet, tmp_path):
    host = fleet.hosts[0]
    copy = f"{FLEET_KNOWN_GOOD}/previous/files/unit"
    kept = sh(fleet, host, f"base64 -w0 {copy}")
    before = state_of(fleet)
    sh(fleet, host, f"echo '[Service]' >> {copy}")
    try:
        proc, _records = run(fleet, ROLLBACK, tmp_path, "rollback_damaged_unit")
    finally:
        sh(fleet, host, f"echo {kept} | base64 -d > {copy}")
    assert proc.returncode != 0, output(proc)
    assert f"the copy of {FLEET_UNIT_FILE} ({copy}) does not match its checksum" in proc.stdout, output(proc)
    assert not batch_ran(proc), "the rollback got past its preflight"
    assert state_of(fleet) == before
