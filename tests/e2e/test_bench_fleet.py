"""Benchmarks of playbooks/deploy.yml on a fleet (``make bench``; not run by ``make test``).

- No-op deploy (every host up to date) on 1, 6 and 12 hosts beside a play of one ping on the same hosts (the floor
  of any playbook), and on 1 and 6 hosts deployed by the baseline commit with that commit's deploy.yml, side by
  side.
- A rolling deploy under load through the real gateway (smg): 16 streaming clients send requests that outlive a
  stop (480 tokens at 50 ms: 24 s) for the whole round, a steady phase of 60 s, then the deploy with drains (the
  gateway list in the inventory, each host taken out of the gateway and its requests finished before its stop) and
  the same deploy without them (no gateway list, and a stop budget of a few seconds, shorter than a request: what a
  plain `systemctl restart` of an engine does to the requests it holds). It needs the gateway drain in the restart
  chain, which the role declares as LLMOPS_BENCH_GATEWAY_VAR (default sglang_service_gateways); until then it is
  recorded as skipped, with that reason.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
import time
from pathlib import Path

import loadgen
import pytest
from benchdata import (
    LAB_INVENTORY,
    PLAYS,
    RUNS,
    Recorder,
    baseline_checkout,
    fresh_hosts,
    in_turn,
    lab_group_vars,
    timed_playbook,
)
from gateway_lab import apply_gateway_role, connect_hosts, gateway_url, worker_url
from labutil import FLEET_UNIT

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]
GATEWAY_VAR = os.environ.get("LLMOPS_BENCH_GATEWAY_VAR", "sglang_service_gateways")
ROLE_SPECS = REPO / "roles" / "sglang_service" / "meta" / "argument_specs.yml"
FLEET_SIZES = (1, 6, 12)
LOAD_CLIENTS = 16
# Generations that outlive a stop: 480 tokens at the engine's 50 ms per token, 24 s each.
LOAD_TOKENS = 480
TOKEN_LATENCY_MS = 50
# Without drains the stop budget is far shorter than a request (with them, the role's defaults cover one).
WITHOUT_DRAINS = {
    "sglang_service_drain_timeout": 1,
    "sglang_service_scheduler_exit_sec": 1,
    "sglang_service_stop_margin_sec": 1,
}
ALL_AT_ONCE = {"deploy_batch": "100%"}
# smg's default (cache_aware) may keep every stream on one engine while another stops, so that a stop without drains
# sometimes holds no request and the control shows nothing; round robin puts requests on every engine all the time.
GATEWAY_POLICY = "round_robin"
# The stop's first look at the engine (ExecStop, plugins/module_utils/gpu_gate.py): its requests in flight then.
DRAINING = re.compile(r"llmops-gate drain: draining main process (\d+): (\d+) running")
STEADY_S = float(os.environ.get("LLMOPS_BENCH_STEADY_S", "60"))
# Runs the rolling benchmark although the role does not declare the gateway list: a check of the harness alone
# (both sides then deploy the same way); its data says so.
FORCE_ROLLING = os.environ.get("LLMOPS_BENCH_ROLLING_FORCE") == "1"


def deploy(lab, hosts: list, tree: Path = REPO, collections=None, extra: dict | None = None):
    """deploy.yml of ``tree`` on ``hosts`` (--limit), with that tree's lab inventory."""
    return timed_playbook(
        lab,
        tree / "playbooks" / "deploy.yml",
        extra,
        limit=",".join(hosts),
        inventories=(tree / "tests" / "lab" / "inventory",),
        collections=collections,
        timeout=1800,
    )


