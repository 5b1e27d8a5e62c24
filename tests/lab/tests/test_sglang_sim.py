"""Unit tests of sglang_sim's pure parts: the speculative model, argument rules, sources, GPU claims, text."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_sim import args, faults, gpu_claims, proctitle, sources, spec_args, specmodel, textgen

EAGLE = specmodel.params_for("EAGLE")
ENUM = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "NONE"})
ALIASES = frozenset({"NEXTN"})
GPU_TOTAL = 81559


# -- speculative model ----------------------------------------------------------------------------------------------
def chain(steps: int) -> tuple[int, int, int]:
    """SGLang's top-k 1 setting: draft tokens = steps + 1."""
    return steps, 1, steps + 1


def test_accept_length_grows_with_steps_and_saturates():
    lengths = [specmodel.accept_length(*chain(s), EAGLE) for s in range(1, 16)]
    gains = [b - a for a, b in zip(lengths, lengths[1:])]
    assert all(gain > 0 for gain in gains)
    assert all(later < earlier for earlier, later in zip(gains, gains[1:]))
    assert lengths[-1] < 1 + EAGLE.accept_prob / (1 - EAGLE.accept_prob)


def test_accept_length_is_bounded_by_draft_tokens_and_grows_with_them():
    for steps in range(1, 8):
        for topk in (1, 2, 4):
            for draft in range(2, 16):
                assert 1.0 <= specmodel.accept_length(steps, topk, draft, EAGLE) <= draft
    widths = [specmodel.accept_length(4, 4, d, EAGLE) for d in range(2, 17)]
    assert widths == sorted(widths)


def test_step_cost_grows_with_steps_topk_and_draft_tokens():
    assert specmodel.step_cost(*chain(2), EAGLE) < specmodel.step_cost(*chain(3), EAGLE)
    assert specmodel.step_cost(3, 1, 8, EAGLE) < specmodel.step_cost(3, 4, 8, EAGLE)
    assert specmodel.step_cost(3, 4, 8, EAGLE) < specmodel.step_cost(3, 4, 16, EAGLE)


def test_throughput_peaks_and_plateaus_around_three_to_five_steps():
    speedups = {s: specmodel.speedup(*chain(s), EAGLE) for s in range(1, 11)}
    best = max(speedups, key=speedups.get)
    assert best in (3, 4, 5)
    assert all(speedups[s] >= 0.97 * speedups[best] for s in (3, 4, 5))
    assert speedups[10] < speedups[best] and speedups[1] < speedups[3]
    assert all(value > 1.0 for value in speedups.values())


def test_noise_is_deterministic_per_seed_and_request():
    mean = specmodel.accept_length(*chain(3), EAGLE)
    first = specmodel.noisy_accept_length(mean, 4, 0.05, seed=7, request_id="r1")
    assert first == specmodel.noisy_accept_length(mean, 4, 0.05, seed=7, request_id="r1")
    others = {specmodel.noisy_accept_length(mean, 4, 0.05, seed=s, request_id="r1") for s in range(8)}
    assert len(others) > 1
    assert all(1.0 <= value <= 4 for value in others)
    assert specmodel.noisy_accept_length(mean, 4, 0.0, seed=1, request_id="x") == mean


def test_verify_count_never_exceeds_the_draft_budget():
    assert specmodel.verify_count(0, 2.5, 4) == 0
    assert specmodel.verify_count(64, 2.5, 4) == 26
    assert specmodel.verify_count(64, 9.0, 4) == 16
    assert specmodel.verify_count(3, 1.0, 4) == 3


def test_draft_memory_grows_with_depth_and_defaults_fail_above_steps_8():
    knobs = {k.name: k.default for k in args.KNOBS}
    reserve = GPU_TOTAL * (1 - args.DEFAULT_MEM_FRACTION_STATIC) - gpu_claims.DRIVER_RESERVED_MIB

    def overhead(steps: int) -> int:
        draft = specmodel.draft_memory_mib(
            *chain(steps), knobs["draft-base-mib"], knobs["mem-overhead-mib-per-draft-token"]
        )
        return knobs["cuda-graph-mib"] + draft

    assert [overhead(s) for s in range(1, 11)] == sorted(overhead(s) for s in range(1, 11))
    assert overhead(8) <= reserve < overhead(9)
    assert specmodel.draft_depth(3, 4, 8) == 12


def test_block_drafting_algorithms_use_the_whole_draft_window():
    dflash = specmodel.params_for("DFLASH")
    assert specmodel.accept_length(1, 1, 16, dflash) > specmodel.accept_length(1, 1, 16, EAGLE)


