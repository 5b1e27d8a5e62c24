"""The reference gate on lab hosts (real systemd, the real sglang 0.5.23 sources): a change whose engine is slower or
whose greedy output drifts fails the gate and is restored as any failed gate is; a benign change and ten no-op restarts
pass; an accepted change records the reference anew.

The simulated engine decodes at 10 ms a token here, so that the fingerprint's figures stand well above the lab's
timing noise; the reference's outputs are 32 tokens.
"""

from __future__ import annotations

import csv
import json
import re

import pytest
from labutil import (
    DEPLOY,
    FLEET_UNIT,
    SERVICE_LAB_VARS,
    fleet_of,
    outcomes,
    output,
    run_play,
    run_playbook,
    serves,
    sh,
)
from test_sglang_patch import (
    FILES,
    PATCH_AND_SERVICE,
    SAMPLER,
    assert_pristine,
    failed_with,
    restore_pristine,
    run_role,
    succeeded,
    verify,
)
from test_spec_sweep import DEPLOY as SWEEP_DEPLOY
from test_spec_sweep import ROLE_VARS as SWEEP_ROLE_VARS
from test_spec_sweep import run_sweep

pytestmark = pytest.mark.lab

NAME = SERVICE_LAB_VARS["sglang_service_name"]
REFERENCE_PATH = f"/var/lib/llmops/known-good/{NAME}/reference.json"
# The fleet's unit (tests/lab/inventory: sglang_service_name sglang).
FLEET_REFERENCE = "/var/lib/llmops/known-good/sglang/reference.json"
REFERENCE = {"max_new_tokens": 32, "perf_max_new_tokens": 32}
LAB = {
    "sglang_service_extra_args": [*SERVICE_LAB_VARS["sglang_service_extra_args"], "--sim-token-latency-ms", "10"],
    "sglang_service_reference": REFERENCE,
}
SPEED_FAILURE = re.compile(
    r"tok_s_c1 failed: tok_s_c1: median [\d.]+ now \(spread [\d.]+-[\d.]+\), [\d.]+ recorded "
    r"\(spread [\d.]+-[\d.]+\), ratio 0\.[78]\d*; must be at least"
)


def both_roles(lab, host, tmp_path, extra: dict):
    return run_role(lab, host, tmp_path, {**SERVICE_LAB_VARS, **LAB, **extra}, playbook=PATCH_AND_SERVICE)


def patch_set(name: str) -> dict:
    return {"sglang_patch_set_name": name, "sglang_patch_files": [str(FILES / f"{name}-sampler.diff")]}


def first_known_good(lab, host, tmp_path) -> str:
    """The service on pristine sources; its first passing gate records the reference. Returns its text."""
    proc, facts = both_roles(lab, host, tmp_path, {"sglang_patch_state": "verified"})
    gate = succeeded(proc, host, facts)["gate"]
    assert gate["healthy"] is True and gate["reference"]["status"] == "recorded", gate.get("reference")
    text = sh(lab, host, f"cat {REFERENCE_PATH}")
    recorded = json.loads(text)
    assert len(recorded["golden"]) == 3 and len(recorded["golden"][0]["output_ids"]) == 32
    assert {"tok_s_c1", "tok_s_c4", "ttft_ms", "itl_ms"} <= recorded["fingerprint"].keys()
    return text


def no_op_restart(lab, host, tmp_path, label: str, **reference) -> dict:
    extra = {**LAB, "sglang_service_reference": {**REFERENCE, **reference}}
    run = run_play(lab, tmp_path, host, "service_restart", extra, label=label)
    assert run.ok, run.output[-4000:]
    return run.gate()


