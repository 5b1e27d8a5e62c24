"""sglang_sim as a process: endpoints and their JSON, processes and GPU claims, SIGTERM, faults, bad input, speed.

Each server runs `python -m sglang_sim.launch_server` on a free port with a temporary simgpu state
directory and a minimal fake installed `sglang` (the speculative enum and a dist-info RECORD) on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sim_support import API_KEY, FAST, GPU_TOTAL, LAB_DIR, SIMGPU_DIR, claims, events, generate

if str(SIMGPU_DIR) not in sys.path:
    sys.path.insert(0, str(SIMGPU_DIR))
import simgpu_state


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
    # CUDA's total leaves the driver's reservation out (simgpu's default, as lab_env writes none).
    expected = int((GPU_TOTAL - simgpu_state.DEFAULT_RESERVED_MIB) * 0.85) - 1 + 256
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
def test_out_of_memory_when_another_process_holds_the_gpu(start, lab_env):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (Path(lab_env["SIMGPU_STATE_DIR"]) / "claims" / f"gpu1.pid{holder.pid}").write_text("70000\n")
        sim = start("--tp-size", "2", *FAST, healthy=False)
        code, err = sim.finish()
        assert code != 0
        assert "torch.OutOfMemoryError: CUDA out of memory" in err and "GPU 1 has a total capacity" in err
        assert "Received sigquit from a child process" in err
        assert sim.children_gone(), sim.children()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--sim-fault", "no-such-fault"], {}, "argument --sim-fault: unknown fault 'no-such-fault'"),
        (["--sim-warmup-time", "-2"], {}, "argument --sim-warmup-time (SGLANG_SIM_WARMUP_TIME): must be >= 0"),
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
    sim = start(*FAST, env={"PYTHONPATH": f"{LAB_DIR}{os.pathsep}{SIMGPU_DIR}"}, healthy=False)
    code, err = sim.finish()
    assert code == 1 and "the sglang package is not installed" in err


# -- faults ---------------------------------------------------------------------------------------------------------
def test_generate_hang_keeps_health_and_model_info(start):
    sim = start("--sim-fault", "generate-hang", *FAST)
    assert sim.get("/health")[0] == 200 and sim.get("/model_info")[0] == 200
    with pytest.raises(OSError):
        generate(sim, 4, timeout=0.5)


def test_never_load_claims_nothing_answers_http_and_never_warms_up(start, lab_env):
    sim = start("--tp-size", "2", *FAST, env={"SGLANG_SIM_FAULTS": "never-load"}, healthy=False)
    sim.wait_listening()
    assert sim.get("/v1/models")[0] == 200 and sim.get("/model_info")[0] == 200
    assert claims(lab_env) == {}
    assert len(sim.children()) == 3
    # The warm-up generation never finishes, so the server never leaves Starting.
    time.sleep(1.0)
    assert sim.get("/ready")[0] == 503 and sim.get("/health")[0] == 503
    with pytest.raises(OSError):
        generate(sim, 4, timeout=0.5)


def test_a_warm_up_that_never_finishes_kills_the_server_after_its_timeout(start):
    sim = start(*FAST, env={"SGLANG_SIM_FAULTS": "never-load", "SGLANG_WARMUP_TIMEOUT": "1"}, healthy=False)
    code, err = sim.finish(timeout=30)
    assert code == -signal.SIGKILL
    assert "Initialization failed. warmup error" in err and "Read timed out. (read timeout=1)" in err
    assert sim.children_gone(), sim.children()


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
    assert sim.children_gone(), sim.children()


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


@pytest.mark.parametrize(
    ("visible", "extra", "fails"),
    [
        ("GPU-0000-sim,GPU-0001-sim", (), True),
        ("0,1", (), False),
        ("GPU-0000-sim,GPU-0001-sim", ("--disable-custom-all-reduce",), False),
    ],
    ids=["uuids", "indexes", "disabled"],
)
def test_custom_all_reduce_fails_to_set_up_on_gpu_uuids_at_tp_2(start, visible, extra, fails):
    """parallel_state.py:503-517: every TP rank logs the failure of custom_all_reduce_utils.py:477's int()."""
    sim = start("--tp-size", "2", *extra, *FAST, env={"CUDA_VISIBLE_DEVICES": visible})
    sim.kill()
    failures = [line for line in sim.log.splitlines() if "Setup Custom allreduce failed" in line]
    if fails:
        assert len(failures) == 2, sim.log
        assert all(
            "Setup Custom allreduce failed with invalid literal for int() with base 10: 'GPU-0000-sim'. To silence "
            "this warning, specify --disable-custom-all-reduce explicitly." in line
            for line in failures
        ), failures
        assert {"TP0" in line for line in failures} == {True, False}
    else:
        assert failures == [], failures