# -- speculative arguments (SGLang's rules) -------------------------------------------------------------------------
def resolve(algorithm, steps=None, topk=None, draft=None, arch=None):
    return spec_args.resolve(algorithm, steps, topk, draft, members=ENUM, aliases=ALIASES, model_arch=arch)


def test_topk_one_sets_draft_tokens_to_steps_plus_one():
    assert resolve("eagle", 5, 1).num_draft_tokens == 6
    adjusted = resolve("EAGLE", 5, 1, 9)
    assert adjusted.num_draft_tokens == 6
    assert any("adjusted to speculative_num_steps + 1" in w for w in adjusted.warnings)
    assert resolve("EAGLE", 5, 4, 9).num_draft_tokens == 9


def test_nextn_is_eagle_and_none_disables():
    assert resolve("nextn", 2, 1).algorithm == "EAGLE"
    assert not resolve("none", 2, 1).enabled
    assert not resolve(None, 3, 1, 4).enabled


def test_sglang_chooses_parameters_when_none_given():
    config = resolve("EAGLE3")
    assert (config.num_steps, config.eagle_topk, config.num_draft_tokens) == (3, 1, 4)
    llama = resolve("EAGLE", arch="LlamaForCausalLM")
    assert (llama.num_steps, llama.eagle_topk, llama.num_draft_tokens) == (5, 4, 8)


def test_unknown_algorithm_is_rejected_with_sglang_message():
    with pytest.raises(ValueError, match=r"^Unknown speculative algorithm name: MYSPEC$"):
        resolve("MYSPEC", 3, 1)


@pytest.mark.parametrize(
    ("steps", "topk", "draft", "message"),
    [
        (None, 2, None, "need --speculative-num-steps"),
        (3, None, None, "--speculative-eagle-topk is not"),
        (3, 4, None, "--speculative-num-draft-tokens is required"),
        (0, 1, None, "--speculative-num-steps must be a positive integer, got 0"),
        (3, -1, 4, "--speculative-eagle-topk must be a positive integer"),
    ],
)
def test_combinations_sglang_rejects(steps, topk, draft, message):
    with pytest.raises(ValueError, match=message):
        resolve("EAGLE", steps, topk, draft)


def test_family_defaults_for_ngram_and_dflash():
    ngram = resolve("NGRAM")
    assert (ngram.num_steps, ngram.eagle_topk, ngram.num_draft_tokens) == (1, 10, 12)
    dflash = resolve("DFLASH", 4, 2)
    assert (dflash.num_steps, dflash.eagle_topk, dflash.num_draft_tokens) == (1, 1, 16)
    assert any("overriding speculative_num_steps=4 to 1" in w for w in dflash.warnings)


# -- faults and command line ----------------------------------------------------------------------------------------
def test_faults_parse_comma_lists_and_reject_unknown_names():
    assert faults.parse_faults(["never-load,degenerate", " slow-drain "]) == {"never-load", "degenerate", "slow-drain"}
    with pytest.raises(ValueError, match="unknown fault 'melt'; accepted: crash-on-load"):
        faults.parse_faults(["melt"])


@pytest.fixture
def gpu_state(tmp_path, monkeypatch):
    (tmp_path / "gpus").write_text(
        "# index\tuuid\ttotal_mib\tname\n"
        f"0\tGPU-0000\t{GPU_TOTAL}\tNVIDIA H100 80GB HBM3\n\n"
        f"1\tGPU-1111\t{GPU_TOTAL}\tNVIDIA H100 80GB HBM3\n"
    )
    monkeypatch.setenv("SIMGPU_STATE_DIR", str(tmp_path))
    return tmp_path


def parse(argv, env=None):
    environ = {"SIMGPU_STATE_DIR": os.environ["SIMGPU_STATE_DIR"], **(env or {})}
    return args.parse(["--model-path", "org/model", *argv], environ)


def test_knobs_come_from_env_and_the_flag_wins(gpu_state):
    ns, _ignored = parse([], {"SGLANG_SIM_LOAD_TIME": "7.5", "SGLANG_SIM_TOKEN_LATENCY_MS": "1"})
    assert (ns.sim_load_time, ns.sim_token_latency_ms, ns.sim_warmup_time) == (7.5, 1.0, 1.0)
    ns, _ignored = parse(["--sim-load-time", "0.5"], {"SGLANG_SIM_LOAD_TIME": "7.5"})
    assert ns.sim_load_time == 0.5


