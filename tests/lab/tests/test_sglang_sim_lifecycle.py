"""sglang_sim's processes as SGLang 0.5.23's: signals, the drain, the health check, placement, config, JIT, faults.

Each test names the real behaviour it pins; tests/lab/README.md cites the source file for each.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sim_support import API_KEY, FAST, Sim, claims, generate, held

SLOW = ["--sim-token-latency-ms", "20"]


def stream(sim: Sim, tokens: int, result: dict, key: str, timeout: float = 60, **headers) -> None:
    """Stream one generation; result[key] is (status, chunk count, completion tokens, saw [DONE]) or the error."""
    body = json.dumps({"text": "Tell me about the lab.", "stream": True, "sampling_params": {"max_new_tokens": tokens}})
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=timeout)
    try:
        conn.request("POST", "/generate", body, {"content-type": "application/json", **headers})
        response = conn.getresponse()
        chunks, last, done = 0, None, False
        for raw in response:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks += 1
                last = json.loads(line[6:])
                result.setdefault(key + ":first", time.monotonic())
        result[key] = (response.status, chunks, last["meta_info"]["completion_tokens"] if last else 0, done)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result[key] = exc.__class__(str(exc))  # no traceback: it would keep the connection open
    finally:
        conn.close()  # a client that gives up hangs up


def wait_for(predicate, timeout: float = 10.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def metric(sim: Sim, name: str) -> float:
    text = sim.get("/metrics")[1].decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    return sum(values)


def scheduler_pids(sim: Sim) -> list[int]:
    return sorted(pid for pid, cmd in sim.children().items() if cmd.startswith("sglang::scheduler"))


# -- signals and the drain ------------------------------------------------------------------------------------
def test_sigterm_to_every_process_drops_in_flight_requests_and_ends_killed(start, lab_env):
    """systemctl stop with KillMode=control-group: the children die at once; the watchdog kills the tree."""
    sim = start("--tp-size", "2", *SLOW, *FAST)
    result: dict = {}
    worker = threading.Thread(target=stream, args=(sim, 200, result, "long"))
    worker.start()
    assert wait_for(lambda: "long:first" in result)
    stopped = time.monotonic()
    os.killpg(sim.proc.pid, signal.SIGTERM)
    code, err = sim.finish()
    elapsed = time.monotonic() - stopped
    worker.join(10)
    assert code == -signal.SIGKILL, err
    assert elapsed < 3.0, elapsed
    assert re.search(r"Subprocess \w+ \(pid=\d+\) crashed with exit code -15\. Triggering SIGQUIT for cleanup", err)
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in err
    outcome = result["long"]
    assert isinstance(outcome, Exception) or not outcome[3], outcome  # the stream was cut: no [DONE]
    assert sim.children_gone(), sim.children()


def test_sigterm_to_the_main_process_drains_every_request_and_admits_new_ones(start, lab_env):
    sim = start("--tp-size", "2", "--enable-metrics", *SLOW, *FAST)
    result: dict = {}
    workers = [threading.Thread(target=stream, args=(sim, 300, result, f"r{i}")) for i in range(3)]
    for worker in workers:
        worker.start()
    assert wait_for(lambda: all(f"r{i}:first" in result for i in range(3)))
    sim.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: "Draining requests and shutting down" in sim.log, timeout=2)
    assert sim.get("/health")[0] == 503 and sim.get("/ready")[0] == 503
    late = threading.Thread(target=stream, args=(sim, 20, result, "late"))
    late.start()
    for worker in [*workers, late]:
        worker.join(30)
    code, err = sim.finish()
    assert code == 0, err
    for key in ("r0", "r1", "r2"):
        assert result[key] == (200, 300, 300, True), result[key]
    assert result["late"] == (200, 20, 20, True), result["late"]  # admitted while draining
    assert "Health check request received during shutdown. Returning 503." in err
    counts = [int(n) for n in re.findall(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)\.", err)]
    assert counts[0] >= 1 and counts[-1] == 0, counts
    order = ["Gracefully exiting", "kill_process_tree called", "Shutting down", "Finished server process"]
    assert [err.index(line) for line in order] == sorted(err.index(line) for line in order)
    assert sim.children_gone(), sim.children()
    assert held(lab_env) == {}


def sigterm_a_second_after_a_request(sim: Sim) -> float:
    """One request (the handle loop and its SIGTERM watchdog start with it), SIGTERM a second later; the seconds
    until the process exited, once it exited 0 from an empty drain."""
    assert generate(sim, 1)[0] == 200
    time.sleep(1.0)
    stopped = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    code, err = sim.finish()
    elapsed = time.monotonic() - stopped
    assert code == 0, err
    assert "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in err
    return elapsed


def test_the_drain_notices_sigterm_on_its_five_second_ticks(start):
    elapsed = sigterm_a_second_after_a_request(start(*FAST))
    assert 2.5 <= elapsed <= 6.5, elapsed


def test_a_shorter_sigterm_poll_notices_sigterm_sooner_and_drains_alike(start):
    """The knob test labs use to compress time: the same drain, on 0.2 s ticks instead of SGLang's 5 s."""
    elapsed = sigterm_a_second_after_a_request(start(*FAST, "--sim-sigterm-poll", "0.2"))
    assert elapsed < 3.0, elapsed  # on 5 s ticks the watchdog would look only about 4 s after the SIGTERM


