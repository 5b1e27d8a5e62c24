"""Unit tests of sglang_sim's pure parts: the speculative model, argument rules, the config file, CUDA's device
enumeration, sources, GPU claims, text."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB_DIR))
sys.path.insert(0, str(LAB_DIR / "simgpu"))

import simgpu_state  # noqa: E402
from sglang_sim import (  # noqa: E402
    allreduce,
    args,
    configfile,
    cuda_devices,
    faults,
    gpu_claims,
    launch_server,
    proctitle,
    scheduler,
    sources,
    spec_args,
    specmodel,
    textgen,
)

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
    # CUDA's total leaves the driver's reservation out; the KV cache takes all but (1 - mem_fraction_static) of it.
    reserve = (GPU_TOTAL - simgpu_state.DEFAULT_RESERVED_MIB) * (1 - args.DEFAULT_MEM_FRACTION_STATIC)

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
def test_faults_parse_comma_lists_values_and_reject_unknown_names():
    chosen = faults.parse_faults(["never-load,degenerate", " slow-drain ", "hang-after-requests=100,progress-stall"])
    assert chosen == {
        "never-load": None,
        "degenerate": None,
        "slow-drain": None,
        "hang-after-requests": 100,
        "progress-stall": 0,
    }
    assert faults.parse_faults(["progress-stall=7"]) == {"progress-stall": 7}
    with pytest.raises(ValueError, match="unknown fault 'melt'; accepted: crash-on-load"):
        faults.parse_faults(["melt"])
    with pytest.raises(ValueError, match="'hang-after-requests' needs a value"):
        faults.parse_faults(["hang-after-requests"])
    with pytest.raises(ValueError, match="fault 'degenerate' takes no value"):
        faults.parse_faults(["degenerate=1"])
    with pytest.raises(ValueError, match="'x' is not a whole number"):
        faults.parse_faults(["progress-stall=x"])


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


def test_faults_from_flags_and_env_are_combined(gpu_state):
    ns, _ignored = parse(
        ["--sim-fault", "degenerate", "--sim-fault", "orphan-schedulers,slow-drain"],
        {"SGLANG_SIM_FAULTS": "never-load,hang-after-requests=4"},
    )
    assert set(ns.faults) == {"degenerate", "orphan-schedulers", "slow-drain", "never-load", "hang-after-requests"}
    assert ns.faults["hang-after-requests"] == 4
    assert ns.sim_drain_time == 90.0  # the slow-drain request's length; there is no other drain limit


def test_defaults_and_ignored_flags(gpu_state):
    ns, ignored = parse(["--tp", "2", "--enable-torch-compile", "--chunked-prefill-size", "4096"])
    assert ns.tp_size == 2 and ns.served_model_name == ns.tokenizer_path == "org/model"
    assert ns.mem_fraction_static == args.DEFAULT_MEM_FRACTION_STATIC
    assert ignored == ["--enable-torch-compile", "--chunked-prefill-size", "4096"]
    assert ns.sim_batch_slowdown == specmodel.DEFAULT_BATCH_SLOWDOWN


def test_each_rank_gets_sglangs_gpu_id():
    ns, _ignored = args.parse(
        ["--model-path", "m", "--tp-size", "2", "--dp-size", "2", "--base-gpu-id", "1", "--gpu-id-step", "2"], {}
    )
    installed = sources.InstalledSglang(Path("/nonexistent/sglang"), None)
    model = launch_server.info.read_model_config("m", None)
    spec = spec_args.resolve(None, None, None, None, members=frozenset(), aliases=frozenset(), model_arch=None)
    plans = launch_server._plans(ns, spec, model, installed)
    # base_gpu_id + dp_rank * tp_size * gpu_id_step + tp_rank * gpu_id_step
    assert [(p.title, p.gpu_id) for p in plans] == [
        ("sglang::scheduler_DP0_TP0", 1),
        ("sglang::scheduler_DP0_TP1", 3),
        ("sglang::scheduler_DP1_TP0", 5),
        ("sglang::scheduler_DP1_TP1", 7),
    ]


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--sim-load-time", "-1"], {}, "argument --sim-load-time (SGLANG_SIM_LOAD_TIME): must be >= 0"),
        ([], {"SGLANG_SIM_DRAIN_TIME": "-3"}, "argument --sim-drain-time (SGLANG_SIM_DRAIN_TIME): must be >= 0"),
        ([], {"SGLANG_SIM_WARMUP_TIME": "soon"}, "environment SGLANG_SIM_WARMUP_TIME: invalid float value: 'soon'"),
        (["--sim-fault", "explode"], {}, "argument --sim-fault: unknown fault 'explode'"),
        ([], {"SGLANG_SIM_FAULTS": "explode"}, "environment SGLANG_SIM_FAULTS: unknown fault 'explode'"),
        (["--port", "70000"], {}, "argument --port: must be in 1..65535, got 70000"),
        (["--api_key", "sk-x"], {}, "unrecognized arguments: --api_key sk-x"),
        (["--sim-fault", "hang-after-requests"], {}, "'hang-after-requests' needs a value"),
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


def test_no_gpu_list_is_a_missing_driver(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMGPU_STATE_DIR", str(tmp_path / "nowhere"))
    plan = scheduler.RankPlan(
        0, "sglang::scheduler", "", 0, 0, 1, None, 0.1, 0.45, 0.85, 256, 0, "x", "info", False, False, False
    )
    with pytest.raises(RuntimeError, match="Found no NVIDIA driver on your system"):
        scheduler._device(plan)


def test_an_old_interpreter_finds_no_sglang(monkeypatch, capsys):
    monkeypatch.setattr(sys, "version_info", (3, 10, 12, "final", 0))
    assert launch_server.main(["--model-path", "m"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"{sys.executable}: Error while finding module specification for 'sglang.launch_server' "
        "(ModuleNotFoundError: No module named 'sglang')\n"
    )


# -- GPU claims -----------------------------------------------------------------------------------------------------
def device(index: int) -> cuda_devices.CudaDevice:
    return cuda_devices.CudaDevice(index, None, f"GPU-{index}", GPU_TOTAL, "NVIDIA H100 80GB HBM3")


def test_free_memory_counts_live_claims_and_lagging_ones(gpu_state, monkeypatch):
    monkeypatch.setenv("SIMGPU_RELEASE_LAG_MS", "0")
    assert gpu_claims.free_mib(device(0)) == GPU_TOTAL - 1
    gpu_claims.write_claim(device(0), os.getpid(), 1000)
    dead = subprocess.Popen(["true"])
    dead.wait()
    gpu_claims.write_claim(device(0), dead.pid, 5000)
    gpu_claims.write_claim(device(1), os.getpid(), 7000)
    (gpu_state / "claims" / "gpu0.pidjunk").write_text("9")
    assert gpu_claims.free_mib(device(0)) == GPU_TOTAL - 1 - 1000
    assert gpu_claims.free_mib(device(0), exclude_pid=os.getpid()) == GPU_TOTAL - 1
    monkeypatch.setenv("SIMGPU_RELEASE_LAG_MS", "60000")
    gone = subprocess.Popen(["true"])
    gone.wait()
    gpu_claims.write_claim(device(1), gone.pid, 300)
    assert gpu_claims.free_mib(device(1)) == GPU_TOTAL - 1 - 7000 - 300  # released only after the lag
    gpu_claims.mark_exiting(os.getpid())
    assert gpu_claims.free_mib(device(1)) == GPU_TOTAL - 1 - 7000 - 300  # exiting starts the lag too


def test_zombie_claims_do_not_count_unless_marked(gpu_state, monkeypatch):
    monkeypatch.setenv("SIMGPU_RELEASE_LAG_MS", "0")
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    gpu_claims.write_claim(device(0), zombie.pid, 500)
    simgpu_state.write_claim(gpu_state, 1, None, zombie.pid, 700, [simgpu_state.FLAG_ZOMBIE])
    deadline = time.monotonic() + 10
    while simgpu_state.process_state(zombie.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gpu_claims.free_mib(device(0)) == GPU_TOTAL - 1
    assert gpu_claims.free_mib(device(1)) == GPU_TOTAL - 1 - 700
    zombie.wait()


# -- CUDA's device enumeration --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        # PyTorch's test/test_cuda_nvml_based_avail.py TestVisibleDeviceParses, which pins the driver's rules.
        ("1gpu2,2ampere", [1, 2]),
        ("0, 1, 2, -1, 3", [0, 1, 2]),
        ("0, 1, 2, 1", []),
        ("2, +3, -0, 5", [2, 3, 0, 5]),
        ("one,two,3,4", []),
        ("4,3,two,one", [4, 3]),
        ("GPU-9e8d35e3", ["GPU-9e8d35e3"]),
        ("GPU-123, 2", ["GPU-123"]),
        ("MIG-89c850dc", ["MIG-89c850dc"]),
        ("", []),
        (None, None),
    ],
)
def test_cuda_visible_devices_parses_as_the_driver_does(value, parsed):
    assert cuda_devices.parse_visible_devices(value) == parsed


def gpus_with_mig(mig_on: int | None = None):
    gpus = []
    for index in range(4):
        migs = ()
        if index == mig_on:
            migs = tuple(
                simgpu_state.MigDevice(index, k, f"MIG-{index}{k}aa", 40320, "3g.40gb", k + 1, 0, "H100")
                for k in range(2)
            )
        gpus.append(simgpu_state.Gpu(index, f"GPU-{index}{index}ab", GPU_TOTAL, "H100", migs))
    return gpus


@pytest.mark.parametrize(
    ("value", "mig_on", "labels"),
    [
        (None, None, ["0", "1", "2", "3"]),
        ("2,3", None, ["2", "3"]),
        ("1, 5, 0", None, ["1"]),  # an ordinal past the last GPU ends the list
        ("GPU-22,GPU-0", None, ["2", "0"]),  # unique UUID prefixes
        ("GPU-1,GPU-", None, ["1"]),  # an ambiguous prefix ends the list
        ("GPU-33,GPU-3", None, []),  # two prefixes naming one GPU make it empty
        ("GPU-nope,GPU-0", None, []),
        (None, 1, ["1:0"]),  # one MIG device, and no whole GPU once a MIG device is enumerated
        ("0,2", 1, ["0", "2"]),
        ("1", 1, ["1:0"]),
        ("MIG-11,MIG-10", 1, ["1:1"]),
    ],
)
def test_visible_devices_follow_cuda(value, mig_on, labels):
    devices = cuda_devices.visible_devices(gpus_with_mig(mig_on), value)
    assert [d.label for d in devices] == labels
    if labels and ":" in labels[0]:
        assert devices[0].total_mib == 40320 and devices[0].name == "H100 MIG 3g.40gb"


# -- --config -------------------------------------------------------------------------------------------------------
def test_the_config_file_reader_reads_what_pyyaml_would(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "---\n# a comment\napi-key: 'sk-a#b'  # trailing comment\nport: 30001\nmem-fraction-static: 0.8\n"
        'enable-metrics: yes\nskip-server-warmup: off\nhost: ~\nrevision: "v1"\nnote: plain text here\n'
        "tp: 0x2\nlist-flow: [a, 2, true]\nlist-block:\n  - x\n  - 'y z'\nempty:\n"
    )
    assert configfile.load(str(config)) == {
        "api-key": "sk-a#b",
        "port": 30001,
        "mem-fraction-static": 0.8,
        "enable-metrics": True,
        "skip-server-warmup": False,
        "host": None,
        "revision": "v1",
        "note": "plain text here",
        "tp": 2,
        "list-flow": ["a", 2, True],
        "list-block": ["x", "y z"],
        "empty": None,
    }


def test_config_arguments_go_first_so_the_command_line_wins(tmp_path):
    config = tmp_path / "c.yml"
    config.write_text("port: 1\nenable-metrics: true\nskip-server-warmup: false\ntrust-remote-code: 'no'\nx: null\n")
    keys = args.store_true_keys(args.build_parser())
    merged = configfile.merge(["--model-path", "m", "--config", str(config), "--port", "2"], keys)
    from_file = ["--port", "1", "--enable-metrics", "--trust-remote-code", "no", "--x", "None"]
    assert merged == [*from_file, "--model-path", "m", "--port", "2"]
    assert configfile.merge(["--config=c.yaml", "--port", "3"], keys) == ["--config=c.yaml", "--port", "3"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "a.yaml", "--config", "b.yaml"], "Multiple config files specified! Only one allowed."),
        (["--config"], "No config file specified after --config flag!"),
        (["--config", "c.json"], "Config file must be YAML format, got: .json"),
        (["--config", "/nonexistent/c.yaml"], "Config file not found: /nonexistent/c.yaml"),
    ],
)
def test_config_files_sglang_rejects(argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        configfile.merge(argv, set())


@pytest.mark.parametrize(
    "text",
    ["a:\n  b: 1\n", "a: &x 1\n", "a: |\n  text\n", "a: {b: 1}\n", "a: [1, [2]]\n", "- 1\n", "a: 1\n---\nb: 2\n"],
)
def test_yaml_the_reader_does_not_read_is_refused(tmp_path, text):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(configfile.UnsupportedYaml, match="flat 'key: value' YAML config files only"):
        configfile.load(str(config))


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
        "sglang/sampler.py": {"degenerate": None, "slow-drain": None}
    }
    sampler.write_text("# sglang-sim-fault: melt\n")
    with pytest.raises(ValueError, match=r"sglang/sampler.py: '# sglang-sim-fault: melt': unknown fault 'melt'"):
        sources.declared_faults(installed, [sampler])


def test_faults_added_after_parsing_join_the_others(gpu_state):
    ns, _ignored = parse(["--sim-fault", "degenerate"])
    args.add_faults(ns, {"slow-drain": None, "hang-after-requests": 2})
    assert ns.faults == {"degenerate": None, "slow-drain": None, "hang-after-requests": 2}


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
    # The child reports once both the argv block and the comm name are written: polling cmdline alone
    # raced the prctl that follows it.
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_read)
            proctitle.set_title("sglang::scheduler_TP0")
            os.write(ready_write, b"1")
            signal.pause()
        finally:
            os._exit(0)
    os.close(ready_write)
    try:
        assert os.read(ready_read, 1) == b"1"
        assert Path(f"/proc/{pid}/cmdline").read_bytes() == b"sglang::scheduler_TP0\0"
        assert Path(f"/proc/{pid}/comm").read_text() == "sglang::schedul\n"
    finally:
        os.close(ready_read)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


# -- the speculative model under load, and the README's tables ------------------------------------------------------
README = LAB_DIR / "README.md"


def readme_table(heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after the line that starts with `heading`."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if not set("".join(cells)) <= set("-: "):
            rows.append(cells)
    return rows[1:]


def test_the_best_step_count_falls_as_the_batch_grows_with_defaults():
    assert specmodel.best_steps(EAGLE, 1) == 4
    assert specmodel.best_steps(EAGLE, 8) == 3
    assert specmodel.best_steps(EAGLE, 32) == 2

    def margin(running: int) -> float:
        values = sorted((specmodel.throughput(s, 1, s + 1, EAGLE, running) for s in range(1, 9)), reverse=True)
        return values[0] / values[1] - 1

    assert margin(1) > 0.01 and margin(32) > 0.02  # a clear winner at both ends


def test_step_cost_grows_with_the_batch_and_verify_tokens_most():
    plain = [specmodel.plain_step_cost(n) for n in (1, 8, 32)]
    assert plain == sorted(plain) and plain[0] == 1.0
    cheap, deep = (specmodel.step_cost(*chain(s), EAGLE, running=32) for s in (2, 6))
    assert deep - cheap > specmodel.step_cost(*chain(6), EAGLE) - specmodel.step_cost(*chain(2), EAGLE)


def test_readme_single_request_table_is_the_model():
    rows = readme_table("EAGLE with defaults, one request")
    assert [int(r[0]) for r in rows] == list(range(1, 11))
    for row in rows:
        steps = int(row[0])
        expected = [
            str(steps + 1),
            f"{specmodel.accept_length(*chain(steps), EAGLE):.2f}",
            f"{specmodel.step_cost(*chain(steps), EAGLE):.3f}",
            f"{specmodel.speedup(*chain(steps), EAGLE):.2f}",
            str(256 + specmodel.draft_memory_mib(*chain(steps), 768, 1200)),
        ]
        assert row[1:6] == expected, row
        assert row[6].startswith("yes" if 256 + specmodel.draft_memory_mib(*chain(steps), 768, 1200) < 12233 else "no")


def test_readme_concurrency_table_is_the_model():
    rows = readme_table("Batch throughput relative to steps 1")
    columns = [1, 2, 4, 8, 16, 32, 64]
    for row in rows[:-1]:
        steps = int(row[0])
        expected = [
            f"{specmodel.throughput(*chain(steps), EAGLE, c) / specmodel.throughput(*chain(1), EAGLE, c):.3f}"
            for c in columns
        ]
        assert row[1:] == expected, row
    assert rows[-1] == ["best", *(str(specmodel.best_steps(EAGLE, c)) for c in columns)]


def test_nccl_all_reduce_costs_decode_throughput(monkeypatch):
    """With custom all-reduce failed (a GPU UUID in CUDA_VISIBLE_DEVICES) or off, tp >= 2 decodes slower."""
    assert allreduce.setup_error(2, False, "GPU-a,GPU-b") == "invalid literal for int() with base 10: 'GPU-a'"
    assert allreduce.setup_error(2, False, "0,1") is None
    assert allreduce.setup_error(1, False, "GPU-a") is None
    assert allreduce.setup_error(2, True, "GPU-a,GPU-b") is None
    assert allreduce.setup_error(3, False, "GPU-a,GPU-b,GPU-c") is None  # an unsupported world size never parses
    ns, _ignored = args.parse(["--model-path", "m", "--tp-size", "2"], {})
    model = launch_server.info.read_model_config("m", None)
    spec = spec_args.resolve(None, None, None, None, members=frozenset(), aliases=frozenset(), model_arch=None)
    latency = {}
    for visible in ("0,1", "GPU-0000-sim,GPU-0001-sim"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        latency[visible] = launch_server._engine(ns, spec, model, 8).config.token_latency_s
    assert latency["GPU-0000-sim,GPU-0001-sim"] == pytest.approx(latency["0,1"] * (1 + ns.sim_nccl_allreduce_cost))
    assert ns.sim_nccl_allreduce_cost > 0
