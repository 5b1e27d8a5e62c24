"""Command line: SGLang's own flags (the ones the simulator models) plus the --sim-* knobs.

Every knob also reads an environment variable SGLANG_SIM_<NAME> (e.g. --sim-load-time and
SGLANG_SIM_LOAD_TIME); the flag wins. Faults come from --sim-fault (repeatable, or a comma list)
together with SGLANG_SIM_FAULTS. Other SGLang flags are accepted and ignored with a warning;
unknown --sim-* flags are an error, and so is a flag spelled with "_": SGLang's parser
(sglang serve, sglang/srt/arg_groups/arg_utils.py `_field_to_cli_name`) has none.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from . import faults as faults_mod
from . import rendezvous, specmodel

DEFAULT_MEM_FRACTION_STATIC = 0.85
FAULT_ENV_VARS = ("SGLANG_SIM_FAULTS", "SGLANG_SIM_FAULT")
PROG = "sglang serve"


@dataclass(frozen=True)
class Knob:
    name: str
    kind: type
    default: float | int | None
    help: str
    minimum: float = 0.0
    maximum: float | None = None

    @property
    def flag(self) -> str:
        return f"--sim-{self.name}"

    @property
    def dest(self) -> str:
        return "sim_" + self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return "SGLANG_SIM_" + self.name.replace("-", "_").upper()


KNOBS = (
    Knob("load-time", float, 2.0, "seconds each scheduler takes to load (claims grow over this time)"),
    Knob("warmup-time", float, 1.0, "seconds after HTTP starts until /health turns 200"),
    Knob("drain-time", float, 90.0, "with the slow-drain fault: how long the request a SIGTERM finds lasts"),
    Knob(
        "sigterm-poll",
        float,
        5.0,
        "seconds between the SIGTERM watchdog's looks (SGLang's: 5); shorter only compresses a lab's time",
        0.05,
    ),
    Knob("token-latency-ms", float, 2.0, "milliseconds per plain decode step (one output token)"),
    Knob("prefill-ms-per-token", float, 0.02, "milliseconds of prefill per prompt token"),
    Knob("seed", int, 0, "seed of the accept-length noise and of sampled (temperature > 0) text"),
    Knob("noise", float, 0.03, "relative standard deviation of each request's accept length"),
    Knob(
        "batch-slowdown",
        float,
        specmodel.DEFAULT_BATCH_SLOWDOWN,
        "extra decode-step time per other running request (0.033 = +3.3 percent each)",
    ),
    Knob("weight-fraction", float, 0.45, "model weights per scheduler as a fraction of its GPU's memory", 0.0, 1.0),
    Knob("cuda-graph-mib", int, 256, "MiB each scheduler adds for CUDA graphs, outside --mem-fraction-static"),
    Knob(
        "nccl-allreduce-cost",
        float,
        0.12,
        "with --tp-size 2 or more and no custom all-reduce (disabled or failed to set up): the extra fraction of "
        "each decode step NCCL's all-reduce takes",
    ),
    Knob("draft-base-mib", int, 768, "MiB of draft model weights when speculative decoding is on"),
    Knob(
        "mem-overhead-mib-per-draft-token",
        int,
        1200,
        "MiB per unit of draft depth max(draft tokens, steps x top-k), outside --mem-fraction-static",
    ),
    Knob(
        "spec-accept-prob",
        float,
        None,
        "per-draft-token acceptance p (default per algorithm: EAGLE 0.70, ...)",
        0.0,
        0.999,
    ),
    Knob("spec-draft-step-cost", float, specmodel.DEFAULT_DRAFT_STEP_COST, "one draft step, in plain decode steps"),
    Knob("spec-topk-cost", float, specmodel.DEFAULT_TOPK_COST, "extra draft-step cost per extra top-k branch"),
    Knob("spec-verify-token-cost", float, specmodel.DEFAULT_VERIFY_TOKEN_COST, "verify cost per draft token"),
    Knob(
        "spec-draft-batch-cost",
        float,
        specmodel.DEFAULT_DRAFT_BATCH_COST,
        "growth of the draft cost per other running request",
    ),
    Knob(
        "spec-verify-batch-cost",
        float,
        specmodel.DEFAULT_VERIFY_BATCH_COST,
        "growth of the verify cost per other running request",
    ),
)


def _sglang_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model-path", "--model", dest="model_path", required=True, help="model weights path or Hugging Face id")
    add("--tokenizer-path", default=None)
    add("--served-model-name", default=None)
    add("--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int, default=1)
    add("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    add("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--mem-fraction-static", type=float, default=None)
    add("--context-length", type=int, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--speculative-algorithm", default=None)
    add("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    add("--speculative-num-steps", type=int, default=None)
    add("--speculative-eagle-topk", type=int, default=None)
    add("--speculative-num-draft-tokens", type=int, default=None)
    add("--speculative-adaptive", action="store_true")
    add("--speculative-adaptive-config", default=None)
    add("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int, default=1)
    add("--enable-multi-layer-eagle", action="store_true")
    add("--enable-two-batch-overlap", action="store_true")
    add("--enable-pdmux", action="store_true")
    add("--api-key", default=None)
    add("--log-level", default="info", type=str.lower, choices=["debug", "info", "warning", "error", "critical"])
    add("--trust-remote-code", action="store_true")
    add("--enable-metrics", action="store_true")
    add("--decode-log-interval", type=int, default=40)
    add("--base-gpu-id", type=int, default=0)
    add("--disable-custom-all-reduce", action="store_true")
    add("--gpu-id-step", type=int, default=1)
    add("--stream-interval", type=int, default=1)
    add("--incremental-streaming-output", action="store_true")
    add("--random-seed", type=int, default=None)
    add("--skip-server-warmup", action="store_true")
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    add("--dist-timeout", type=int, default=None)
    add("--config", default=None, help="Read CLI options from a config file. Must be a YAML file.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Simulated SGLang 0.5.23 server (a test double; see tests/lab/README.md).",
        allow_abbrev=False,
    )
    _sglang_flags(parser)
    sim = parser.add_argument_group("simulator knobs (each also from env SGLANG_SIM_<NAME>; the flag wins)")
    for knob in KNOBS:
        sim.add_argument(knob.flag, dest=knob.dest, type=knob.kind, default=None, help=f"{knob.help} [env {knob.env}]")
    sim.add_argument(
        "--sim-fault",
        dest="sim_fault",
        action="append",
        default=[],
        help="fault to show, NAME or NAME=N (repeatable or comma list; with env SGLANG_SIM_FAULTS): "
        + ", ".join(sorted(faults_mod.FAULTS)),
    )
    return parser


def _apply_env(parser: argparse.ArgumentParser, ns: argparse.Namespace, environ: dict) -> None:
    for knob in KNOBS:
        if getattr(ns, knob.dest) is not None:
            continue
        raw = environ.get(knob.env)
        if raw is None or raw.strip() == "":
            setattr(ns, knob.dest, knob.default)
            continue
        try:
            setattr(ns, knob.dest, knob.kind(raw.strip()))
        except ValueError:
            parser.error(f"environment {knob.env}: invalid {knob.kind.__name__} value: {raw!r}")


def _validate_knobs(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    for knob in KNOBS:
        value = getattr(ns, knob.dest)
        if value is None:
            continue
        if value < knob.minimum:
            parser.error(f"argument {knob.flag} ({knob.env}): must be >= {knob.minimum:g}, got {value}")
        if knob.maximum is not None and value > knob.maximum:
            parser.error(f"argument {knob.flag} ({knob.env}): must be <= {knob.maximum:g}, got {value}")


def _parse_faults(parser: argparse.ArgumentParser, ns: argparse.Namespace, environ: dict) -> dict:
    chosen: dict = {}
    for var in FAULT_ENV_VARS:
        try:
            chosen.update(faults_mod.parse_faults([environ.get(var, "")]))
        except ValueError as exc:
            parser.error(f"environment {var}: {exc}")
    try:
        chosen.update(faults_mod.parse_faults(ns.sim_fault))
    except ValueError as exc:
        parser.error(f"argument --sim-fault: {exc}")
    return chosen


def _validate_sglang(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if not 1 <= ns.port <= 65535:
        parser.error(f"argument --port: must be in 1..65535, got {ns.port}")
    for flag, value in (
        ("--tp-size", ns.tp_size),
        ("--dp-size", ns.dp_size),
        ("--gpu-id-step", ns.gpu_id_step),
        ("--stream-interval", ns.stream_interval),
    ):
        if value < 1:
            parser.error(f"argument {flag}: must be >= 1, got {value}")
    if ns.nnodes < 1:
        parser.error(f"argument --nnodes: must be >= 1, got {ns.nnodes}")
    # The lab's choice: SGLang takes any --node-rank and fails later in torch's rendezvous; the sim refuses it here.
    if not 0 <= ns.node_rank < ns.nnodes:
        parser.error(f"argument --node-rank: must be in 0..{ns.nnodes - 1} (--nnodes {ns.nnodes}), got {ns.node_rank}")
    if ns.dist_init_addr is not None:
        try:
            rendezvous.parse_addr(ns.dist_init_addr)
        except ValueError as exc:
            parser.error(f"argument --dist-init-addr: {exc}")
    if ns.base_gpu_id < 0:
        parser.error(f"argument --base-gpu-id: must be >= 0, got {ns.base_gpu_id}")
    if ns.mem_fraction_static is not None and not 0.0 < ns.mem_fraction_static <= 1.0:
        parser.error(f"argument --mem-fraction-static: must be in (0, 1], got {ns.mem_fraction_static}")
    if ns.context_length is not None and ns.context_length < 1:
        parser.error(f"argument --context-length: must be >= 1, got {ns.context_length}")


def store_true_keys(parser: argparse.ArgumentParser) -> set[str]:
    """The config keys of store_true flags (server_args_config_parser._config_keys)."""
    keys = set()
    for action in parser._actions:
        if isinstance(action, argparse._StoreTrueAction):
            keys.add(action.dest)
            keys.update(o[2:].replace("-", "_") for o in action.option_strings if o.startswith("--"))
    return keys


def _underscore_flags(ignored: list[str]) -> list[str]:
    """Flags with "_" (no SGLang flag has one) and the values that follow them."""
    bad = []
    for index, arg in enumerate(ignored):
        if arg.startswith("--") and "_" in arg.split("=", 1)[0]:
            bad.append(arg)
            if "=" not in arg and index + 1 < len(ignored) and not ignored[index + 1].startswith("-"):
                bad.append(ignored[index + 1])
    return bad


def parse(argv: list[str], environ: dict | None = None) -> tuple[argparse.Namespace, list[str]]:
    """Parse and validate; exits with status 2 and a message naming the flag on bad input.

    Returns the namespace (with `faults` and defaults filled in) and the ignored SGLang arguments.
    """
    environ = dict(os.environ if environ is None else environ)
    parser = build_parser()
    ns, ignored = parser.parse_known_args(argv)
    unknown = [arg for arg in ignored if arg.startswith("--sim-")] + _underscore_flags(ignored)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    _apply_env(parser, ns, environ)
    _validate_knobs(parser, ns)
    _validate_sglang(parser, ns)
    ns.faults = _parse_faults(parser, ns, environ)
    ns.tokenizer_path = ns.tokenizer_path or ns.model_path
    ns.served_model_name = ns.served_model_name or ns.model_path
    ns.mem_fraction_static_given = ns.mem_fraction_static is not None
    if ns.mem_fraction_static is None:
        ns.mem_fraction_static = DEFAULT_MEM_FRACTION_STATIC
    return ns, ignored


def add_faults(ns: argparse.Namespace, chosen: dict) -> None:
    """Turn on more faults (also after parsing, for faults the patched sources declare)."""
    ns.faults = {**ns.faults, **chosen}