def test_faults_from_flags_and_env_are_combined_and_drain_defaults_follow(gpu_state):
    ns, _ignored = parse(
        ["--sim-fault", "degenerate", "--sim-fault", "orphan-schedulers,slow-drain"],
        {"SGLANG_SIM_FAULTS": "never-load"},
    )
    assert ns.faults == {"degenerate", "orphan-schedulers", "slow-drain", "never-load"}
    assert ns.sim_drain_time == args.SLOW_DRAIN_DEFAULT_DRAIN_TIME
    assert parse([])[0].sim_drain_time == args.DEFAULT_DRAIN_TIME


def test_defaults_and_gpu_assignment(gpu_state):
    ns, ignored = parse(["--tp", "2", "--enable-torch-compile", "--chunked-prefill-size", "4096"])
    assert [gpu.index for gpu in ns.rank_gpus] == [0, 1]
    assert ns.served_model_name == ns.tokenizer_path == "org/model"
    assert ns.mem_fraction_static == args.DEFAULT_MEM_FRACTION_STATIC
    assert ignored == ["--enable-torch-compile", "--chunked-prefill-size", "4096"]
    assert [g.index for g in parse(["--base-gpu-id", "1"])[0].rank_gpus] == [1]
    assert [g.uuid for g in parse([], {"CUDA_VISIBLE_DEVICES": "GPU-1111"})[0].rank_gpus] == ["GPU-1111"]


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--sim-load-time", "-1"], {}, "argument --sim-load-time (SGLANG_SIM_LOAD_TIME): must be >= 0"),
        ([], {"SGLANG_SIM_DRAIN_TIME": "-3"}, "argument --sim-drain-time (SGLANG_SIM_DRAIN_TIME): must be >= 0"),
        ([], {"SGLANG_SIM_WARMUP_TIME": "soon"}, "environment SGLANG_SIM_WARMUP_TIME: invalid float value: 'soon'"),
        (["--sim-fault", "explode"], {}, "argument --sim-fault: unknown fault 'explode'"),
        ([], {"SGLANG_SIM_FAULTS": "explode"}, "environment SGLANG_SIM_FAULTS: unknown fault 'explode'"),
        (["--port", "70000"], {}, "argument --port: must be in 1..65535, got 70000"),
        (["--tp-size", "4"], {}, "argument --tp-size: --tp-size 4 x --dp-size 1 needs 4 GPUs"),
        (["--tp-size", "0"], {}, "argument --tp-size: must be >= 1"),
        (["--mem-fraction-static", "1.5"], {}, "argument --mem-fraction-static: must be in (0, 1]"),
        (["--sim-load-tme", "1"], {}, "unrecognized arguments: --sim-load-tme"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(gpu_state, capsys, argv, env, named):
    with pytest.raises(SystemExit) as exited:
        parse(argv, env)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


def test_missing_gpu_list_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIMGPU_STATE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit):
        parse([])
    assert "cannot read the simulated GPU list" in capsys.readouterr().err


# -- GPU claims -----------------------------------------------------------------------------------------------------
def test_free_memory_counts_live_claims_only(gpu_state):
    gpu = gpu_claims.read_gpus()[0]
    assert gpu_claims.free_mib(gpu) == GPU_TOTAL - 1
    gpu_claims.write_claim(0, os.getpid(), 1000)
    dead = subprocess.Popen(["true"])
    dead.wait()
    gpu_claims.write_claim(0, dead.pid, 5000)
    gpu_claims.write_claim(1, os.getpid(), 7000)
    (gpu_state / "claims" / "gpu0.pidjunk").write_text("9")
    assert gpu_claims.free_mib(gpu) == GPU_TOTAL - 1 - 1000
    assert gpu_claims.free_mib(gpu, exclude_pid=os.getpid()) == GPU_TOTAL - 1
    gpu_claims.remove_claim(0, os.getpid())
    gpu_claims.remove_claim(0, os.getpid())
    assert gpu_claims.free_mib(gpu) == GPU_TOTAL - 1


