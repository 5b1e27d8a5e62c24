"""gpu_gate drain: the unit's ExecStop sends SIGTERM to SGLang's main process alone and waits for its requests."""

from __future__ import annotations

import http.server
import io
import threading

import pytest
from fake_proc import FakeClock, FakeProc

from ansible_collections.llmops.inference.plugins.module_utils import gpu_gate
from ansible_collections.llmops.inference.plugins.module_utils.in_flight import (
    SOURCE_HTTP,
    SOURCE_SCHEDULER,
    InFlight,
    in_flight_of_text,
)

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


def test_without_the_http_gauge_the_scheduler_gauges_are_summed_over_every_series():
    assert in_flight_of_text(metrics(3.0, 2.0, 4.0)) == InFlight(SOURCE_SCHEDULER, 9, 5, 4)
    assert in_flight_of_text(metrics()) == InFlight(SOURCE_SCHEDULER, 0, 0, 0)
    assert in_flight_of_text("sglang:gen_throughput 1.0\n") is None
    assert in_flight_of_text("") is None


def gauge(name: str, value: float) -> InFlight:
    return (
        InFlight(SOURCE_HTTP, int(value)) if name == "http" else InFlight(SOURCE_SCHEDULER, int(value), int(value), 0)
    )


class DrainWorld:
    """A main process in a fake /proc, a scripted /metrics, and the signals sent."""

    def __init__(self, tmp_path, answers, exits_at=None, abort_answer=None, exits_after_abort=None):
        self.proc = FakeProc(tmp_path / "proc")
        self.proc.add(500, argv=("python",))
        self.clock = FakeClock()
        self.answers = [self._reading(answer) for answer in answers]
        self.exits_at = exits_at
        self.signals = []
        self.scrapes = 0
        self.aborts = []
        self.abort_answer = abort_answer
        self.exits_after_abort = exits_after_abort

    @staticmethod
    def _reading(answer):
        if isinstance(answer, tuple):  # (running, queued): an engine without sglang:http_requests_active
            return InFlight(SOURCE_SCHEDULER, sum(answer), *answer)
        return answer

    def abort(self, url, api_key):
        self.aborts.append((url, api_key, self.clock.now))
        if self.abort_answer is None and self.exits_after_abort is not None:
            self.exits_at = self.clock.now + self.exits_after_abort
        return self.abort_answer

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

    def drain(self, timeout=120.0, pid=500, tail=0.0):
        logged = []
        result = gpu_gate.drain(
            pid,
            "http://127.0.0.1:30000",
            gpu_gate.StopBudget(timeout, tail),
            host=gpu_gate.GateHost(
                kill=self.kill,
                scrape=self.scrape,
                proc_root=str(self.proc.root),
                clock=self.clock,
                sleep=self.sleep,
                abort=self.abort,
                api_key="k3y",
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
    tail = " (scheduler gauges; sglang:http_requests_active not exported)"
    assert logged == [
        "draining main process 500: 16 running, 0 queued" + tail,
        "draining main process 500: 3 running, 2 queued" + tail,
        "draining main process 500: 0 running, 1 queued" + tail,
        "draining main process 500: 0 running, 0 queued" + tail,
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


def test_the_drain_log_says_it_waited_on_http_requests_active(tmp_path):
    world = DrainWorld(tmp_path, [InFlight(SOURCE_HTTP, 3, 0, 0), InFlight(SOURCE_HTTP, 0, 0, 0)], exits_at=4.0)
    (drained, _message), logged = world.drain()
    assert drained
    assert logged == [
        "draining main process 500: 3 HTTP request(s) active (sglang:http_requests_active)",
        "draining main process 500: 0 HTTP request(s) active (sglang:http_requests_active)",
    ]


def test_at_the_end_of_the_budget_requests_left_are_aborted_and_sglang_shuts_down_cleanly(tmp_path):
    world = DrainWorld(tmp_path, [InFlight(SOURCE_HTTP, 1)], exits_after_abort=6.0)
    (drained, message), logged = world.drain(timeout=20.0, tail=27.0)
    assert drained
    assert world.aborts == [("http://127.0.0.1:30000", "k3y", pytest.approx(20.0))]
    assert world.signals == [(500, gpu_gate.signal.SIGTERM)]  # no second signal: SGLang's own shutdown ends it
    assert message == "main process 500 exited after 26.0 s, its requests aborted at the end of the drain budget"
    assert logged[-1] == (
        "main process 500 still draining after the budget of 20 s (last seen: 1 HTTP request(s) active "
        "(sglang:http_requests_active)); aborted every request (POST /abort_request abort_all): waiting up to 27 s "
        "for SGLang's shutdown"
    )


def test_an_engine_whose_requests_are_all_answered_gets_the_tail_without_an_abort(tmp_path):
    world = DrainWorld(tmp_path, [InFlight(SOURCE_HTTP, 0)], exits_at=23.0)
    (drained, message), _logged = world.drain(timeout=20.0, tail=27.0)
    assert drained and world.aborts == []
    assert message == "main process 500 exited after 23.0 s"


def test_an_engine_that_refuses_the_abort_is_left_to_systemd(tmp_path):
    world = DrainWorld(tmp_path, [(4, 1)], abort_answer="timed out")
    (drained, message), _logged = world.drain(timeout=2.0, tail=27.0)
    assert not drained
    assert message == (
        "main process 500 still draining after the budget of 2 s (last seen: 4 running, 1 queued (scheduler gauges; "
        "sglang:http_requests_active not exported)); POST /abort_request failed (timed out): the engine is not "
        "answering, systemd stops the rest of the unit"
    )
    assert world.clock.now == pytest.approx(2.0)


def test_a_shutdown_that_outlasts_the_tail_is_left_to_systemd(tmp_path):
    world = DrainWorld(tmp_path, [(1, 0)], exits_after_abort=60.0)
    (drained, message), _logged = world.drain(timeout=2.0, tail=5.0)
    assert not drained and len(world.aborts) == 1
    assert message == (
        "main process 500 still running 7.0 s after the SIGTERM, its requests aborted at the end of the drain budget; "
        "systemd stops the rest of the unit"
    )


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

    def fake_drain(pid, url, budget, host, log):
        seen.update(pid=pid, url=url, timeout=budget.drain, tail=budget.tail, key=host.api_key)
        log("draining main process 7: 1 running, 0 queued")
        return False, "main process 7 still draining after the budget of 5 s; systemd stops the rest of the unit"

    monkeypatch.setattr(gpu_gate, "drain", fake_drain)
    out = io.StringIO()
    rc = gpu_gate.main(["drain", "--pid", "", "--url", "http://h:1", "--timeout", "5"], out, io.StringIO())
    assert rc == gpu_gate.EXIT_PASS
    assert seen == {"pid": 0, "url": "http://h:1", "timeout": 5.0, "tail": 0.0, "key": None}
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
        assert gpu_gate.scrape_in_flight(f"http://127.0.0.1:{server.server_port}/") == InFlight(
            SOURCE_SCHEDULER, 3, 2, 1
        )
    finally:
        server.shutdown()
        server.server_close()
    assert gpu_gate.scrape_in_flight(f"http://127.0.0.1:{server.server_port}") is None


def test_main_drain_takes_no_url_from_units_that_name_none(monkeypatch):
    seen = {}
    monkeypatch.setattr(gpu_gate, "drain", lambda pid, url, budget, host, log: seen.update(url=url) or (True, "ok"))
    assert gpu_gate.main(["drain", "--pid", "7", "--timeout", "5"], io.StringIO(), io.StringIO()) == 0
    assert seen == {"url": None}


def test_main_drain_reads_the_key_from_sglangs_config_and_the_tail(monkeypatch, tmp_path):
    config = tmp_path / "sglang.yaml"
    config.write_text('# managed\napi-key: "s3cr\\"et"\n')
    seen = {}

    def fake_drain(pid, url, budget, host, log):
        seen.update(tail=budget.tail, key=host.api_key)
        return True, "ok"

    monkeypatch.setattr(gpu_gate, "drain", fake_drain)
    argv = ["drain", "--pid", "7", "--url", "http://h:1", "--timeout", "5", "--tail", "27", "--config", str(config)]
    assert gpu_gate.main(argv, io.StringIO(), io.StringIO()) == 0
    assert seen == {"tail": 27.0, "key": 's3cr"et'}
    err = io.StringIO()
    argv[-1] = str(tmp_path / "missing.yaml")
    assert gpu_gate.main(argv, io.StringIO(), err) == gpu_gate.EXIT_ERROR
    assert "--config" in err.getvalue() and "missing.yaml" in err.getvalue()


def test_abort_all_posts_abort_all_with_the_key():
    seen = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            seen.update(path=self.path, body=self.rfile.read(length), auth=self.headers.get("authorization"))
            self.send_response(200 if self.headers.get("authorization") == "Bearer k" else 401)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert gpu_gate.abort_all(url, "k") is None
        assert seen == {"path": "/abort_request", "body": b'{"abort_all": true}', "auth": "Bearer k"}
        assert gpu_gate.abort_all(url, None) == "HTTP 401"
    finally:
        server.shutdown()
        server.server_close()
    assert gpu_gate.abort_all(url, "k") is not None  # nobody answers