def test_bench_noop_deploy_on_1_6_and_12_hosts(lab):
    assert len(lab.hosts) >= max(FLEET_SIZES), f"the no-op deploy benchmark needs {max(FLEET_SIZES)} hosts"
    lab.reset()
    ours, theirs = lab.hosts[:6], lab.hosts[6:12]
    with baseline_checkout() as (tree, collections, baseline_sha):
        bench = Recorder(
            "noop_deploy",
            lab,
            {
                "sizes": FLEET_SIZES,
                "baseline_commit": baseline_sha,
                "baseline_hosts": theirs,
                "inventory": "tests/lab/inventory (the baseline side: that commit's own)",
            },
        )
        try:
            with bench.part("first deploy: 6 hosts of this commit, 6 of the baseline"):
                # Set-up, not measured: every host in one batch, both commits' deploys side by side.
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    runs = [
                        pool.submit(deploy, lab, hosts, where, paths, ALL_AT_ONCE)
                        for hosts, where, paths in ((ours, REPO, None), (theirs, tree, collections))
                    ]
                    for run in runs:
                        assert run.result().proc.returncode == 0, run.result().output
            cases = [("collection", ours[:1]), ("baseline", theirs[:1]), ("collection", ours), ("baseline", theirs)]
            measure(bench, lab, cases, tree, collections, "this commit and the baseline at 1 and 6 hosts")
            with bench.part("deploy this commit on the baseline's 6 hosts"):
                run = deploy(lab, theirs, extra=ALL_AT_ONCE)
                assert run.proc.returncode == 0, run.output
            cases = [(side, lab.hosts[:size]) for size in FLEET_SIZES for side in ("collection", "ping")]
            measure(bench, lab, cases, tree, collections, "this commit at 1, 6 and 12 hosts")
        finally:
            lab.reset()
    bench.finish()


def measure(bench, lab, cases: list, tree: Path, collections, label: str) -> None:
    for round_number in range(RUNS):
        with bench.part(f"round {round_number + 1}: {label}"):
            for side, hosts in in_turn(round_number, cases):
                if side == "ping":
                    run = timed_playbook(
                        lab, PLAYS / "bench_ping.yml", limit=",".join(hosts), inventories=(LAB_INVENTORY,)
                    )
                else:
                    where, paths = (REPO, None) if side == "collection" else (tree, collections)
                    run = deploy(lab, hosts, where, paths)
                assert run.proc.returncode == 0, run.output
                bench.sample(
                    round=round_number,
                    side=side,
                    hosts=len(hosts),
                    set=label,
                    start=run.start,
                    stop=run.stop,
                    up_to_date=side == "ping" or "up to date" in run.proc.stdout,
                )


def gateway_drain_declared() -> bool:
    return f"{GATEWAY_VAR}:" in ROLE_SPECS.read_text()


class Load:
    """LOAD_CLIENTS streaming clients through the gateway (tests/e2e/loadgen.py's requests) until stopped."""

    def __init__(self, url: str):
        self.settings = loadgen.LoadSettings(
            url,
            concurrency=LOAD_CLIENTS,
            duration=3600,
            max_new_tokens=LOAD_TOKENS,
            timeout=LOAD_TOKENS * TOKEN_LATENCY_MS / 1000 + 120,
        )
        self.records = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(index,)) for index in range(LOAD_CLIENTS)]
        self.numbers = iter(range(1, 10**9))

    def _client(self, index: int) -> None:
        while not self.stopping.is_set():
            with self.lock:
                number = next(self.numbers)
            record = loadgen.one_request(self.settings, number, index)
            with self.lock:
                self.records.append(record)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=self.settings.timeout + 10)

    def compact(self, since: float) -> list:
        """Every request since ``since`` as "START END OUTCOME" (ms from ``since``; ok, failed or truncated): the raw
        samples, one short line each."""
        with self.lock:
            records = list(self.records)
        return [
            f"{round((r['start'] - since) * 1000)} {round((r['end'] - since) * 1000)} {r['outcome']}"
            for r in records
            if r["start"] >= since
        ]


def test_bench_rolling_deploy_under_load_through_the_gateway(lab):
    bench_name = "rolling_deploy"
    if not gateway_drain_declared() and not FORCE_ROLLING:
        bench = Recorder(bench_name, lab, {"gateway_var": GATEWAY_VAR})
        reason = (
            f"the restart chain has no gateway drain yet: {GATEWAY_VAR} is not an option of the "
            "sglang_service role (roles/sglang_service/meta/argument_specs.yml)"
        )
        bench.skip(reason)
        pytest.skip(reason)
    with fresh_hosts(lab, 4) as part:
        rolling_deploy(part, bench_name)


