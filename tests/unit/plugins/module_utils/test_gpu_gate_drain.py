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
            kill=self.kill,
            scrape=self.scrape,
            proc_root=str(self.proc.root),
            clock=self.clock,
            sleep=self.sleep,
            log=logged.append,
        )
        return result, logged


def test_drain_signals_the_main_process_alone_and_waits_while_requests_run(tmp_path):
    world = DrainWorld(tmp_path, [(16, 0), (16, 0), (3, 2), (0, 1), (0, 0), (0, 0)])
    (drained, message), logged = world.drain()
    assert drained
    assert world.signals == [(500, gpu_gate.signal.SIGTERM)]
    assert message == "no running or queued request after 1.0 s; main process 500 still exiting"
    assert logged == [
        "draining main process 500: 16 running, 0 queued",
        "draining main process 500: 3 running, 2 queued",
        "draining main process 500: 0 running, 1 queued",
        "draining main process 500: 0 running, 0 queued",
    ]
    assert set(world.clock.sleeps) == {gpu_gate.DRAIN_POLL_INTERVAL}


def test_an_idle_engine_drains_in_one_poll_interval(tmp_path):
    world = DrainWorld(tmp_path, [(0, 0)])
    (drained, _message), _logged = world.drain()
    assert drained
    assert world.clock.now == pytest.approx(gpu_gate.DRAIN_POLL_INTERVAL)


def test_one_idle_scrape_between_busy_ones_does_not_end_the_drain(tmp_path):
    world = DrainWorld(tmp_path, [(1, 0), (0, 0), (1, 0), (0, 0), (0, 0)])
    (drained, _message), _logged = world.drain()
    assert drained
    assert world.scrapes == 5


def test_drain_ends_when_the_main_process_exits(tmp_path):
    world = DrainWorld(tmp_path, [(2, 0)], exits_at=1.0)
    (drained, message), _logged = world.drain()
    assert drained
    assert message == "main process 500 exited after 1.0 s"


def test_without_metrics_the_drain_waits_for_the_exit(tmp_path):
    world = DrainWorld(tmp_path, [None], exits_at=3.0)
    (drained, message), logged = world.drain()
    assert drained
    assert message.startswith("main process 500 exited after 3.0 s")
    assert logged == ["draining main process 500: no /metrics"]


def test_drain_budget_ends_the_wait_and_names_what_was_in_flight(tmp_path):
    world = DrainWorld(tmp_path, [(4, 1)])
    (drained, message), _logged = world.drain(timeout=2.0)
    assert not drained
    assert message == "drain budget of 2 s spent with 4 running, 1 queued; systemd stops the rest of the unit"
    assert world.clock.now == pytest.approx(2.0)


def test_drain_without_a_main_process_returns_at_once(tmp_path):
    world = DrainWorld(tmp_path, [(1, 0)])
    (drained, message), _logged = world.drain(pid=0)
    assert drained and message == "no main process to drain"
    assert world.signals == [] and world.scrapes == 0


def test_main_drain_reads_an_empty_mainpid_and_always_exits_0(monkeypatch):
    seen = {}

    def fake_drain(pid, url, timeout, log):
        seen.update(pid=pid, url=url, timeout=timeout)
        log("draining main process 7: 1 running, 0 queued")
        return False, "drain budget of 5 s spent with 1 running, 0 queued; systemd stops the rest of the unit"

    monkeypatch.setattr(gpu_gate, "drain", fake_drain)
    out = io.StringIO()
    rc = gpu_gate.main(["drain", "--pid", "", "--url", "http://h:1", "--timeout", "5"], out, io.StringIO())
    assert rc == gpu_gate.EXIT_PASS
    assert seen == {"pid": 0, "url": "http://h:1", "timeout": 5.0}
    assert out.getvalue().splitlines() == [
        "llmops-gate drain: draining main process 7: 1 running, 0 queued",
        "llmops-gate drain: drain budget of 5 s spent with 1 running, 0 queued; systemd stops the rest of the unit",
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