def test_before_the_first_request_sigterm_is_uvicorns(start):
    """No request has reached TokenizerManager: uvicorn shuts down and re-raises SIGTERM."""
    sim = start("--skip-server-warmup", *FAST)
    sim.proc.send_signal(signal.SIGTERM)
    code, err = sim.finish()
    assert code == -signal.SIGTERM, err
    assert "Shutting down" in err and "Finished server process" in err and "Gracefully exiting" not in err
    assert wait_for(lambda: sim.children() == {}, timeout=2)


def test_slow_drain_is_a_long_request_a_sigterm_finds(start):
    sim = start("--sim-fault", "slow-drain", "--sim-drain-time", "2", *FAST)
    stopped = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    code, err = sim.finish()
    assert code == 0 and time.monotonic() - stopped >= 2
    assert "Remaining number of requests 1. Remaining requests remaining_rids=['slow-drain']." in err


def test_the_drain_waits_with_no_upper_bound_for_a_request_that_never_ends(start):
    sim = start("--sim-fault", "generate-hang", *FAST)
    with pytest.raises(OSError):
        generate(sim, 4, timeout=1)  # the client gives up; the stuck scheduler never acknowledges the abort
    sim.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: sim.log.count("Remaining number of requests 1.") >= 2, timeout=12)
    assert sim.proc.poll() is None


def test_sgl_force_shutdown_skips_the_drain(start):
    sim = start(*SLOW, *FAST, env={"SGL_FORCE_SHUTDOWN": "1"})
    result: dict = {}
    worker = threading.Thread(target=stream, args=(sim, 300, result, "cut", 3))
    worker.start()
    assert wait_for(lambda: "cut:first" in result)
    sim.proc.send_signal(signal.SIGTERM)
    code, err = sim.finish()
    worker.join(10)
    assert code == 0
    assert "Signal SIGTERM received while force shutdown flag set. Force exiting." in err
    # The schedulers left, the request never finished: uvicorn waited until its client gave up.
    assert "Waiting for connections to close." in err
    assert isinstance(result["cut"], Exception)


def test_children_have_no_sigterm_handler_and_a_dead_one_takes_the_server_down(start):
    sim = start("--tp-size", "2", *FAST)
    assert generate(sim, 1)[0] == 200
    os.kill(scheduler_pids(sim)[1], signal.SIGTERM)
    code, err = sim.finish()
    assert code == -signal.SIGKILL
    assert re.search(r"Subprocess scheduler_1 \(pid=\d+\) crashed with exit code -15", err)


