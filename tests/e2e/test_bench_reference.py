"""Benchmark of the reference gate (``make bench``; not run by ``make test``): a restart through the chain with the
reference check on against the same restart with it off, per engine load, in rounds that alternate the two.

"On" is ``reference.mode: always`` with every other reference option at its default: the cost a restart whose engine
inputs changed pays (golden outputs scored teacher-forced and free-running, the performance fingerprint measured
again). Every sample goes to docs/performance/<run>/reference_gate.json; tests/bench/write_performance.py reports the
difference of the medians per load.
"""

from __future__ import annotations

import json

import pytest
from benchdata import RUNS, Recorder, apply_role, chain_restart, engine_of, engine_vars, fresh_hosts, in_turn
from test_bench import RESTART_LOADS

pytestmark = pytest.mark.bench

SIDES = {"reference_on": {"mode": "always"}, "reference_off": {"mode": "off"}}


@pytest.fixture
def reference_hosts(lab):
    with fresh_hosts(lab, len(RESTART_LOADS)) as part:
        yield part


def test_bench_restart_with_the_reference_check_on_and_off(reference_hosts, tmp_path):
    lab = reference_hosts
    hosts = dict(zip(RESTART_LOADS, lab.hosts))
    bench = Recorder(
        "reference_gate",
        lab,
        {
            "loads_s": RESTART_LOADS,
            "hosts": {f"{load:g}": host for load, host in hosts.items()},
            "engine": {f"{load:g}": engine_vars(load) for load in RESTART_LOADS},
            "sides": SIDES,
            "reference_options": "the module's defaults (llmops.inference.sglang_restart, option reference)",
        },
    )
    with bench.part("set-up: the role on each host, which records the first reference"):
        for load, host in hosts.items():
            apply_role(lab, host, engine_vars(load))
            bench.note(f"engine_{load:g}s", json.dumps(engine_of(lab, host)))
    for round_number in range(RUNS):
        for load, host in hosts.items():
            with bench.part(f"round {round_number + 1}, {load:g} s load"):
                for side in in_turn(round_number, list(SIDES)):
                    variables = engine_vars(load) | {"sglang_service_reference": SIDES[side]}
                    fields = chain_restart(lab, host, variables, tmp_path)
                    bench.sample(round=round_number, load_s=load, side=side, host=host, **fields)
    bench.finish()
    failed = [sample for sample in bench.data["samples"] if not sample["ok"]]
    assert not failed, failed[0].get("error")
