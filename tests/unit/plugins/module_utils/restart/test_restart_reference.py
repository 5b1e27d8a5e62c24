"""The reference gate in the restart chain: recorded with the first known-good, skipped on a routine restart, a
failed gate when a changed engine does not match it (the reference untouched), re-recorded only when accepted."""

from __future__ import annotations

import json

import pytest
from restart_world import PARAMS, World, healthy_probe

from ansible_collections.llmops.inference.plugins.module_utils.known_good import KnownGoodStore

GOLDEN = [{"prompt": "p", "prompt_ids": [1, 2], "output_ids": [7, 8, 9], "logprobs": [-0.1, -0.2, -0.3]}]


def figure(median, low, high):
    return {"median": median, "low": low, "high": high, "samples": [low, median, high]}


FINGERPRINT = {"tok_s_c1": figure(100.0, 98.0, 102.0), "itl_ms": figure(10.0, 9.8, 10.2)}


class FakeEngine:
    """What the engine answers to the reference's requests: its outputs, and how fast it is."""

    def __init__(self):
        self.forced = [-0.1, -0.2, -0.3]
        self.output_ids = [7, 8, 9]
        self.speed = 1.0
        self.calls = []

    def fingerprint(self):
        return {
            "tok_s_c1": figure(100.0 / self.speed, 99.0 / self.speed, 101.0 / self.speed),
            "itl_ms": figure(10.0 * self.speed, 9.9 * self.speed, 10.1 * self.speed),
        }

    def record(self, speculative):
        self.calls.append(("record", speculative))
        return {"golden": GOLDEN, "fingerprint": self.fingerprint()}

    def observe(self, golden, speculative):
        self.calls.append(("observe", speculative))
        return {
            "scores": [{"teacher_forced": self.forced, "output_ids": self.output_ids}],
            "fingerprint": self.fingerprint(),
        }


@pytest.fixture
def host(tmp_path):
    unit = tmp_path / "sglang-t.service"
    env = tmp_path / "sglang-t.env"
    unit.write_text("[Service]\nExecStart=/opt/sglang/bin/python -m sglang.launch_server\n")
    env.write_text("MODEL=/models/a\n")
    known_good = {
        "root": str(tmp_path / "known-good"),
        "files": {"unit": str(unit), "environment": str(env)},
        "dropin_dir": str(tmp_path / "dropins"),
        "patch_state_id": "pristine",
    }
    engine = FakeEngine()

    def run(reference=None, **probe_extra):
        world = World(probe=[healthy_probe(**probe_extra)])
        world.store = KnownGoodStore
        params = {**PARAMS, "known_good": known_good, "reference": reference or {}}
        return world.build(params, reference=lambda settings: engine).run()

    class Host:
        pass

    found = Host()
    found.run, found.engine, found.env = run, engine, env
    found.reference_path = tmp_path / "known-good" / "reference.json"
    return found


def step(result, name):
    return next(entry for entry in result["steps"] if entry["name"] == name)


def test_the_first_known_good_records_the_reference_and_a_routine_restart_skips_it(host):
    first = host.run()
    assert first["healthy"] and first["reference"]["status"] == "recorded"
    recorded = json.loads(host.reference_path.read_text())
    assert recorded["golden"] == GOLDEN and recorded["why"] == "first reference" and recorded["snapshot_saved_at"]
    assert recorded["inputs"]["files"].keys() == {"unit", "environment"}
    assert step(first, "reference_record")["status"] == "ok" and "reference recorded" in first["msg"]
    again = host.run()
    assert again["healthy"] and again["reference"]["status"] == "skipped"
    assert "engine inputs unchanged since the known-good of" in again["reference"]["reason"]
    assert host.engine.calls == [("record", False)]
    always = host.run({"mode": "always"})
    assert always["reference"]["status"] == "passed" and host.engine.calls[-1] == ("observe", False)


def test_a_changed_engine_that_drifts_fails_the_gate_and_leaves_the_reference_alone(host):
    host.run()
    before = host.reference_path.read_bytes()
    host.env.write_text("MODEL=/models/a\nSGLANG_SIM_FAULTS=output-drift=1\n")
    host.engine.forced = [-0.1, -3.5, -4.0]
    host.engine.output_ids = [7, 55, 56]
    result = host.run()
    assert result["healthy"] is False and result["gate"]["failed_tier"] == "reference"
    assert result["reference"]["status"] == "failed"
    assert result["reference"]["failed_checks"] == ["greedy_tokens", "logprobs"]
    assert (
        "golden token 1 (id 8) of prompt 0: logprob -3.5 now, -0.2 recorded, a gap of 3.3" in result["gate"]["reason"]
    )
    assert "against the reference recorded" in result["msg"]
    assert result["gate"]["tiers"][-1]["name"] == "reference" and result["gate"]["tiers"][-1]["status"] == "failed"
    assert "snapshot" not in [entry["name"] for entry in result["steps"]]
    assert host.reference_path.read_bytes() == before


def test_a_slower_changed_engine_fails_on_speed_with_its_ratio_and_spread(host):
    host.run()
    host.env.write_text("MODEL=/models/a\nEXTRA=1\n")
    host.engine.speed = 1.25
    result = host.run()
    # ITL 12.5 ms is within the reference's 10.2 ms plus 10 % and the 5 ms floor; throughput is not.
    assert result["healthy"] is False and result["reference"]["failed_checks"] == ["tok_s_c1"]
    tok = next(check for check in result["reference"]["checks"] if check["check"] == "tok_s_c1")
    assert tok["ratio"] == pytest.approx(0.8) and tok["reference_spread"] == [99.0, 101.0]
    assert "tok_s_c1: median 80 now (spread 79.2-80.8), 100 recorded (spread 99-101), ratio 0.8" in result["msg"]


def test_accepting_an_intended_change_records_the_reference_anew_and_the_next_restart_holds_to_it(host):
    host.run()
    host.env.write_text("MODEL=/models/b\n")
    host.engine.speed = 1.5
    accepted = host.run({"accept": True})
    assert accepted["healthy"] and accepted["reference"]["status"] == "accepted"
    assert "accepted as an intended change (reference.accept)" in accepted["reference"]["reason"]
    assert "it replaces the one recorded" in accepted["reference"]["reason"]
    assert json.loads(host.reference_path.read_text())["fingerprint"]["tok_s_c1"]["median"] == pytest.approx(
        66.67, 0.01
    )
    assert host.run({"mode": "always"})["reference"]["status"] == "passed"


def test_mode_off_adds_no_step_and_records_nothing(host):
    result = host.run({"mode": "off"})
    assert result["healthy"] and result["reference"]["status"] == "off"
    assert "reference" not in [entry["name"] for entry in result["steps"]]
    assert not host.reference_path.exists()


def test_speculation_is_passed_to_the_measurement(host):
    host.run(speculative={"algorithm": "EAGLE"})
    assert host.engine.calls == [("record", True)]