def test_children_die_with_their_parent(start, lab_env):
    sim = start("--tp-size", "2", *FAST, env={"SIMGPU_RELEASE_LAG_MS": "60000"})
    children = list(sim.children())
    before = held(lab_env | {"SIMGPU_RELEASE_LAG_MS": "60000"})
    os.kill(sim.proc.pid, signal.SIGKILL)
    sim.proc.wait()
    assert wait_for(lambda: sim.children() == {}, timeout=1.0), children
    # Killed (parent-death SIGKILL), not exited: the claims stay until the driver releases them.
    assert before and set(claims(lab_env)) >= set(before)


# -- the health check ----------------------------------------------------------------------------------------
def timed_get(sim: Sim, path: str, timeout: float = 30) -> tuple[int, float]:
    started = time.monotonic()
    status = sim.get(path, timeout=timeout)[0]
    return status, time.monotonic() - started


def test_health_generates_by_default_and_takes_a_second(start):
    sim = start(*FAST, env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": None})
    status, took = timed_get(sim, "/health")
    assert status == 200 and 0.95 <= took < 2.0, took
    status, took = timed_get(sim, "/health_generate")
    assert status == 200 and took >= 0.95


def test_health_without_generation_answers_at_once(start):
    sim = start(*FAST, env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"})
    status, took = timed_get(sim, "/health")
    assert status == 200 and took < 0.95  # below the generation's 1 s tick: a busy machine's slowness is no failure
    assert timed_get(sim, "/health_generate")[1] >= 0.95  # the env only concerns /health


def test_health_is_503_while_starting(start):
    sim = start(
        "--sim-load-time",
        "0.3",
        "--sim-warmup-time",
        "3",
        healthy=False,
        env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": None},
    )
    sim.wait_listening()
    status, took = timed_get(sim, "/health")
    assert status == 503 and took < 0.95  # at once: no generation's 1 s tick


def test_health_fails_after_its_timeout_when_generation_is_stuck(start):
    sim = start(
        "--sim-fault",
        "generate-hang",
        "--enable-metrics",
        *FAST,
        env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": None, "SGLANG_HEALTH_CHECK_TIMEOUT": "2"},
    )
    with pytest.raises(OSError):
        generate(sim, 4, timeout=0.5)
    assert sim.get("/ready")[0] == 200
    status, took = timed_get(sim, "/health")
    assert status == 503 and 2.0 <= took < 3.5, took
    failed = "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds."
    assert wait_for(lambda: failed in sim.log, timeout=2)
    assert sim.get("/ready")[0] == 503  # UnHealthy now
    assert sim.get("/model_info")[0] == 200 and sim.get("/v1/models")[0] == 200
    with pytest.raises(OSError):
        sim.get("/server_info", timeout=1)  # GetInternalStateReq waits for the stuck scheduler
    assert metric(sim, "sglang:num_running_reqs") == 1
    sim.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: "while health check failed. Force exiting." in sim.log, timeout=7)


def test_health_is_answered_while_a_long_request_runs(start):
    sim = start(*SLOW, *FAST, env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": None})
    result: dict = {}
    worker = threading.Thread(target=stream, args=(sim, 150, result, "long"))
    worker.start()
    assert wait_for(lambda: "long:first" in result)
    status, took = timed_get(sim, "/health")
    assert status == 200 and took < 2.0
    worker.join(30)


# -- the scheduler's gauges --------------------------------------------------------------------------------------
def test_gauges_miss_a_request_until_decode_log_interval_decode_steps(start):
    """SGLang publishes num_running_reqs at a prefill without the batch just admitted, then every
    decode_log_interval decode steps: a request that reaches an idle engine reads 0 running, 0 queued."""
    # 100 steps of 20 ms: the gauges hold the idle values for 2 s after the prefill, room enough for a loaded
    # machine to read them (40 steps, SGLang's default, left 0.8 s), and show the request from 2 s to 5 s.
    sim = start("--enable-metrics", "--sim-token-latency-ms", "20", "--decode-log-interval", "100", *FAST)
    result: dict = {}
    worker = threading.Thread(target=stream, args=(sim, 250, result, "r"))
    worker.start()
    assert wait_for(lambda: "r:first" in result)
    assert (metric(sim, "sglang:num_running_reqs"), metric(sim, "sglang:num_queue_reqs")) == (0, 0)
    assert wait_for(lambda: metric(sim, "sglang:num_running_reqs") == 1, timeout=6)
    worker.join(30)
    assert result["r"] == (200, 250, 250, True)
    # Idle: the scheduler publishes at once when the gauge disagrees with its empty batch.
    assert metric(sim, "sglang:num_running_reqs") == 0


def test_a_short_decode_log_interval_publishes_sooner(start):
    sim = start("--enable-metrics", "--sim-token-latency-ms", "20", "--decode-log-interval", "1", *FAST)
    result: dict = {}
    worker = threading.Thread(target=stream, args=(sim, 100, result, "r"))
    worker.start()
    assert wait_for(lambda: "r:first" in result)
    assert wait_for(lambda: metric(sim, "sglang:num_running_reqs") == 1, timeout=0.5)
    worker.join(30)


def test_realtime_tokens_grow_at_every_decode_step_while_generation_tokens_wait_for_the_end(start):
    """SGLang counts realtime_tokens_total{mode="decode"} at every decode step (metrics_reporter.py,
    report_decode_stats), generation_tokens_total only when a request finishes: a slow request shows progress in
    the first, not the second."""
    sim = start("--enable-metrics", "--sim-token-latency-ms", "50", "--decode-log-interval", "40", *FAST)
    generated = metric(sim, "sglang:generation_tokens_total")  # the warm-up's
    result: dict = {}
    worker = threading.Thread(target=stream, args=(sim, 100, result, "r"))
    worker.start()
    assert wait_for(lambda: "r:first" in result)
    decoded = metric(sim, "sglang:realtime_tokens_total")
    assert wait_for(lambda: metric(sim, "sglang:realtime_tokens_total") >= decoded + 5, timeout=3)
    assert metric(sim, "sglang:generation_tokens_total") == generated
    worker.join(30)
    assert result["r"] == (200, 100, 100, True)
    assert metric(sim, "sglang:generation_tokens_total") == generated + 100


# -- faults that stop progress -------------------------------------------------------------------------------
def test_hang_after_requests_serves_n_generations_then_hangs(start):
    sim = start("--sim-fault", "hang-after-requests=3", "--enable-metrics", *FAST)
    for _attempt in range(3):
        assert generate(sim, 4)[0] == 200
    tokens = metric(sim, "sglang:generation_tokens_total")
    with pytest.raises(OSError):
        generate(sim, 4, timeout=1)
    assert sim.get("/health")[0] == 200  # without health generation a stuck engine still looks healthy
    assert sim.get("/model_info")[0] == 200
    assert metric(sim, "sglang:num_running_reqs") == 1
    time.sleep(0.3)
    assert metric(sim, "sglang:generation_tokens_total") == tokens


def test_progress_stall_queues_requests_while_no_token_is_made(start):
    sim = start(
        "--sim-fault",
        "progress-stall",
        "--max-running-requests",
        "1",
        "--enable-metrics",
        *FAST,
        env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": None},
    )
    tokens = metric(sim, "sglang:generation_tokens_total")
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(generate, sim, 4, 2.5) for _request in range(3)]
        assert wait_for(
            lambda: (metric(sim, "sglang:num_running_reqs"), metric(sim, "sglang:num_queue_reqs")) == (1, 2)
        )
        assert timed_get(sim, "/health")[0] == 200  # the scheduler's loop is alive and answers health checks
        assert metric(sim, "sglang:generation_tokens_total") == tokens
        for future in futures:
            with pytest.raises(OSError):
                future.result()
    # The clients gave up; the live scheduler acknowledges the aborts within a poll (4 s).
    assert wait_for(lambda: metric(sim, "sglang:num_running_reqs") + metric(sim, "sglang:num_queue_reqs") == 0, 10)


def test_a_fault_value_is_checked(start):
    sim = start("--sim-fault", "hang-after-requests", *FAST, healthy=False)
    code, err = sim.finish()
    assert code == 2 and "fault 'hang-after-requests' needs a value: hang-after-requests=N" in err


# -- placement ------------------------------------------------------------------------------------------------
def gpus_claimed(lab_env) -> list[str]:
    return sorted(name.split(".pid")[0] for name in held(lab_env))


@pytest.mark.parametrize(
    ("argv", "visible", "expected"),
    [
        ([], None, ["gpu0"]),
        (["--base-gpu-id", "1"], None, ["gpu1"]),
        ([], "1", ["gpu1"]),
        ([], "GPU-0001", ["gpu1"]),  # a unique UUID prefix is enough
        (["--tp-size", "2"], "1,0", ["gpu0", "gpu1"]),
    ],
)
def test_the_engine_uses_the_gpus_cuda_would_give_it(start, lab_env, argv, visible, expected):
    start(*argv, *FAST, env={"CUDA_VISIBLE_DEVICES": visible})
    assert gpus_claimed(lab_env) == expected


def test_a_mig_uuid_places_the_engine_on_that_mig_device(start, lab_env):
    state = Path(lab_env["SIMGPU_STATE_DIR"])
    (state / "mig").write_text("0\t0\tMIG-aaaa-0\t40320\t3g.40gb\t1\t0\n0\t1\tMIG-bbbb-1\t40320\t3g.40gb\t2\t0\n")
    start(*FAST, env={"CUDA_VISIBLE_DEVICES": "MIG-bbbb"})
    ((name, mib),) = held(lab_env).items()
    assert name.startswith("gpu0.mig1.pid") and mib <= 40320


@pytest.mark.parametrize(
    ("argv", "visible", "message"),
    [
        (["--tp-size", "2"], "1", "torch.AcceleratorError: CUDA error: invalid device ordinal"),
        ([], "", "RuntimeError: No CUDA GPUs are available"),
        ([], "0,0", "RuntimeError: No CUDA GPUs are available"),  # a repeated ordinal hides every GPU
    ],
)
def test_a_gpu_cuda_cannot_see_fails_the_load(start, argv, visible, message):
    sim = start(*argv, *FAST, env={"CUDA_VISIBLE_DEVICES": visible}, healthy=False)
    code, err = sim.finish()
    assert code == -signal.SIGKILL
    assert "Scheduler hit an exception" in err and message in err
    if "ordinal" in message:
        assert "Context: self.device='cuda' get_device().gpu_id=1 os.environ.get('CUDA_VISIBLE_DEVICES')='1'" in err


# -- --config ---------------------------------------------------------------------------------------------------
def write_config(tmp_path: Path, text: str, name: str = "sglang.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_the_api_key_can_come_from_a_config_file_and_stays_out_of_argv(start, tmp_path):
    config = write_config(tmp_path, f"# service config\napi-key: {API_KEY}\nenable-metrics: true\nport: 1\n")
    sim = start("--config", str(config), *FAST)  # the command line's --port (after the file) wins
    assert API_KEY not in Path(f"/proc/{sim.proc.pid}/cmdline").read_text()
    assert generate(sim, 1)[0] == 200
    assert sim.post("/generate", {"text": "x"})[0] == 401
    assert sim.get("/metrics")[0] == 200
    assert f"'api_key': '{API_KEY}'" in sim.log  # SGLang logs server_args with the key: redacting is yours


@pytest.mark.parametrize(
    ("text", "name", "code", "message"),
    [
        (f"api_key: {API_KEY}\n", "sglang.yaml", 2, "unrecognized arguments: --api_key"),
        ("api-key: x\n", "sglang.txt", 1, "ValueError: Config file must be YAML format, got: .txt"),
        ("server:\n  port: 1\n", "sglang.yaml", 1, "flat 'key: value' YAML config files only"),
        ("- a\n", "sglang.yml", 1, "a list item that belongs to no key"),
    ],
)
def test_config_files_sglang_refuses(start, tmp_path, text, name, code, message):
    config = write_config(tmp_path, text, name)
    sim = start("--config", str(config), *FAST, healthy=False)
    got, err = sim.finish()
    assert got == code and message in err


# -- JIT kernels: ninja and the cache --------------------------------------------------------------------------
def without_venv_bin(lab_env: dict, tmp_path: Path) -> str:
    """A PATH without the venv's bin/ (and without any ninja this machine may have elsewhere)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    return str(empty)


def test_a_cold_jit_cache_needs_ninja_on_path(start, lab_env, tmp_path):
    sim = start(*FAST, env={"PATH": without_venv_bin(lab_env, tmp_path)}, healthy=False)
    code, err = sim.finish()
    assert code == -signal.SIGKILL
    assert (
        "Scheduler hit an exception" in err and "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'" in err
    )


def test_a_warm_jit_cache_needs_no_ninja(start, lab_env, tmp_path):
    start(*FAST).kill()
    cache = Path(lab_env["SGLANG_JIT_CACHE_DIR"])
    assert list(cache.glob("sm90a/sgl_kernel_jit_kvcache/build-*/deps-*/sgl_kernel_jit_kvcache.so"))
    start(*FAST, env={"PATH": without_venv_bin(lab_env, tmp_path)})


def test_a_cache_directory_that_cannot_be_made_fails_the_load(start, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    sim = start(*FAST, env={"SGLANG_JIT_CACHE_DIR": str(blocker / "jit")}, healthy=False)
    code, err = sim.finish()
    assert code == -signal.SIGKILL and "NotADirectoryError" in err


def test_the_cache_follows_home_by_default(start, lab_env, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    start(*FAST, env={"SGLANG_JIT_CACHE_DIR": None, "HOME": str(home)})
    assert list((home / ".cache" / "sglang" / "jit").glob("sm90a/*/build-*/deps-*/*.so"))


# -- the port ---------------------------------------------------------------------------------------------------
def test_a_taken_port_fails_after_the_model_loaded(start):
    first = start(*FAST)
    second = Sim(first.env | {"CUDA_VISIBLE_DEVICES": "1"}, ["--port", str(first.port), *FAST])
    try:
        code, err = second.finish()
        assert code == 1
        assert err.index("Capture cuda graph end") < err.index("error while attempting to bind on address")
        assert "Application shutdown complete." in err
        assert wait_for(lambda: second.children() == {}, timeout=3)
    finally:
        second.kill()


# -- the speculative model under load -----------------------------------------------------------------------
def spec_server(start, steps: int, gpu: str) -> Sim:
    return start(
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        "1",
        "--sim-token-latency-ms",
        "10",
        "--sim-noise",
        "0",
        *FAST,
        env={"CUDA_VISIBLE_DEVICES": gpu},
    )


def throughput(sim: Sim, concurrency: int, tokens: int = 64) -> float:
    def one(index: int) -> int:
        status, raw = generate(sim, tokens, timeout=60, rid=f"bench-{index}")
        assert status == 200
        return json.loads(raw)["meta_info"]["completion_tokens"]

    rounds = []
    for _round in range(3):
        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            total = sum(pool.map(one, range(concurrency)))
        rounds.append(total / (time.monotonic() - started))
    return sorted(rounds)[1]


def test_the_best_step_count_falls_as_the_batch_grows(start):
    # Measured by the wall clock, so the two servers differ by about 20 % either way (specmodel: 6 steps give 1.22x
    # the tokens of 1 step alone and 0.82x in a batch of 32), far more than a busy machine's jitter; the best step
    # count itself (4 alone, 2 at 32) is checked on the model in test_sglang_sim.py.
    deep, shallow = spec_server(start, 6, "0"), spec_server(start, 1, "1")
    single = {"6": throughput(deep, 1), "1": throughput(shallow, 1)}
    batch = {"6": throughput(deep, 32), "1": throughput(shallow, 32)}
    assert single["6"] > single["1"], single
    assert batch["1"] > batch["6"], batch


def test_requests_beyond_max_running_requests_wait_in_the_queue(start):
    sim = start("--max-running-requests", "2", "--enable-metrics", *SLOW, *FAST)
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(generate, sim, 120) for _request in range(4)]
        # The gauges show the batch within decode_log_interval (40) decode steps.
        assert wait_for(
            lambda: (metric(sim, "sglang:num_running_reqs"), metric(sim, "sglang:num_queue_reqs")) == (2, 2)
        )
        assert all(f.result()[0] == 200 for f in futures)


# -- HTTP requests in flight, abort, pipeline parallelism ------------------------------------------------------------
def http_active(sim: Sim) -> dict[tuple[str, str], float]:
    text = sim.get("/metrics")[1].decode()
    found = {}
    for line in text.splitlines():
        hit = re.match(r'sglang:http_requests_active\{endpoint="([^"]*)",method="([^"]*)"\} (\S+)$', line)
        if hit:
            found[(hit.group(1), hit.group(2))] = float(hit.group(3))
    return found


def finishing_stream(sim: Sim, tokens: int, result: dict, key: str, headers: dict | None = None) -> None:
    """Stream one generation; result[key] is (the last chunk's finish_reason, saw [DONE]) or the error."""
    body = json.dumps({"text": "Tell me about the lab.", "stream": True, "sampling_params": {"max_new_tokens": tokens}})
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=60)
    try:
        conn.request("POST", "/generate", body, {"content-type": "application/json", **(headers or {})})
        response = conn.getresponse()
        last, done = None, False
        for raw in response:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                last = json.loads(line[6:])
                result.setdefault(key + ":first", time.monotonic())
        result[key] = (last["meta_info"]["finish_reason"] if last else None, done)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result[key] = exc.__class__(str(exc))
    finally:
        conn.close()


def test_http_requests_active_counts_a_stream_until_its_last_byte(start):
    sim = start("--enable-metrics", *SLOW, *FAST)
    # The scrape counts itself: /metrics is 1 while it is being answered.
    assert http_active(sim)[("/metrics", "GET")] == 1.0
    result: dict = {}
    worker = threading.Thread(target=stream, args=(sim, 100, result, "long"))
    worker.start()
    assert wait_for(lambda: http_active(sim).get(("/generate", "POST")) == 1.0, timeout=5)
    worker.join(30)
    assert result["long"] == (200, 100, 100, True), result["long"]
    assert wait_for(lambda: http_active(sim).get(("/generate", "POST")) == 0.0, timeout=5)  # stays, at 0
    assert http_active(sim).get(("/health", "GET"), 0.0) == 0.0


def test_no_http_requests_active_without_enable_metrics(start):
    sim = start(*FAST)
    assert sim.get("/metrics")[0] == 404


def test_abort_all_ends_every_request_with_an_abort_finish_reason_and_the_drain_exits_0(start, lab_env):
    sim = start("--tp-size", "2", "--api-key", API_KEY, "--enable-metrics", "--max-running-requests", "1", *SLOW, *FAST)
    result: dict = {}
    auth = {"authorization": f"Bearer {API_KEY}"}
    workers = [threading.Thread(target=finishing_stream, args=(sim, 2000, result, f"r{i}", auth)) for i in range(2)]
    for worker in workers:
        worker.start()
    assert wait_for(lambda: "r0:first" in result or "r1:first" in result)
    assert wait_for(lambda: http_active(sim).get(("/generate", "POST")) == 2.0)  # both arrived
    sim.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: "Draining requests and shutting down" in sim.log, timeout=2)
    assert sim.post("/abort_request", {"abort_all": True})[0] == 401  # behind the API key
    assert (
        sim.post("/abort_request", {"abort_all": True}, headers={**auth, "content-type": "application/json"})[0] == 200
    )
    for worker in workers:
        worker.join(30)
    # One was running (aborted at its next step), one waiting (--max-running-requests 1: aborted from the queue).
    for key in ("r0", "r1"):
        reason, done = result[key]
        assert reason == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}, result
        assert done, result
    code, err = sim.finish()
    assert code == 0, err
    assert "SIGQUIT" not in err and "crashed" not in err
    assert sim.children_gone(), sim.children()
    assert held(lab_env) == {}


def test_with_pp_size_above_1_the_schedulers_ignore_shutdown_req(start, lab_env):
    sim = start("--pp-size", "2", *FAST)
    assert generate(sim, 1)[0] == 200  # the handle loop owns SIGTERM from the first request on
    sim.proc.send_signal(signal.SIGTERM)
    code, err = sim.finish(timeout=60)
    assert code == 0, err
    assert "Schedulers still alive 15s after ShutdownReq, killing them before they released" in err
