# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""From a sweep to SGLang's adaptive speculative decoding: the config derived from the per-level results, SGLang's
refusals, and the checks SGLang makes of a config at start (and the ones it skips silently).

Private to the llmops.inference collection; not a public API. Pure functions, standard library only.

SGLang 0.5.23 switches ``--speculative-num-steps`` at run time with ``--speculative-adaptive`` and
``--speculative-adaptive-config FILE`` (``srt/arg_groups/fields/spec.py``): a JSON object keyed by batch size
(digit strings), each entry with ``candidate_steps`` and optional knobs; keys that are not digit strings are knobs
every entry inherits (``srt/speculative/adaptive_spec_params.py`` ``_load_adaptive_config`` and
``AdaptiveSpeculativeParams``). A running batch is served by the entry of the largest key at or below its size.

The derived config:

- one key per measured load level (the concurrency, as the batch size it runs at);
- its ``candidate_steps``: the steps of every top-k 1 point measured there whose median output tok/s is within
  ``margin`` (a fraction) of that level's best median, lossless points only (a row whose ``lossless`` is false is
  left out; a row without the field counts as lossless);
- the other knobs at SGLang's ``AdaptiveStepSlot`` defaults, written out so the file says what runs.
"""

from __future__ import annotations

import csv
import io
import json

from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import MEASURED

ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")
ALGORITHM_ALIASES = {"NEXTN": "EAGLE"}
# AdaptiveStepSlot.__init__ (adaptive_spec_params.py:171-176): the knobs and their defaults.
KNOB_DEFAULTS = {
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
    "ceiling_coeff": 0,
}
# DEFAULT_ADAPTIVE_CONFIG (adaptive_spec_params.py:28-53): what SGLang runs without --speculative-adaptive-config.
SGLANG_DEFAULT_CONFIG = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


def _flag_value(args: list, *flags: str):
    value = None
    for index, arg in enumerate(args):
        for flag in flags:
            if arg == flag and index + 1 < len(args):
                value = args[index + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
    return value


def _flag_on(args: list, flag: str) -> bool:
    value = _flag_value(args, flag)
    return flag in args or (value is not None and value.lower() in ("true", "1", "yes"))


def unsupported_reason(algorithm: str | None, topk, extra_args=None) -> str | None:
    """SGLang's adaptive_unsupported_reason (adaptive_spec_params.py:56-100) for an engine's arguments, in its words;
    None when adaptive can run. ``topk`` may be None (SGLang then sets 1)."""
    args = [str(arg) for arg in extra_args or []]
    name = algorithm.strip().upper() if isinstance(algorithm, str) and algorithm.strip() else None
    name = ALGORITHM_ALIASES.get(name, name)
    attn_dp = _flag_value(args, "--attn-dp-size", "--attention-data-parallel-size")
    checks = (
        (name not in ADAPTIVE_ALGORITHMS, f"speculative_algorithm={name} (only EAGLE/EAGLE3 are supported)"),
        (topk is not None and topk != 1, f"speculative_eagle_topk={topk} (only topk=1 is supported)"),
        (
            attn_dp is not None and attn_dp.isdigit() and int(attn_dp) > 1,
            "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)",
        ),
        (
            _flag_on(args, "--enable-multi-layer-eagle"),
            "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)",
        ),
        (
            _flag_on(args, "--enable-two-batch-overlap"),
            "enable_two_batch_overlap=True is not supported "
            "(adaptive state swap would discard the TboAttnBackend wrapper)",
        ),
        (
            _flag_on(args, "--enable-pdmux"),
            "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)",
        ),
    )
    return next((reason for failed, reason in checks if failed), None)


def sweep_refusal(algorithm: str, topks: list, host_args: dict) -> dict | None:
    """Why this sweep cannot give an adaptive config, checked when it is planned: SGLang's reason for the algorithm,
    for a grid without top-k 1, or for a host's arguments (naming the host); None when it can."""
    reason = unsupported_reason(algorithm, None)
    if reason is None and 1 not in topks:
        reason = unsupported_reason(algorithm, min(topks))
    if reason is not None:
        return {"reason": reason, "host": None}
    for host, args in sorted((host_args or {}).items()):
        reason = unsupported_reason(algorithm, 1, args)
        if reason is not None:
            return {"reason": reason, "host": host}
    return None


def _lossless(row: dict) -> bool:
    return row.get("lossless") is not False