def rolling_deploy(lab, bench_name: str) -> None:
    engines, gateway_host = lab.hosts[:3], lab.hosts[3]
    addresses = connect_hosts(lab)
    gateway = gateway_url(addresses[gateway_host])
    engine_vars = {
        "sglang_service_host": "0.0.0.0",
        "sglang_service_tp_size": 1,
        "sglang_service_extra_args": ["--enable-metrics", "--sim-token-latency-ms", str(TOKEN_LATENCY_MS)],
    }
    environment = dict(lab_group_vars().get("sglang_service_environment", {}))
    bench = Recorder(
        bench_name,
        lab,
        {
            "engines": engines,
            "gateway_host": gateway_host,
            "gateway_var": GATEWAY_VAR,
            "clients": LOAD_CLIENTS,
            "max_new_tokens": LOAD_TOKENS,
            "token_latency_ms": TOKEN_LATENCY_MS,
            "without_drains": WITHOUT_DRAINS,
            "steady_s": STEADY_S,
            "gateway_policy": GATEWAY_POLICY,
            "deploy_batch": 1,
            "engine": engine_vars,
            "without": "the same deploy.yml with no gateway list and a stop budget shorter than a request: "
            "the plain rolling restart",
            "harness_check_only": not gateway_drain_declared(),
        },
    )
    with bench.part("set-up: engines, gateway, workers registered"):
        first = deploy(lab, engines, extra=engine_vars | ALL_AT_ONCE)
        assert first.proc.returncode == 0, first.output
        role = apply_gateway_role(lab, gateway_host, {"sglang_gateway_policy": GATEWAY_POLICY})
        assert role.returncode == 0, role.stdout[-4000:]
    for round_number in range(RUNS):
        sides = [("with_drain", {GATEWAY_VAR: [gateway]}), ("without_drain", WITHOUT_DRAINS)]
        for side, settings in in_turn(round_number, sides):
            with bench.part(f"round {round_number + 1}: {side}"):
                register(lab, gateway_host, gateway, [worker_url(addresses[host]) for host in engines])
                variables = dict(
                    engine_vars,
                    **settings,
                    deploy_batch=1,
                    sglang_service_environment=environment | {"BENCH_DEPLOY": f"{round_number}-{side}"},
                )
                with Load(gateway) as load:
                    began = time.time()
                    load.stopping.wait(STEADY_S)  # the steady phase is a measured window, not a wait for a state
                    run = deploy(lab, engines, extra=variables)
                assert run.proc.returncode == 0, run.output
                bench.sample(
                    round=round_number,
                    side=side,
                    start=run.start,
                    stop=run.stop,
                    load_start=began,
                    requests=load.compact(began),
                    in_flight_at_stop=in_flight_at_stops(lab, engines, run.start, run.stop),
                )
    bench.finish()


def in_flight_at_stops(lab, engines: list, start: float, stop: float) -> dict:
    """{engine: [requests running at each stop of the deploy]}, from the stop's first look in the unit's journal: the
    evidence that the stops without drains had requests to cut."""
    found = {}
    for host in engines:
        window = f"--since @{start:.0f} --until @{stop + 1:.0f}"
        journal = lab.exec(host, f"journalctl -u {FLEET_UNIT} -o cat --no-pager {window}")
        assert journal.returncode == 0, journal.stderr
        first_looks = {}
        for pid, running in DRAINING.findall(journal.stdout):
            first_looks.setdefault(pid, int(running))
        found[host] = list(first_looks.values())
    return found


def register(lab, gateway_host: str, gateway: str, workers: list) -> None:
    """Every engine on the gateway, healthy, before a round (a deploy without drains may leave one out)."""
    for worker in workers:
        result = lab.module(
            gateway_host,
            "llmops.inference.sglang_gateway_worker",
            {"gateways": [gateway], "worker_url": worker, "state": "present", "wait_timeout": 120},
        )
        assert not result.get("failed"), result