def test_zombie_claims_do_not_count(gpu_state):
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    gpu_claims.write_claim(0, zombie.pid, 500)
    deadline = time.monotonic() + 10
    while gpu_claims.pid_alive(zombie.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gpu_claims.live_claims_mib(0) == 0
    zombie.wait()


# -- installed sources ----------------------------------------------------------------------------------------------
def test_enum_members_and_aliases_are_read_without_importing(tmp_path):
    package = tmp_path / "sglang"
    (package / "srt" / "speculative").mkdir(parents=True)
    (package / "srt" / "speculative" / "spec_info.py").write_text(
        "import torch\nclass SpeculativeAlgorithm(Enum):\n    EAGLE = auto()\n    MY_SPEC = auto()\n"
        "    _hidden = 1\n    def is_eagle(self):\n        return True\n"
    )
    (package / "srt" / "speculative" / "spec_registry.py").write_text('_RESERVED_ALIASES = frozenset({"NEXTN"})\n')
    members, aliases = sources.algorithm_names(sources.InstalledSglang(package, None))
    assert members == {"EAGLE", "MY_SPEC"}
    assert aliases == {"NEXTN"}


def test_modified_sources_are_found_and_compiled(tmp_path):
    package = tmp_path / "sglang"
    package.mkdir()
    good = package / "good.py"
    good.write_text("x = 1\n")
    digest = sources._sha256_b64(good.read_bytes())
    dist = tmp_path / "sglang-0.5.23.dist-info"
    dist.mkdir()
    (dist / "RECORD").write_text(f"sglang/good.py,sha256={digest},6\nsglang/changed.py,sha256=AAAA,6\n")
    (dist / "METADATA").write_text("Name: sglang\nVersion: 0.5.23\n")
    (package / "changed.py").write_text("def broken(:\n")
    (package / "added.py").write_text("y = 2\n")
    installed = sources.InstalledSglang(package, dist)
    assert installed.version() == "0.5.23"
    changed = sources.modified_sources(installed)
    assert sorted(p.name for p in changed) == ["added.py", "changed.py"]
    with pytest.raises(SyntaxError) as error:
        sources.compile_sources(changed)
    assert error.value.filename.endswith("changed.py")


def test_modified_sources_declare_faults_and_unknown_names_are_named(tmp_path):
    package = tmp_path / "sglang"
    package.mkdir()
    sampler = package / "sampler.py"
    sampler.write_text(
        "x = 1\n    #  sglang-sim-fault: degenerate, slow-drain\ny = 2  # sglang-sim-fault: crash-on-load\n"
    )
    (package / "quiet.py").write_text("z = 3\n")
    installed = sources.InstalledSglang(package, None)
    assert sources.declared_faults(installed, [sampler, package / "quiet.py"]) == {
        "sglang/sampler.py": {"degenerate", "slow-drain"}
    }
    sampler.write_text("# sglang-sim-fault: melt\n")
    with pytest.raises(ValueError, match=r"sglang/sampler.py: '# sglang-sim-fault: melt': unknown fault 'melt'"):
        sources.declared_faults(installed, [sampler])


def test_faults_added_after_parsing_move_the_drain_default_unless_it_was_given(gpu_state):
    ns, _ignored = parse([])
    args.add_faults(ns, frozenset({"slow-drain"}))
    assert ns.faults == {"slow-drain"} and ns.sim_drain_time == args.SLOW_DRAIN_DEFAULT_DRAIN_TIME
    ns, _ignored = parse(["--sim-fault", "degenerate"], {"SGLANG_SIM_DRAIN_TIME": "3"})
    args.add_faults(ns, frozenset({"slow-drain"}))
    assert ns.faults == {"degenerate", "slow-drain"} and ns.sim_drain_time == 3.0


# -- text and titles ------------------------------------------------------------------------------------------------
def test_greedy_text_is_deterministic_and_one_piece_per_token():
    key = textgen.generation_key("Hello", 0.0, seed=1, request_id="a")
    assert key == textgen.generation_key("Hello", 0.0, seed=2, request_id="b")
    assert textgen.generation_key("Hello", 0.7, 1, "a") != textgen.generation_key("Hello", 0.7, 1, "b")
    pieces = textgen.pieces(key, 64)
    assert len(pieces) == 64 and pieces == textgen.pieces(key, 64)
    text = "".join(pieces)
    assert text[0].isupper() and "." in text and len(text.split()) == 64
    assert "".join(textgen.degenerate_pieces(8)) == "!!!!!!!!"


def test_title_is_argv0_in_cmdline_and_comm():
    pid = os.fork()
    if pid == 0:
        try:
            proctitle.set_title("sglang::scheduler_TP0")
            signal.pause()
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if cmdline.startswith(b"sglang::"):
                break
            time.sleep(0.01)
        assert cmdline == b"sglang::scheduler_TP0\0"
        assert Path(f"/proc/{pid}/comm").read_text() == "sglang::schedul\n"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