@pytest.mark.parametrize(
    "fault, check",
    [
        ("slowdown", SPEED_FAILURE),
        (
            "drift",
            re.compile(
                r"logprobs failed: golden token 8 \(id \d+\) of prompt 0: logprob -[\d.]+ now, -[\d.]+ "
                r"recorded, a gap of [\d.]+ \(tolerance 0\.1\)"
            ),
        ),
    ],
    ids=["slowdown", "drift"],
)
def test_a_slower_or_drifting_patch_fails_the_reference_gate_and_is_restored(clean_lab, tmp_path, fault, check):
    lab, host = clean_lab, clean_lab.hosts[0]
    try:
        recorded = first_known_good(lab, host, tmp_path)
        proc, _facts = both_roles(lab, host, tmp_path, patch_set(fault))
        failed_with(proc, host, f"{NAME}.service failed its gate: reference tier: reference check failed against the "
                    "reference recorded")  # fmt: skip
        assert check.search(proc.stdout), proc.stdout[-4000:]
        assert verify(lab, host)["verify"]["modified"] == [SAMPLER]
        assert sh(lab, host, f"cat {REFERENCE_PATH}") == recorded

        # Back to the known-good's sources, as after any failed gate: the restart serves, its inputs are the
        # known-good's (a routine restart), and the reference is the same.
        proc, facts = both_roles(lab, host, tmp_path, {"sglang_patch_state": "restored",
                                                       "sglang_patch_restore_state_id": "pristine"})  # fmt: skip
        gate = succeeded(proc, host, facts)["gate"]
        assert gate["healthy"] is True and gate["reference"]["status"] == "skipped", gate["reference"]
        assert_pristine(lab, host)
        assert sh(lab, host, f"cat {REFERENCE_PATH}") == recorded
        assert no_op_restart(lab, host, tmp_path, "after", mode="always")["reference"]["status"] == "passed"
    finally:
        restore_pristine(lab, host)