def derive_config(rows: list, levels: list, margin: float) -> dict:
    """The adaptive config from one row per point and level (sweep_records.summarize), with where each number came
    from. Returns {config, entries, reason}: config None (and reason) when no level has a usable point."""
    entries = []
    config = {}
    for level in levels:
        at_level = [
            row
            for row in rows
            if row["concurrency"] == level and row["status"] == MEASURED and row["output_throughput_median"]
        ]
        usable = [row for row in at_level if row["topk"] == 1 and _lossless(row)]
        excluded = [
            {"id": row["id"], "why": "not lossless" if not _lossless(row) else f"top-k {row['topk']}"}
            for row in at_level
            if row not in usable
        ]
        entry = {"concurrency": level, "key": str(level), "best": None, "candidates": [], "excluded": excluded}
        if usable:
            best = max(usable, key=lambda row: (row["output_throughput_median"], -row["steps"]))
            floor = best["output_throughput_median"] * (1.0 - margin)
            near = sorted((row for row in usable if row["output_throughput_median"] >= floor), key=lambda r: r["steps"])
            entry["best"] = _source(best, best)
            entry["candidates"] = [_source(row, best) for row in near]
            config[str(level)] = dict({"candidate_steps": sorted({row["steps"] for row in near})}, **KNOB_DEFAULTS)
        else:
            entry["reason"] = "no lossless top-k 1 point was measured at this level"
        entries.append(entry)
    reason = None if config else "no load level has a lossless top-k 1 point measured"
    return {"config": config or None, "entries": entries, "reason": reason}


def _source(row: dict, best: dict) -> dict:
    return {
        "id": row["id"],
        "steps": row["steps"],
        "output_throughput_median": row["output_throughput_median"],
        "output_throughput_mad": row.get("output_throughput_mad"),
        "ratio_to_best": row["output_throughput_median"] / best["output_throughput_median"],
        "host": row.get("host"),
    }


def static_args(point: dict | None) -> list:
    """The SGLang arguments of a static point (the fallback when adaptive is refused or not wanted)."""
    if not point:
        return []
    return [
        "--speculative-num-steps",
        str(point["steps"]),
        "--speculative-eagle-topk",
        str(point["topk"]),
        "--speculative-num-draft-tokens",
        str(point["draft_tokens"]),
    ]


def adaptive_args(config_path: str) -> list:
    """The two flags that turn adaptive on with a config file."""
    return ["--speculative-adaptive", "--speculative-adaptive-config", config_path]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


KNOB_CHECKS = {
    "ema_alpha": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "update_interval": (lambda v: _is_int(v) and v >= 1, "an integer >= 1 (SGLang divides by it)"),
    "warmup_batches": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "down_hysteresis": (_is_number, "a number"),
    "up_hysteresis": (_is_number, "a number"),
    "ceiling_coeff": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0 turns the ceiling off)"),
}


def _knob_errors(where: str, entry: dict) -> list:
    errors = []
    for knob, value in entry.items():
        if knob == "candidate_steps":
            continue
        check = KNOB_CHECKS.get(knob)
        if check is None:
            errors.append(
                f"{where}: unknown knob {knob!r} (SGLang ignores it and runs the default; known: "
                f"candidate_steps, {', '.join(KNOB_CHECKS)})"
            )
        elif not check[0](value):
            errors.append(f"{where}: {knob} must be {check[1]}, got {value!r}")
    return errors


def config_errors(config) -> list:
    """Every reason SGLang would refuse this adaptive config at start, or silently not run what it says; each
    names its entry. Empty: the config is good."""
    if not isinstance(config, dict):
        return [f"the adaptive config must be a JSON object keyed by batch size, got {type(config).__name__}"]
    errors = []
    keys = []
    for key, entry in config.items():
        if _is_int(key) and key >= 0:  # a YAML mapping's integer key: JSON writes it as the digit string
            key = str(key)
        if not isinstance(key, str) or not key.isdigit():
            if key in KNOB_CHECKS:
                errors += _knob_errors("top level", {key: entry})
            else:
                errors.append(
                    f'entry {key!r}: the key is not a batch size (a non-negative integer such as "4"); SGLang '
                    "reads only digit-string keys and would silently skip this entry"
                )
            continue
        where = f"entry {key!r}"
        if not isinstance(entry, dict):
            errors.append(f"{where}: must be an object with candidate_steps, got {entry!r}")
            continue
        keys.append(key)
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(_is_int(step) and step >= 0 for step in steps):
            errors.append(
                f"{where}: candidate_steps must be a non-empty list of non-negative integers, got {steps!r} "
                "(SGLang: candidate_steps must be a list of non-negative ints)"
            )
        errors += _knob_errors(where, entry)
    if not keys and not errors:
        errors.append(
            "the adaptive config has no batch-size entry (SGLang: speculative_adaptive_config must contain at least "
            'one integer-string BS key, e.g. {"1": {"candidate_steps": [1,3,7]}})'
        )
    return errors


def candidate_union(config: dict) -> list:
    """Every entry's candidate steps together: the steps the engine may start at (SGLang requires
    --speculative-num-steps among them, and takes the middle one when it is unset)."""
    return sorted(
        {step for key, entry in normalize_config(config).items() if key.isdigit() for step in entry["candidate_steps"]}
    )


