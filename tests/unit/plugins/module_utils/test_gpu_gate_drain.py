"""gpu_gate drain: the unit's ExecStop sends SIGTERM to SGLang's main process alone and waits for its requests."""

from __future__ import annotations

import http.server
import io
import threading

import pytest
from fake_proc import FakeClock, FakeProc

from ansible_collections.llmops.inference.plugins.module_utils import gpu_gate

METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="m",tp_rank="0"}} {running0}
sglang:num_running_reqs{{model_name="m",tp_rank="1"}} {running1}
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="m"}} {queued}
sglang:gen_throughput{{model_name="m"}} 12.5
"""


def metrics(running0=0.0, running1=0.0, queued=0.0) -> str:
    return METRICS.format(running0=running0, running1=running1, queued=queued)


def test_in_flight_sums_every_series_of_both_gauges():
    assert gpu_gate.in_flight(metrics(3.0, 2.0, 4.0)) == (5, 4)
    assert gpu_gate.in_flight(metrics()) == (0, 0)
    assert gpu_gate.in_flight("sglang:gen_throughput 1.0\n") is None
    assert gpu_gate.in_flight("") is None


class DrainWorld:
    """A main process in a fake /proc, a scripted /metrics, and the signals sent."""

    def __init__(self, tmp_path, answers, exits_at=None):
        self.proc = FakeProc(tmp_path / "proc")
        self.proc.add(500, argv=("python",))
        self.clock = FakeClock()
        self.answers = list(answers)
        self.exits_at = exits_at
        self.signals = []
        self.scrapes = 0

    def kill(self, pid, sig):
        self.signals.append((pid, sig))

    def scrape(self, url):
        assert url == "http://127.0.0.1:30000"
        self.scrapes += 1
        return self.answers[min(self.scrapes, len(self.answers)) - 1]

    def sleep(self, seconds):
        self.clock.sleep(seconds)
        if self.exits_at is not None and self.clock.now >= self.exits_at - 1e-9 and self.proc.exists(500):
            self.proc.remove(500)

    def drain(self, timeout=120.0, pid=500):
        logged = []
        result = gpu_gate.drain(
            pid,
            "http://127.0.0.1:30000",
            timeout,
            host=gpu_gate.GateHost(
                kill=self.kill, scrape=self.scrape, proc_root=str(self.proc.root), clock=self.clock, sleep=self.sleep
            ),
            log=logged.append,
        )
        return result, logged


def test_drain_signals_the_main_process_alone_and_waits_for_its_exit(tmp_path):
    world = DrainWorld(tmp_path, [(16, 0), (3, 2), (0, 1), (0, 0)], exits_at=9.0)
    (drained, message), logged = world.drain()
    assert drained
    assert world.signals == [(500, gpu_gate.signal.SIGTERM)]
    assert message == "main process 500 exited after 9.0 s"
    # The gauges are logged every DRAIN_LOG_INTERVAL seconds, when they changed.
    assert logged == [
        "draining main process 500: 16 running, 0 queued",
        "draining main process 500: 3 running, 2 queued",
        "draining main process 500: 0 running, 1 queued",
        "draining main process 500: 0 running, 0 queued",
    ]
    assert set(world.clock.sleeps) == {gpu_gate.DRAIN_POLL_INTERVAL}


@pytest.mark.parametrize(
    "answers",
    [[(0, 0)], [(1, 0), (0, 0), (0, 0), (0, 0)], [None]],
    ids=["idle-gauges", "gauges-turn-idle", "no-metrics"],
)
def test_gauges_that_read_idle_never_end_the_wait(tmp_path, answers):
    """SGLang publishes its gauges every decode_log_interval decode steps and misses requests just admitted or
    still in the tokenizer: 0 running and 0 queued on any number of scrapes is no proof that nothing is in flight.
    Only the main process's exit (its own drain counts every request) ends the wait."""
    world = DrainWorld(tmp_path, answers, exits_at=6.3)
    (drained, message), _logged = world.drain()
    assert drained
    assert message == "main process 500 exited after 6.3 s"
    assert world.clock.now == pytest.approx(6.3)


def test_drain_without_a_url_only_waits_for_the_exit(tmp_path):
    world = DrainWorld(tmp_path, [(1, 0)], exits_at=1.0)
    result = gpu_gate.drain(
        500,
        None,
        10.0,
        host=gpu_gate.GateHost(
            kill=world.kill, scrape=world.scrape, proc_root=str(world.proc.root), clock=world.clock, sleep=world.sleep
        ),
    )
    assert result == (True, "main process 500 exited after 1.0 s")
    assert world.scrapes == 0


def test_drain_budget_ends_the_wait_and_names_what_was_in_flight(tmp_path):
    world = DrainWorld(tmp_path, [(4, 1)])
    (drained, message), _logged = world.drain(timeout=2.0)
    assert not drained
    assert message == (
        "main process 500 still draining after the budget of 2 s (last seen: 4 running, 1 queued); "
        "systemd stops the rest of the unit"
    )
    assert world.clock.now == pytest.approx(2.0)


def test_drain_without_a_main_process_returns_at_once(tmp_path):
    world = DrainWorld(tmp_path, [(1, 0)])
    (drained, message), _logged = world.drain(pid=0)
    assert drained and message == "no main process to drain"
    assert world.signals == [] and world.scrapes == 0


def test_drain_of_a_process_gone_before_the_signal(tmp_path):
    world = DrainWorld(tmp_path, [(1, 0)])

    def gone(pid, sig):
        raise ProcessLookupError

    world.kill = gone
    (drained, message), _logged = world.drain()
    assert drained and message == "main process 500 already gone"


def test_main_drain_reads_an_empty_mainpid_and_always_exits_0(monkeypatch):
    seen = {}

    def fake_drain(pid, url, timeout, log):
        seen.update(pid=pid, url=url, timeout=timeout)
        log("draining main process 7: 1 running, 0 queued")
        return False, "main process 7 still draining after the budget of 5 s; systemd stops the rest of the unit"

    monkeypatch.setattr(gpu_gate, "drain", fake_drain)
    out = io.StringIO()
    rc = gpu_gate.main(["drain", "--pid", "", "--url", "http://h:1", "--timeout", "5"], out, io.StringIO())
    assert rc == gpu_gate.EXIT_PASS
    assert seen == {"pid": 0, "url": "http://h:1", "timeout": 5.0}
    assert out.getvalue().splitlines() == [
        "llmops-gate drain: draining main process 7: 1 running, 0 queued",
        "llmops-gate drain: main process 7 still draining after the budget of 5 s; systemd stops the rest of the unit",
    ]


def test_scrape_in_flight_against_a_local_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = metrics(2.0, 0.0, 1.0).encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert gpu_gate.scrape_in_flight(f"http://127.0.0.1:{server.server_port}/") == (2, 1)
    finally:
        server.shutdown()
        server.server_close()
    assert gpu_gate.scrape_in_flight(f"http://127.0.0.1:{server.server_port}") is None


def test_main_drain_takes_no_url_from_units_that_name_none(monkeypatch):
    seen = {}
    monkeypatch.setattr(gpu_gate, "drain", lambda pid, url, timeout, log: seen.update(url=url) or (True, "ok"))
    assert gpu_gate.main(["drain", "--pid", "7", "--timeout", "5"], io.StringIO(), io.StringIO()) == 0
    assert seen == {"url": None}