def test_a_benign_patch_passes_and_ten_no_op_restarts_raise_no_false_alarm(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    try:
        recorded = first_known_good(lab, host, tmp_path)
        proc, facts = both_roles(lab, host, tmp_path, patch_set("benign"))
        gate = succeeded(proc, host, facts)["gate"]
        assert gate["healthy"] is True and gate["reference"]["status"] == "passed", gate["reference"]
        assert gate["reference"]["failed_checks"] == []
        for number in range(10):
            gate = no_op_restart(lab, host, tmp_path, f"noop{number}", mode="always")
            assert gate["healthy"] is True and gate["reference"]["status"] == "passed", (number, gate["reference"])
        routine = no_op_restart(lab, host, tmp_path, "routine")
        assert routine["reference"]["status"] == "skipped"
        assert sh(lab, host, f"cat {REFERENCE_PATH}") == recorded
    finally:
        restore_pristine(lab, host)


def test_accepting_an_intended_change_records_the_reference_anew(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    try:
        recorded = first_known_good(lab, host, tmp_path)
        proc, facts = both_roles(lab, host, tmp_path, {**patch_set("drift"), "sglang_service_reference_accept": True})
        gate = succeeded(proc, host, facts)["gate"]
        assert gate["healthy"] is True and gate["reference"]["status"] == "accepted", gate["reference"]
        assert "accepted as an intended change (reference.accept)" in gate["reference"]["reason"]
        assert "it replaces the one recorded" in gate["reference"]["reason"]
        accepted = json.loads(sh(lab, host, f"cat {REFERENCE_PATH}"))
        assert accepted["why"] == "accepted as an intended change (reference.accept)"
        assert accepted["golden"] != json.loads(recorded)["golden"]
        gate = no_op_restart(lab, host, tmp_path, "after-accept", mode="always")
        assert gate["healthy"] is True and gate["reference"]["status"] == "passed", gate["reference"]
    finally:
        restore_pristine(lab, host)


def test_a_deploy_that_makes_one_host_slower_rolls_it_back_and_stops_with_the_check_named(lab, tmp_path):
    """Three hosts deployed with the engine at 10 ms a token (each records its reference); then one deploy gives one
    host an engine argument that makes it 25 % slower: its reference gate fails, deploy.yml rolls it back, and the
    deploy stops as after any failed gate, the fleet report naming the check."""
    assert len(lab.hosts) >= 3, "set LLMOPS_LAB_HOSTS=3"
    lab.reset_used()
    fleet = fleet_of(lab, 3)
    slow = fleet.hosts[0]
    environment = {"SGLANG_SIM_LOAD_TIME": "1", "SGLANG_SIM_DRAIN_TIME": "2", "SGLANG_SIM_TOKEN_LATENCY_MS": "10"}
    base = {"deploy_batch": "100%", "sglang_service_environment": environment, "sglang_service_reference": REFERENCE}
    try:
        proc, records = run_playbook(fleet, DEPLOY, tmp_path, "first", base)
        assert proc.returncode == 0, output(proc)
        assert outcomes(records) == dict.fromkeys(fleet.hosts, "deployed")
        references = {host: sh(lab, host, f"cat {FLEET_REFERENCE}") for host in fleet.hosts}
        per_host = tmp_path / "inventory.yml"
        per_host.write_text(
            json.dumps({"lab": {"hosts": {slow: {"sglang_service_extra_args": ["--sim-fault", "slowdown=1.25"]}}}})
        )
        proc, records = run_playbook(fleet, DEPLOY, tmp_path, "slow", base, inventories=(per_host,))
        assert proc.returncode != 0, output(proc)
        assert outcomes(records)[slow] == "rolled back", output(proc)
        assert set(outcomes(records).values()) <= {"rolled back", "unchanged"}, outcomes(records)
        assert "failed its gate: reference tier: reference check failed" in records[slow]["detail"], records[slow]
        assert SPEED_FAILURE.search(records[slow]["detail"]) or "tok_s_c1 failed" in records[slow]["detail"]
        assert f"{slow}: ROLLED BACK" in proc.stdout
        assert records[slow]["rollback"]["gate"]["healthy"], records[slow]["rollback"]
        assert serves(fleet, slow)["healthy"]
        assert "slowdown" not in sh(lab, slow, f"systemctl cat {FLEET_UNIT}")
        assert {host: sh(lab, host, f"cat {FLEET_REFERENCE}") for host in fleet.hosts} == references
    finally:
        lab.reset()


SWEEP_VARS = {
    **{
        key: value
        for key, value in SWEEP_ROLE_VARS.items()
        if not key.startswith(("sglang_service_speculative", "sglang_service_reference"))
    },
    "sglang_service_name": "sglang-lossless",
    # The base runs no speculation (its outputs are the golden ones); at 3 steps the draft is not lossless.
    "sglang_service_speculative_algorithm": "",
    "sglang_service_speculative_num_steps": None,
    "sglang_service_speculative_eagle_topk": None,
    "sglang_service_extra_args": [
        "--sim-load-time", "1", "--sim-warmup-time", "0.2", "--sim-token-latency-ms", "20",
        "--sim-fault", "lossy-steps=3",
    ],
}  # fmt: skip


def test_a_sweep_point_that_is_not_lossless_is_marked_everywhere_and_never_chosen(clean_lab, tmp_path):
    lab, host = clean_lab, clean_lab.hosts[0]
    playbook = tmp_path / "deploy.yml"
    playbook.write_text(SWEEP_DEPLOY.replace("hosts: lab", f"hosts: {host}"))
    proc = lab.playbook(playbook, SWEEP_VARS, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    results_dir = tmp_path / "sweep"
    extra = {**SWEEP_VARS, "sweep_algorithm": "EAGLE", "sweep_concurrency": [1, 8], "sweep_slo": {"p99_tpot_ms": 500.0}}
    results = run_sweep(lab, results_dir, host, [1, 2, 3, 4], **extra)
    lossless = {(r["point"]["steps"], r["concurrency"]): r["load"]["lossless"] for r in results["records"]}
    assert {key: value["lossless"] for key, value in lossless.items()} == {
        (steps, level): steps != 3 for steps in (1, 2, 3, 4) for level in (1, 8)
    }, lossless
    assert "golden token 8" in lossless[(3, 1)]["detail"]
    assert all(row["lossless"] is (row["steps"] != 3) for row in results["summary"])
    report = results  # results.json holds the choices at its top level
    chosen = [entry["best"]["steps"] for entry in report["best_per_level"] if entry["best"]]
    assert chosen and 3 not in chosen, report["best_per_level"]
    assert report["robust_choice"]["point"]["steps"] != 3 and report["sla_choice"]["point"]["steps"] != 3
    markdown = (results_dir / "results.md").read_text()
    assert "- steps 3, top-k 1, draft tokens 4: not lossless: golden token 8" in markdown
    assert "**not lossless**" in markdown
    with (results_dir / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["lossless"] for row in rows if row["steps"] == "3"} == {"false"}
    assert {row["lossless"] for row in rows if row["steps"] != "3"} == {"true"}
    assert (results_dir / "results.png").stat().st_size > 0