def normalize_config(config: dict) -> dict:
    """The config with string keys (a YAML mapping may give integers), batch sizes in ascending order first."""
    named = {str(key): value for key, value in config.items()}

    def order(key: str) -> tuple:
        return (not key.isdigit(), int(key) if key.isdigit() else 0, key)

    return {key: named[key] for key in sorted(named, key=order)}


def render_config(config: dict) -> str:
    """The config file's text: keys in batch-size order, stable, ending in a newline."""
    return json.dumps(normalize_config(config), indent=2) + "\n"


DEFAULT_ADAPTIVE_MARGIN = 0.02


def deployable(rows: list, levels: list, definition: dict, choice: dict) -> dict:
    """What a sweep hands to a deploy: the static setting (the applied choice) and the adaptive config, each with
    where it came from; the adaptive one refused with SGLang's reason when the sweep's engines cannot run it."""
    adaptive = definition.get("adaptive") or {}
    margin = adaptive.get("margin", DEFAULT_ADAPTIVE_MARGIN)
    refused = adaptive.get("refused")
    point = choice.get("point")
    static = {
        "rule": choice.get("rule"),
        "point": point,
        "args": static_args(point),
        "reason": choice.get("reason"),
        "source": f"the {choice.get('rule')} choice of this report",
    }
    if refused:
        where = f" (host {refused['host']}'s sglang_service_extra_args)" if refused.get("host") else ""
        derived = {
            "config": None,
            "entries": [],
            "margin": margin,
            "refused": refused,
            "reason": f"SGLang would not run adaptive speculative decoding here{where}: {refused['reason']}",
        }
    else:
        derived = dict(derive_config(rows, levels, margin), margin=margin, refused=None)
    derived["algorithm"] = definition.get("algorithm")
    derived["knobs"] = dict(KNOB_DEFAULTS)
    derived["source"] = (
        f"per load level: the steps of the lossless top-k 1 points whose median output tok/s is within "
        f"{margin * 100:g} % of that level's best median; other knobs at SGLang's AdaptiveStepSlot defaults"
    )
    return {"static": static, "adaptive": derived, "sglang_default_config": SGLANG_DEFAULT_CONFIG}


def markdown_lines(deploy: dict) -> list:
    """The report's section on the deployable configuration."""
    static, adaptive = deploy["static"], deploy["adaptive"]
    lines = ["", "## Deployable configuration", "", "### Static (the fallback)", ""]
    if static["point"]:
        lines.append(f"`{' '.join(static['args'])}`: {static['source']}.")
    else:
        lines.append(f"None ({static['reason']}).")
    lines += ["", "### Adaptive (`--speculative-adaptive --speculative-adaptive-config FILE`)", ""]
    lines.append("FILE: results-adaptive-config.json of this results directory.")
    lines.append(adaptive["source"] + ".")
    if adaptive["config"] is None:
        lines += ["", f"No adaptive config: {adaptive['reason']}."]
        return lines
    lines += [
        "",
        "| batch-size key | candidate steps | from (steps: median tok/s, ratio to the level's best, host) | left out |",
        "|---:|---|---|---|",
    ]
    for entry in adaptive["entries"]:
        steps = adaptive["config"].get(entry["key"], {}).get("candidate_steps")
        sources = "; ".join(
            f"{item['steps']}: {item['output_throughput_median']:.1f}, {item['ratio_to_best']:.3f}, "
            f"{item['host'] or '-'}"
            for item in entry["candidates"]
        )
        left = ", ".join(f"{item['id']} ({item['why']})" for item in entry["excluded"]) or "-"
        shown = steps if steps is not None else f"none: {entry.get('reason')}"
        lines.append(f"| {entry['key']} | {shown} | {sources or '-'} | {left} |")
    lines += ["", "```json", render_config(adaptive["config"]).rstrip("\n"), "```"]
    return lines


def adaptive_csv(deploy: dict) -> str:
    """One row per batch-size key and candidate point: where each candidate step came from."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["kind", "key", "steps", "point_id", "output_throughput_median", "ratio_to_best", "host", "note"])
    static = deploy["static"]
    if static["point"]:
        writer.writerow(["static", "", static["point"]["steps"], static["point"]["id"], "", "", "", static["source"]])
    adaptive = deploy["adaptive"]
    if adaptive["config"] is None:
        writer.writerow(["adaptive", "", "", "", "", "", "", adaptive["reason"]])
    for entry in adaptive["entries"]:
        for item in entry["candidates"]:
            note = "best" if entry["best"] and item["id"] == entry["best"]["id"] else "within margin"
            writer.writerow(
                [
                    "adaptive",
                    entry["key"],
                    item["steps"],
                    item["id"],
                    item["output_throughput_median"],
                    round(item["ratio_to_best"], 4),
                    item["host"],
                    note,
                ]
            )
        if not entry["candidates"]:
            writer.writerow(["adaptive", entry["key"], "", "", "", "", "", entry.get("reason", "")])
    return out.getvalue()
