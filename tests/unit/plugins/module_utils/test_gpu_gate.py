"""gpu_gate: the GPU-free start gate and the readiness gate the sglang_service role installs."""

from __future__ import annotations

import http.server
import io
import threading

import pytest
from fake_nvml import MIG_A, MIG_B, NO_PERMISSION, NOT_SUPPORTED, Device, FakeNvml, mig_host
from fake_proc import FakeClock, FakeGpus, FakeKernel, FakeProc

from ansible_collections.llmops.inference.plugins.module_utils import gpu_gate
from ansible_collections.llmops.inference.plugins.module_utils.gpu import GpuQueryError
from ansible_collections.llmops.inference.plugins.module_utils.gpu_query import query_gpus


@pytest.fixture
def world(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    clock = FakeClock()
    kernel = FakeKernel(proc, clock)
    gpus = FakeGpus(proc, kernel, count=2)
    return proc, clock, kernel, gpus


def check(world, selectors=("0", "1"), threshold=1024, wait=0.0):
    proc, clock, _kernel, gpus = world
    return gpu_gate.check_gpus_free(
        list(selectors),
        threshold,
        wait,
        unit="sglang-qwen.service",
        host=gpu_gate.GateHost(query=gpus, proc_root=str(proc.root), clock=clock, sleep=clock.sleep),
    )


def test_free_gpus_pass(world):
    passed, message = check(world)
    assert passed
    assert message == "GPUs free for sglang-qwen.service (at most 1024 MiB held each): GPU 0 1 MiB, GPU 1 1 MiB"


def test_orphaned_scheduler_is_named_with_pid_title_and_memory(world):
    proc, _clock, _kernel, gpus = world
    proc.add(4242, ppid=1, argv=("sglang::scheduler_TP1",))
    gpus.claim(4242, 1, 44000)
    passed, message = check(world)
    assert not passed
    assert message.splitlines() == [
        "refusing to start sglang-qwen.service: 1 GPU(s) hold more than 1024 MiB",
        "GPU 1 (GPU-00000000-0000-4000-8000-000000000001) uses 44001 MiB: pid 4242 'sglang::scheduler_TP1' 44000 MiB",
    ]


def test_only_the_selected_gpus_count(world):
    proc, _clock, _kernel, gpus = world
    proc.add(4242, argv=("other",))
    gpus.claim(4242, 1, 44000)
    assert check(world, selectors=("0",))[0]


def test_memory_below_threshold_passes(world):
    proc, _clock, _kernel, gpus = world
    proc.add(77, argv=("Xorg",))
    gpus.claim(77, 0, 500)
    assert check(world)[0]


def test_waits_for_memory_released_late(world):
    proc, clock, kernel, gpus = world
    proc.add(4242, argv=("sglang::scheduler_TP0",))
    gpus.claim(4242, 0, 44000)
    gpus.release_lag = 3.0
    kernel.kill(4242, 9)
    passed, _message = check(world, wait=10)
    assert passed
    assert 3.0 <= clock.now < 4.0
    assert max(clock.sleeps) <= 0.2


def test_gives_up_after_the_wait(world):
    proc, clock, _kernel, gpus = world
    proc.add(4242, argv=("sglang::scheduler_TP0",))
    gpus.claim(4242, 0, 44000)
    passed, message = check(world, wait=2)
    assert not passed
    assert "pid 4242" in message
    assert clock.now == pytest.approx(2.0)


def test_holder_that_vanished_and_unknown_memory(world):
    _proc, _clock, _kernel, gpus = world
    gpus.claim(999, 0, None)
    gpus.stuck.add(999)  # listed by the driver, gone from /proc (or in another PID namespace)
    passed, message = check(world, threshold=0)
    assert not passed
    assert "pid 999 '?' unknown MiB" in message


def test_unknown_gpu_selector_raises(world):
    with pytest.raises(ValueError, match="unknown GPU '7'"):
        check(world, selectors=("7",))


def getter_from(answers):
    """A stand-in for http_status answering from a list: ints are statuses, strings refuse the connection."""
    calls = []

    def getter(url):
        calls.append(url)
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, str):
            raise ConnectionRefusedError(111, answer)
        return answer

    getter.calls = calls
    return getter


