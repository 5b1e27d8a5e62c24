"""sglang_sim as a process: endpoints and their JSON, processes and GPU claims, SIGTERM, faults, bad input, speed.

Each server runs `python -m sglang_sim.launch_server` on a free port with a temporary simgpu state
directory and a minimal fake installed `sglang` (the speculative enum and a dist-info RECORD) on PYTHONPATH.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parents[1]
GPU_TOTAL = 81559
API_KEY = "sk-lab"
SPEC_INFO = """from enum import Enum, auto


class SpeculativeAlgorithm(Enum):
    DFLASH = auto()
    EAGLE = auto()
    EAGLE3 = auto()
    STANDALONE = auto()
    NGRAM = auto()
    NONE = auto()
"""
FAKE_SOURCES = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/speculative/__init__.py": "",
    "sglang/srt/speculative/spec_info.py": SPEC_INFO,
    "sglang/srt/speculative/spec_registry.py": '_RESERVED_ALIASES = frozenset({"NEXTN"})\n',
    "sglang/srt/utils/__init__.py": "",
    "sglang/srt/utils/common.py": "def is_cuda():\n    return True\n",
}
FAST = ["--sim-load-time", "0.3", "--sim-warmup-time", "0.1"]


# -- environment ----------------------------------------------------------------------------------------------------
def write_fake_sglang(site: Path) -> None:
    """An installed-looking sglang: sources plus a dist-info whose RECORD hashes them."""
    record = []
    for relative, text in FAKE_SOURCES.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{relative},sha256={digest},{len(text)}")
    dist = site / "sglang-0.5.23.dist-info"
    dist.mkdir()
    (dist / "RECORD").write_text("\n".join([*record, "sglang-0.5.23.dist-info/RECORD,,"]) + "\n")
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")


@pytest.fixture
def lab_env(tmp_path) -> dict:
    site = tmp_path / "site"
    write_fake_sglang(site)
    state = tmp_path / "simgpu"
    (state / "claims").mkdir(parents=True)
    (state / "gpus").write_text("".join(f"{i}\tGPU-{i:04d}-sim\t{GPU_TOTAL}\tNVIDIA H100 80GB HBM3\n" for i in (0, 1)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_SIM_", "CUDA_VISIBLE"))}
    env.update(PYTHONPATH=f"{LAB_DIR}{os.pathsep}{site}", SIMGPU_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method: str, url: str, body=None, headers=None, timeout: float = 10):
    """(status, body bytes) of one request; HTTP errors are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Sim:
    """One simulator process (own session, so cleanup reaches every descendant, orphans included)."""

    def __init__(self, env: dict, argv: list[str]):
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_sim.launch_server",
                "--model-path",
                "org/sim-model",
                "--port",
                str(self.port),
                *argv,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def get(self, path: str, **kwargs):
        return http("GET", self.url + path, **kwargs)

    def post(self, path: str, body: dict, **kwargs):
        return http("POST", self.url + path, body, **kwargs)

    def wait_healthy(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"sim exited {self.proc.returncode}:\n{self.proc.stderr.read()}"
            try:
                if self.get("/health", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("sim never became healthy")

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        _stdout, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def children(self) -> dict[int, str]:
        """PID -> cmdline of this server's live processes (its process group) except the main process."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.proc.pid:
                continue
            try:
                stat = (entry / "stat").read_bytes()
                if os.getpgid(int(entry.name)) == self.proc.pid and stat[stat.rindex(b")") + 2 :][:1] not in b"ZX":
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().decode()
            except (OSError, ProcessLookupError):
                continue
        return found

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.communicate(timeout=10)


@pytest.fixture
def start(lab_env):
    sims = []

    def launch(*argv: str, env: dict | None = None, healthy: bool = True) -> Sim:
        sim = Sim({**lab_env, **(env or {})}, list(argv))
        sims.append(sim)
        if healthy:
            sim.wait_healthy()
        return sim

    yield launch
    for sim in sims:
        sim.kill()


def claims(env: dict) -> dict[str, int]:
    folder = Path(env["SIMGPU_STATE_DIR"]) / "claims"
    return {p.name: int(p.read_text()) for p in folder.iterdir() if p.name.startswith("gpu")}


def events(raw: bytes) -> list[str]:
    text = raw.decode()
    assert text.endswith("\n\n")
    blocks = text[:-2].split("\n\n")
    assert all(block.startswith("data: ") for block in blocks)
    return [block[len("data: ") :] for block in blocks]


def generate(sim: Sim, tokens: int, timeout: float = 10, **fields):
    body = {"text": "Tell me about the lab.", "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    return sim.post("/generate", {**body, **fields}, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=timeout)


# -- a healthy TP=2 server ------------------------------------------------------------------------------------------
@pytest.fixture
def tp2(start):
    return start("--tp-size", "2", "--enable-metrics", "--api-key", API_KEY, "--sim-token-latency-ms", "1", *FAST)


def test_processes_titles_and_gpu_claims(tp2, lab_env):
    titles = sorted(cmd.split("\0")[0] for cmd in tp2.children().values())
    assert titles == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    for pid, cmdline in tp2.children().items():
        assert cmdline.endswith("\0") and cmdline.count("\0") == 1
        assert Path(f"/proc/{pid}/comm").read_text().strip() == cmdline[:15]
    held = claims(lab_env)
    schedulers = {pid for pid, cmd in tp2.children().items() if "scheduler" in cmd}
    assert {name.split(".pid")[1] for name in held} == {str(p) for p in schedulers}
    expected = int(GPU_TOTAL * 0.85) - 1 + 256
    assert all(abs(mib - expected) <= 2 for mib in held.values()), held


def test_native_endpoints_have_sglang_shapes(tp2):
    assert tp2.get("/health")[0] == 200
    assert tp2.get("/health_generate")[0] == 200
    status, raw = tp2.get("/model_info", headers={"Authorization": f"Bearer {API_KEY}"})
    model = json.loads(raw)
    assert status == 200 and model["model_path"] == "org/sim-model" and model["is_generation"] is True
    assert {"tokenizer_path", "served_model_name", "weight_version", "architectures"} <= model.keys()
    assert json.loads(tp2.get("/get_model_info", headers={"Authorization": f"Bearer {API_KEY}"})[1]) == model
    status, raw = tp2.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    listing = json.loads(raw)
    assert listing["object"] == "list" and listing["data"][0]["id"] == "org/sim-model"
    assert listing["data"][0]["object"] == "model" and listing["data"][0]["max_model_len"] == 32768
    info = json.loads(tp2.get("/server_info", headers={"Authorization": f"Bearer {API_KEY}"})[1])
    assert info["version"] == "0.5.23" and info["tp_size"] == 2 and info["speculative_algorithm"] is None
    assert {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"} <= info.keys()
    assert len(info["internal_states"]) == 1 and "last_gen_throughput" in info["internal_states"][0]
    assert tp2.get("/get_server_info", headers={"Authorization": f"Bearer {API_KEY}"})[0] == 200
    assert tp2.get("/no_such_endpoint", headers={"Authorization": f"Bearer {API_KEY}"})[0] == 404


def test_generate_and_stream(tp2):
    status, raw = generate(tp2, 16, rid="req-1")
    out = json.loads(raw)
    assert status == 200 and len(out["text"].split()) == 16 and len(out["output_ids"]) == 16
    meta = out["meta_info"]
    assert meta["id"] == "req-1" and meta["finish_reason"] == {"type": "length", "length": 16}
    assert meta["completion_tokens"] == 16 and meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0
    assert {"cached_tokens", "weight_version"} <= meta.keys()
    assert "spec_verify_ct" not in meta
    assert json.loads(generate(tp2, 16)[1])["text"] == out["text"]
    status, raw = generate(tp2, 5, stream=True)
    chunks = events(raw)
    assert status == 200 and chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert [p["meta_info"]["completion_tokens"] for p in parsed] == [1, 2, 3, 4, 5]
    assert parsed[-1]["text"] == " ".join(out["text"].split()[:5])
    assert parsed[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_openai_chat_completion(tp2):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    body = {
        "model": "org/sim-model",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 6,
        "temperature": 0,
    }
    status, raw = tp2.post("/v1/chat/completions", body, headers=auth)
    reply = json.loads(raw)
    assert status == 200 and reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant" and reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 6
    status, raw = tp2.post(
        "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}, headers=auth
    )
    chunks = events(raw)
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (
        "".join(p["choices"][0]["delta"]["content"] for p in parsed if p["choices"])
        == reply["choices"][0]["message"]["content"]
    )
    assert parsed[-1]["usage"]["completion_tokens"] == 6


def test_api_key_and_metrics(tp2):
    assert generate(tp2, 1)[0] == 200
    assert tp2.post("/generate", {"text": "x"})[0] == 401
    assert tp2.get("/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    status, raw = tp2.get("/metrics")
    text = raw.decode()
    assert status == 200
    for name in (
        "sglang:gen_throughput",
        "sglang:num_running_reqs",
        "sglang:num_requests_total",
        "sglang:generation_tokens_total",
        "sglang:e2e_request_latency_seconds_bucket",
    ):
        assert f"\n{name}{{" in text, name


def test_bad_requests_get_sglang_errors(tp2):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    status, raw = tp2.post("/generate", {"sampling_params": {}}, headers=auth)
    assert status == 400 and "Either text, input_ids or input_embeds" in raw.decode()
    status, raw = tp2.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, headers=auth)
    assert status == 400 and "max_new_tokens must be at least 0" in raw.decode()
    status, raw = tp2.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 40000}}, headers=auth)
    assert status == 400 and "maximum context length" in raw.decode()


def timed(call) -> float:
    started = time.monotonic()
    assert call()[0] == 200
    return time.monotonic() - started


def test_performance_points(tp2):
    singles = sorted(timed(lambda: generate(tp2, 64)) for _attempt in range(3))
    assert singles[1] < 0.150, singles

    def one(_request_number):
        return generate(tp2, 100)[0]

    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(one, range(32)))
    together = time.monotonic() - started
    assert statuses == [200] * 32
    assert together < 8 * 0.100, together


# -- speculative decoding -------------------------------------------------------------------------------------------
def test_speculative_meta_info_server_info_and_speed(start):
    plain = start("--sim-token-latency-ms", "5", *FAST)
    spec = start(
        "--base-gpu-id",
        "1",
        "--sim-token-latency-ms",
        "5",
        "--speculative-algorithm",
        "eagle",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--enable-metrics",
        *FAST,
    )
    durations = {}
    for name, sim in (("plain", plain), ("spec", spec)):
        started = time.monotonic()
        status, raw = generate(sim, 64, rid="same")
        durations[name] = time.monotonic() - started
        assert status == 200
    meta = json.loads(raw)["meta_info"]
    assert meta["spec_verify_ct"] > 0 and 1.0 <= meta["spec_accept_length"] <= 4
    assert meta["spec_accept_length"] == pytest.approx(64 / meta["spec_verify_ct"])
    assert 0.0 <= meta["spec_accept_rate"] <= 1.0
    assert json.loads(generate(spec, 64, rid="same")[1])["meta_info"]["spec_verify_ct"] == meta["spec_verify_ct"]
    assert durations["spec"] < 0.75 * durations["plain"], durations
    info = json.loads(spec.get("/server_info")[1])
    assert (info["speculative_algorithm"], info["speculative_num_steps"], info["speculative_num_draft_tokens"]) == (
        "EAGLE",
        3,
        4,
    )
    assert 1.0 < info["internal_states"][0]["avg_spec_accept_length"] <= 4
    assert "\nsglang:spec_accept_length{" in spec.get("/metrics")[1].decode()


def test_deep_speculation_runs_out_of_gpu_memory(start, lab_env):
    ok = start(
        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "8", "--speculative-eagle-topk", "1", *FAST
    )
    ok.kill()
    deep = start(
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "9",
        "--speculative-eagle-topk",
        "1",
        *FAST,
        healthy=False,
    )
    code, err = deep.finish()
    assert code != 0
    assert "Capture cuda graph failed: CUDA out of memory" in err and "Scheduler hit an exception" in err


# -- lifecycle ------------------------------------------------------------------------------------------------------
def test_sigterm_drains_in_flight_requests_then_exits_clean(start, lab_env):
    sim = start("--tp-size", "2", "--sim-token-latency-ms", "20", "--enable-metrics", *FAST)
    result = {}
    worker = threading.Thread(target=lambda: result.update(answer=generate(sim, 40)))
    worker.start()
    deadline = time.monotonic() + 5
    while "_reqs{" not in _running_line(sim) and time.monotonic() < deadline:
        time.sleep(0.01)
    sim.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while sim.get("/health")[0] != 503 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sim.get("/health")[0] == 503
    assert generate(sim, 1)[0] == 503
    worker.join(10)
    status, raw = result["answer"]
    assert status == 200 and json.loads(raw)["meta_info"]["completion_tokens"] == 40
    code, err = sim.finish()
    assert code == 0, err
    assert "Draining requests and shutting down" in err
    assert claims(lab_env) == {} and sim.children() == {}


def test_drain_is_bounded_and_aborts_what_is_still_running(start):
    sim = start("--sim-fault", "generate-hang", "--sim-drain-time", "0.5", "--enable-metrics", *FAST)
    result = {}
    worker = threading.Thread(target=lambda: result.update(answer=generate(sim, 4)))
    worker.start()
    deadline = time.monotonic() + 5
    while not _running_line(sim) and time.monotonic() < deadline:
        time.sleep(0.01)
    sim.proc.send_signal(signal.SIGTERM)
    code, _stderr = sim.finish()
    worker.join(10)
    assert code == 0
    status, raw = result["answer"]
    assert status == 200 and json.loads(raw)["meta_info"]["finish_reason"]["type"] == "abort"


def _running_line(sim: Sim) -> str:
    """The num_running_reqs sample when one request runs, else ''."""
    text = sim.get("/metrics")[1].decode()
    return next(
        (line for line in text.splitlines() if line.startswith("sglang:num_running_reqs{") and line.endswith(" 1.0")),
        "",
    )


def test_out_of_memory_when_another_process_holds_the_gpu(start, lab_env):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (Path(lab_env["SIMGPU_STATE_DIR"]) / "claims" / f"gpu1.pid{holder.pid}").write_text("70000\n")
        sim = start("--tp-size", "2", *FAST, healthy=False)
        code, err = sim.finish()
        assert code != 0
        assert "torch.OutOfMemoryError: CUDA out of memory" in err and "GPU 1 has a total capacity" in err
        assert "Received sigquit from a child process" in err
        assert sim.children() == {}
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--sim-fault", "no-such-fault"], {}, "argument --sim-fault: unknown fault 'no-such-fault'"),
        (["--sim-warmup-time", "-2"], {}, "argument --sim-warmup-time (SGLANG_SIM_WARMUP_TIME): must be >= 0"),
        (["--tp-size", "3"], {}, "argument --tp-size: --tp-size 3 x --dp-size 1 needs 3 GPUs"),
        (["--port", "0"], {}, "argument --port: must be in 1..65535"),
        ([], {"SGLANG_SIM_FAULTS": "bogus"}, "environment SGLANG_SIM_FAULTS: unknown fault 'bogus'"),
    ],
)
def test_bad_input_exits_non_zero_naming_the_flag(start, argv, env, message):
    sim = start(*argv, env=env, healthy=False)
    code, err = sim.finish()
    assert code == 2 and message in err


def test_unknown_algorithm_is_rejected_at_start(start):
    sim = start("--speculative-algorithm", "SPARKLE", "--speculative-num-steps", "3", healthy=False)
    code, err = sim.finish()
    assert code == 1
    assert "Traceback" in err and "ValueError: Unknown speculative algorithm name: SPARKLE" in err


def test_patched_algorithm_in_installed_enum_is_accepted(start, lab_env):
    site = Path(lab_env["PYTHONPATH"].split(os.pathsep)[1])
    spec_info = site / "sglang" / "srt" / "speculative" / "spec_info.py"
    spec_info.write_text(spec_info.read_text() + "    SPARKLE = auto()\n")
    sim = start(
        "--speculative-algorithm", "sparkle", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", *FAST
    )
    assert json.loads(sim.get("/server_info")[1])["speculative_algorithm"] == "SPARKLE"


def test_syntax_error_in_an_installed_source_crashes_the_load(start, lab_env):
    site = Path(lab_env["PYTHONPATH"].split(os.pathsep)[1])
    common = site / "sglang" / "srt" / "utils" / "common.py"
    common.write_text(common.read_text() + "\ndef broken(:\n    pass\n")
    sim = start(*FAST, healthy=False)
    code, err = sim.finish()
    assert code == 1
    assert "Traceback (most recent call last)" in err and "SyntaxError" in err and str(common) in err
    assert claims(lab_env) == {}


def test_missing_sglang_is_a_clear_error(start, lab_env):
    sim = start(*FAST, env={"PYTHONPATH": str(LAB_DIR)}, healthy=False)
    code, err = sim.finish()
    assert code == 1 and "the sglang package is not installed" in err


# -- faults ---------------------------------------------------------------------------------------------------------
def test_generate_hang_keeps_health_and_model_info(start):
    sim = start("--sim-fault", "generate-hang", *FAST)
    assert sim.get("/health")[0] == 200 and sim.get("/model_info")[0] == 200
    with pytest.raises(OSError):
        generate(sim, 4, timeout=0.5)


def test_never_load_claims_nothing_but_serves_http(start, lab_env):
    sim = start("--tp-size", "2", *FAST, env={"SGLANG_SIM_FAULTS": "never-load"})
    assert sim.get("/health")[0] == 200 and sim.get("/v1/models")[0] == 200
    assert claims(lab_env) == {}
    assert len(sim.children()) == 3
    with pytest.raises(OSError):
        generate(sim, 4, timeout=0.5)


def test_degenerate_output(start):
    sim = start("--sim-fault", "degenerate", *FAST)
    assert json.loads(generate(sim, 8)[1])["text"] == "!!!!!!!!"


def test_a_modified_source_can_declare_the_degenerate_fault(start, lab_env):
    site = Path(lab_env["PYTHONPATH"].split(os.pathsep)[1])
    common = site / "sglang" / "srt" / "utils" / "common.py"
    original = common.read_text()
    common.write_text(original + "# sglang-sim-fault: degenerate\n")
    sim = start(*FAST)
    assert json.loads(generate(sim, 8)[1])["text"] == "!!!!!!!!"
    sim.kill()
    common.write_text(original.replace("return True", "return True  # sglang-sim-fault: degenerate"))
    assert json.loads(generate(start(*FAST), 8)[1])["text"] != "!!!!!!!!"


def test_crash_on_load(start, lab_env):
    sim = start("--tp-size", "2", "--sim-fault", "crash-on-load", *FAST, healthy=False)
    code, err = sim.finish()
    assert code != 0 and "Scheduler hit an exception: Traceback" in err and "crash-on-load" in err
    assert sim.children() == {}


def test_slow_drain_takes_the_drain_time(start):
    sim = start("--sim-fault", "slow-drain", "--sim-drain-time", "1.5", *FAST)
    started = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    code, _stderr = sim.finish()
    assert code == 0 and time.monotonic() - started >= 1.5


def test_orphan_schedulers_outlive_the_main_process_and_keep_claims(start, lab_env):
    sim = start("--tp-size", "2", "--sim-fault", "orphan-schedulers", *FAST)
    schedulers = {pid for pid, cmd in sim.children().items() if "scheduler" in cmd}
    held = claims(lab_env)
    os.kill(sim.proc.pid, signal.SIGKILL)
    sim.proc.wait()
    for pid in schedulers:
        os.kill(pid, signal.SIGTERM)
    again = start("--tp-size", "2", *FAST, healthy=False)
    code, err = again.finish()
    assert code != 0 and "CUDA out of memory" in err
    assert {pid for pid, cmd in sim.children().items() if "scheduler" in cmd} == schedulers
    assert {name: mib for name, mib in claims(lab_env).items() if name in held} == held
