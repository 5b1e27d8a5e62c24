"""sglang_sim's adaptive speculative decoding against SGLang 0.5.23's: the step slots (compared with the real
AdaptiveStepSlot read from the pinned wheel), the config's checks at start, the refusals that fall back to the
static settings, and the engine's throughput at each batch size."""

from __future__ import annotations

import ast
import json
import math
import random
import sys
import threading
import zipfile
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB_DIR))

from labctl import image  # noqa: E402
from sglang_sim import adaptive, engine, spec_args, specmodel  # noqa: E402
from sim_support import FAST, generate  # noqa: E402

ENUM = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "NONE"})
ALIASES = frozenset({"NEXTN"})
EAGLE = specmodel.params_for("EAGLE")


def resolve(algorithm="EAGLE", steps=None, topk=None, draft=None, **flags):
    return spec_args.resolve(
        algorithm, steps, topk, draft, members=ENUM, aliases=ALIASES, adaptive=spec_args.AdaptiveFlags(**flags)
    )


def config_file(tmp_path: Path, content) -> str:
    path = tmp_path / "adaptive.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# -- the real AdaptiveStepSlot, from the pinned wheel ---------------------------------------------------------------
def real_adaptive_module() -> dict:
    wheels = sorted(image.WHEEL_DIR.glob("sglang-0.5.23-*.whl"))
    if not wheels:
        pytest.skip(f"the sglang 0.5.23 wheel is not in {image.WHEEL_DIR}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        source = wheel.read("sglang/srt/speculative/adaptive_spec_params.py").decode()
    tree = ast.parse(source)
    # Its imports pull in torch; the slot and the loader need only math, json and a logger.
    keep = [
        node
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef))
        or (isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "DEFAULT_ADAPTIVE_CONFIG")
    ]
    namespace = {
        "math": math,
        "json": json,
        "bisect": __import__("bisect"),
        "cached_property": __import__("functools").cached_property,
        "logger": None,
        "log_info_on_rank0": lambda *args: None,
        "__name__": "real_adaptive",
    }
    exec(compile(ast.Module(body=keep, type_ignores=[]), "adaptive_spec_params.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize(
    "cfg",
    [
        {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
        {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
        {"candidate_steps": [0, 1]},
        {"candidate_steps": [2, 3, 4], "ema_alpha": 0.5, "update_interval": 2, "warmup_batches": 3},
        {"candidate_steps": [1, 2, 4, 6], "ceiling_coeff": 1.2, "up_hysteresis": 0.3},
    ],
)
def test_step_slot_follows_sglangs_adaptive_step_slot(cfg):
    real = real_adaptive_module()["AdaptiveStepSlot"]
    rng = random.Random(repr(cfg))
    for initial in (0, 1, 3, 9):
        ours, theirs = adaptive.StepSlot(initial, cfg), real(initial, cfg)
        assert ours.current_steps == theirs.current_steps
        for _batch in range(300):
            accepted = [rng.randint(0, max(theirs.current_steps, 0)) for _request in range(rng.randint(1, 8))]
            changed = theirs.update(accepted)
            assert ours.update(sum(accepted) / len(accepted)) == changed
            assert ours.current_steps == theirs.current_steps
            assert ours.ema_accept_len == pytest.approx(theirs.ema_accept_len)


def test_default_config_is_sglangs():
    assert real_adaptive_module()["DEFAULT_ADAPTIVE_CONFIG"] == adaptive.DEFAULT_ADAPTIVE_CONFIG


@pytest.mark.parametrize(
    "content",
    [
        {"1": {"candidate_steps": []}},
        {"1": {"candidate_steps": [2, -1]}},
        {"4": {"candidate_steps": "2"}},
        {"4": {}},
        {"ema_alpha": 0.3},
        {"x4": {"candidate_steps": [2]}},
    ],
)
def test_config_checks_match_sglangs_loader(tmp_path, content):
    path = config_file(tmp_path, content)
    with pytest.raises(ValueError) as real_error:
        real_adaptive_module()["_load_adaptive_config"](path)
    with pytest.raises(ValueError) as ours:
        adaptive.load_config(path)
    assert str(ours.value) == str(real_error.value)


def test_routing_pads_to_cuda_graph_sizes_and_takes_the_closest_key_below(tmp_path):
    path = config_file(tmp_path, {k: {"candidate_steps": [s]} for k, s in {"1": 4, "4": 3, "16": 2, "32": 1}.items()})
    params = adaptive.AdaptiveParams(2, path, adaptive.decode_cuda_graph_bs(48))
    assert [params.steps_for_batch(bs) for bs in (1, 3, 4, 15, 16, 31, 32, 48)] == [4, 4, 3, 2, 2, 1, 1, 1]
    assert params.steps_for_batch(13) == 3  # padded to 14, below the key 16


# -- resolution at start --------------------------------------------------------------------------------------------
def test_adaptive_resolution_takes_the_middle_candidate_and_top_k_one(tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": [3, 4]}, "32": {"candidate_steps": [2]}})
    config = resolve(enabled=True, config=path)
    assert config.adaptive
    assert config.candidate_steps == (2, 3, 4)
    assert (config.num_steps, config.eagle_topk, config.num_draft_tokens) == (3, 1, 4)
    default = resolve(enabled=True)
    assert (default.candidate_steps, default.num_steps) == ((0, 1, 3, 5, 7), 3)


def test_steps_outside_the_candidates_stop_the_start(tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": [3, 4]}})
    with pytest.raises(ValueError, match=r"--speculative-num-steps=5 is not in the adaptive config candidate_steps"):
        resolve(steps=5, topk=1, enabled=True, config=path)


def test_a_bad_config_stops_the_start_naming_the_entry(tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": [3]}, "16": {"candidate_steps": []}})
    with pytest.raises(ValueError, match=r"BS 16: candidate_steps must be a list of non-negative ints, got \[\]"):
        resolve(enabled=True, config=path)
    with pytest.raises(json.JSONDecodeError):
        resolve(enabled=True, config=config_file(tmp_path, "{not json"))


@pytest.mark.parametrize(
    "algorithm, topk, flags, reason",
    [
        ("EAGLE", 2, {}, "speculative_eagle_topk=2 (only topk=1 is supported)"),
        ("STANDALONE", 1, {}, "speculative_algorithm=STANDALONE (only EAGLE/EAGLE3 are supported)"),
        ("EAGLE3", 1, {"attn_dp_size": 2}, "attention DP is not supported"),
        ("EAGLE", 1, {"enable_multi_layer_eagle": True}, "enable_multi_layer_eagle=True is not supported"),
        ("EAGLE", 1, {"enable_two_batch_overlap": True}, "enable_two_batch_overlap=True is not supported"),
        ("EAGLE", 1, {"enable_pdmux": True}, "enable_pdmux=True is not supported"),
    ],
)
def test_unsupported_settings_fall_back_to_static_with_sglangs_warning(tmp_path, algorithm, topk, flags, reason):
    path = config_file(tmp_path, {"1": {"candidate_steps": []}})  # never read: the check comes first
    config = resolve(algorithm, 3, topk, 4, enabled=True, config=path, **flags)
    assert not config.adaptive
    assert config.num_steps == 3
    assert any(w.startswith(f"speculative_adaptive disabled: {reason}") for w in config.warnings)
    assert any(w.endswith("Falling back to static speculative params.") for w in config.warnings)


# -- the engine: steps per batch size, throughput -----------------------------------------------------------------
def make_engine(path: str | None, steps: int, latency_s: float = 0.002) -> engine.Engine:
    spec = spec_args.SpecConfig("EAGLE", steps, 1, steps + 1, adaptive=path is not None, candidate_steps=())
    return engine.Engine(
        engine.EngineConfig(
            token_latency_s=latency_s,
            prefill_s_per_token=0.0,
            seed=0,
            noise=0.03,
            batch_slowdown=specmodel.DEFAULT_BATCH_SLOWDOWN,
            max_running_requests=48,
            context_length=8192,
            stream_interval=1,
            incremental_streaming=False,
            spec=spec,
            spec_params=EAGLE,
            faults={},
            adaptive=adaptive.AdaptiveParams(steps, path, adaptive.decode_cuda_graph_bs(48)) if path else None,
        )
    )


def run_verifies(eng: engine.Engine, running: int, verifies: int) -> None:
    """Advance the engine's scheduler by `verifies` verify steps with `running` requests decoding."""
    with eng._cond:
        eng._running = eng._decoding = running
        for _verify in range(verifies):
            steps = eng.config.adaptive.steps_for_batch(running)
            eng._adaptive_steps(eng.config.token_latency_s * eng._cost_at(steps, running))


def test_each_slot_settles_where_sglangs_rule_puts_it(tmp_path):
    # The EMA of accepted drafts settles near accept_length - 1; a slot rises above c while it exceeds c - 0.5.
    path = config_file(tmp_path, {"1": {"candidate_steps": [1, 2, 3, 4, 5, 6]}, "32": {"candidate_steps": [1, 2]}})
    eng = make_engine(path, 3)
    run_verifies(eng, 1, 400)
    run_verifies(eng, 32, 400)
    one, many = eng.config.adaptive.slots[1], eng.config.adaptive.slots[32]
    assert one.current_steps == 3  # accept length - 1 at 3 steps is 1.53: not above 2.5, above 2 - 0.5 - 0.25
    assert one.ema_accept_len == pytest.approx(specmodel.accept_length(3, 1, 4, EAGLE) - 1, abs=0.1)
    assert many.current_steps == 2  # initial 3 is not a candidate: the middle one, 2, and 1.19 stays below 1.5


def test_a_switch_costs_no_time_and_the_pace_follows_the_steps(tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": [4]}, "16": {"candidate_steps": [2]}})
    eng = make_engine(path, 2)
    for running, steps in ((1, 4), (16, 2)):
        expected = 0.002 * specmodel.step_cost(steps, 1, steps + 1, EAGLE, running) / eagle_accept(steps)
        assert eng._pace(running) == pytest.approx(expected)


def eagle_accept(steps: int) -> float:
    return specmodel.accept_length(steps, 1, steps + 1, EAGLE)


def test_generation_under_adaptive_steps_reports_the_steps_accept_length(tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": [3]}})
    eng = make_engine(path, 3, latency_s=0.0005)
    results = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                eng.generate(engine.new_request(f"p{i}", 4, engine.parse_sampling({"max_new_tokens": 64}), False))
            )
        )
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 2
    for result in results:
        meta = result["meta_info"]
        assert meta["completion_tokens"] == 64
        assert meta["spec_accept_length"] == pytest.approx(eagle_accept(3), rel=0.2)
    assert eng.realtime_tokens()["decode"] > 0


# -- the server -----------------------------------------------------------------------------------------------------
def test_the_server_runs_adaptive_steps_and_reports_them(start, tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": [3, 4], "warmup_batches": 2, "update_interval": 2}})
    sim = start(
        "--sim-token-latency-ms", "2", "--speculative-algorithm", "EAGLE", "--speculative-adaptive",
        "--speculative-adaptive-config", path, *FAST,
    )  # fmt: skip
    info = json.loads(sim.get("/server_info")[1])
    assert (info["speculative_adaptive"], info["speculative_adaptive_config"]) == (True, path)
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
        4,
        1,
        5,
    )
    for rid in ("a", "b", "c"):
        status, raw = generate(sim, 64, rid=rid)
        assert status == 200
    # The slot starts at 4 (the middle of [3, 4]); its EMA (1.77 at 4 steps) is below 3 - 0.5 - 0.25, so it drops to 3.
    meta = json.loads(raw)["meta_info"]
    assert meta["spec_accept_length"] == pytest.approx(eagle_accept(3), rel=0.15)


def test_the_server_falls_back_to_static_with_sglangs_warning(start, tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": []}})
    sim = start(
        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6", "--speculative-adaptive", "--speculative-adaptive-config", path,
        "--sim-load-time", "0.3", "--sim-warmup-time", "0.1",
    )  # fmt: skip
    info = json.loads(sim.get("/server_info")[1])
    assert info["speculative_adaptive"] is False and info["speculative_num_steps"] == 3
    assert "speculative_adaptive disabled: speculative_eagle_topk=2 (only topk=1 is supported)" in sim.log


def test_a_bad_config_stops_the_server_naming_the_entry(start, tmp_path):
    path = config_file(tmp_path, {"1": {"candidate_steps": [3]}, "16": {"candidate_steps": []}})
    sim = start("--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--speculative-adaptive-config", path,
                "--sim-load-time", "0.3", healthy=False)  # fmt: skip
    code, log = sim.finish()
    assert code == 1
    assert "ValueError: BS 16: candidate_steps must be a list of non-negative ints, got []" in log