def test_ready_after_connection_refused_then_503_then_200(tmp_path):
    clock = FakeClock()
    getter = getter_from(["Connection refused", 503, 503, 200])
    ready, message = gpu_gate.wait_ready(
        "http://127.0.0.1:30000/health",
        60,
        host=gpu_gate.GateHost(getter=getter, proc_root=str(tmp_path), clock=clock, sleep=clock.sleep),
    )
    assert ready
    assert message == "http://127.0.0.1:30000/health healthy after 0.3 s"
    assert len(getter.calls) == 4


def test_not_ready_names_the_last_answer(tmp_path):
    clock = FakeClock()
    ready, message = gpu_gate.wait_ready(
        "http://h/health",
        1,
        host=gpu_gate.GateHost(getter=getter_from([503]), proc_root=str(tmp_path), clock=clock, sleep=clock.sleep),
    )
    assert not ready
    assert message == "http://h/health not healthy within 1 s (last answer: HTTP 503)"


def test_ready_stops_when_the_main_process_exits(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.add(500, argv=("python",))
    clock = FakeClock()

    def getter(url):
        if clock.now >= 1.0 and proc.exists(500):
            proc.remove(500)
        raise ConnectionRefusedError(111, "Connection refused")

    ready, message = gpu_gate.wait_ready(
        "http://h/health",
        600,
        main_pid=500,
        host=gpu_gate.GateHost(getter=getter, proc_root=str(proc.root), clock=clock, sleep=clock.sleep),
    )
    assert not ready
    assert message.startswith("main process 500 exited before http://h/health answered")
    assert clock.now < 2.0


def test_main_gpu_free_refusal_goes_to_stderr(monkeypatch, world):
    proc, _clock, _kernel, gpus = world
    proc.add(4242, argv=("sglang::scheduler_TP0",))
    gpus.claim(4242, 0, 44000)
    monkeypatch.setattr(gpu_gate, "query_gpus", gpus)
    out, err = io.StringIO(), io.StringIO()
    rc = gpu_gate.main(["gpu-free", "--gpus", "0,1", "--threshold-mib", "1024", "--unit", "u"], out, err)
    assert rc == gpu_gate.EXIT_REFUSED
    assert out.getvalue() == ""
    assert err.getvalue().startswith("llmops-gate gpu-free: refusing to start u: 1 GPU(s) hold more than 1024 MiB\n")
    assert "pid 4242" in err.getvalue()


def test_main_reports_a_query_error(monkeypatch):
    def broken(selectors, *args, **kwargs):
        raise GpuQueryError("no GPU backend worked: NVML: x; nvidia-smi: y")

    monkeypatch.setattr(gpu_gate, "check_gpus_free", broken)
    err = io.StringIO()
    rc = gpu_gate.main(["gpu-free", "--gpus", "0", "--threshold-mib", "1"], io.StringIO(), err)
    assert rc == gpu_gate.EXIT_ERROR
    assert err.getvalue() == "llmops-gate gpu-free: no GPU backend worked: NVML: x; nvidia-smi: y\n"


def test_main_ready_passes_to_stdout(monkeypatch):
    monkeypatch.setattr(gpu_gate, "wait_ready", lambda url, timeout, pid: (True, f"{url} healthy after 1.0 s"))
    monkeypatch.setenv("MAINPID", "321")
    out = io.StringIO()
    rc = gpu_gate.main(["ready", "--url", "http://h/health", "--timeout", "5"], out, io.StringIO())
    assert rc == gpu_gate.EXIT_PASS
    assert out.getvalue() == "llmops-gate ready: http://h/health healthy after 1.0 s\n"


def test_main_ready_takes_mainpid_from_the_environment(monkeypatch):
    seen = {}

    def fake_wait(url, timeout, pid):
        seen["pid"] = pid
        return False, "x"

    monkeypatch.setattr(gpu_gate, "wait_ready", fake_wait)
    monkeypatch.setenv("MAINPID", "321")
    assert gpu_gate.main(["ready", "--url", "http://h/health", "--timeout", "5"], io.StringIO(), io.StringIO()) == 1
    assert seen["pid"] == 321


def test_refused_connection_reason_is_readable(tmp_path):
    clock = FakeClock()
    ready, message = gpu_gate.wait_ready(
        "http://h/health",
        0.4,
        host=gpu_gate.GateHost(
            getter=getter_from(["Connection refused"]), proc_root=str(tmp_path), clock=clock, sleep=clock.sleep
        ),
    )
    assert not ready
    assert message == "http://h/health not healthy within 0.4 s (last answer: [Errno 111] Connection refused)"


def test_http_status_against_a_local_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        assert gpu_gate.http_status(base + "/health") == 200
        assert gpu_gate.health_status(base + "/other") == "HTTP 503"
    finally:
        server.shutdown()
        server.server_close()
    assert "refused" in gpu_gate.health_status(base + "/health").lower()


def nvml_query(host):
    return lambda backend="auto": query_gpus("nvml", nvml=FakeNvml(host))


def test_a_mig_device_is_gated_on_its_own_memory(tmp_path):
    clock = FakeClock()
    fake = FakeProc(tmp_path / "proc")
    fake.add(4242, argv=("sglang::scheduler_TP0",))

    def gate(selectors):
        return gpu_gate.check_gpus_free(
            selectors,
            1024,
            unit="u",
            host=gpu_gate.GateHost(query=nvml_query(mig_host()), proc_root=str(fake.root), clock=clock),
        )

    assert gate([MIG_B]) == (True, "GPUs free for u (at most 1024 MiB held each): GPU 0 MIG device 2 13 MiB")
    passed, message = gate([MIG_A])
    assert not passed
    assert message.splitlines()[1] == (
        f"GPU 0 MIG device 0 ({MIG_A}) uses 30013 MiB: pid 4242 'sglang::scheduler_TP0' 30000 MiB"
    )


def test_refusal_marks_zombies_and_unknown_fields(tmp_path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(50, argv=("sglang::scheduler",), ppid=49, state="Z")
    host = [Device("A10", "GPU-a", 23028, 20001, [(50, 20000)]), Device("A10", "GPU-b", 23028, 9000)]
    host[1].fail = {"memory": NOT_SUPPORTED, "processes": NO_PERMISSION}
    passed, message = gpu_gate.check_gpus_free(
        ["0", "1"], 1024, unit="u", host=gpu_gate.GateHost(query=nvml_query(host), proc_root=str(fake.root))
    )
    assert not passed
    assert message.splitlines()[1:] == [
        "GPU 0 (GPU-a) uses 20001 MiB: pid 50 'sglang::scheduler' 20000 MiB (zombie, parent 49: memory still held)",
        "GPU 1 (GPU-b) uses unknown memory (Not Supported): process list unavailable (Insufficient Permissions)",
    ]


@pytest.mark.parametrize("reserved", [600, 1536])
def test_a_boards_reservation_is_no_holder_but_a_2_gib_foreign_holder_is(world, reserved):
    proc, _clock, _kernel, gpus = world
    gpus.reserved_mib = reserved  # NVML v1 counts it as used; v2 reports it apart
    passed, message = check(world)
    assert passed, message
    assert message == (
        f"GPUs free for sglang-qwen.service (at most 1024 MiB held each): GPU 0 1 MiB beyond the driver's {reserved} "
        f"MiB reservation, GPU 1 1 MiB beyond the driver's {reserved} MiB reservation"
    )
    proc.add(4242, ppid=1, argv=("python3", "train.py"))
    gpus.claim(4242, 1, 2048)
    passed, message = check(world)
    assert not passed
    assert message.splitlines() == [
        "refusing to start sglang-qwen.service: 1 GPU(s) hold more than 1024 MiB",
        f"GPU 1 (GPU-00000000-0000-4000-8000-000000000001) uses 2049 MiB beyond the driver's {reserved} MiB "
        "reservation: pid 4242 'python3' 2048 MiB",
    ]
