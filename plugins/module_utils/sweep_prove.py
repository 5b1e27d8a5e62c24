# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep proves its deployable configuration in the same run: after the grid, one engine measures, at every
load level and in alternating order, the adaptive setting with the derived config, SGLang's default adaptive
config, the best static setting, no speculation, and each level's best static point (the reference).

Private to the llmops.inference collection; not a public API. Pure functions, standard library only.

Each arm is loaded once per round and measured at every level; round r measures the arms rotated by r, so no arm
always runs first or last. Every figure is a ratio taken within a round (the arm's output tok/s over the
reference's in the same round, so drift between rounds cancels), reported as the median over the rounds with its
spread (the lowest and highest round). Against a target: "meets" when the lowest round reaches it, "misses" when the
highest does not, else "inconclusive" (the spread crosses it); with one round there is no spread and the verdict is
"inconclusive".
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import MEASURED

DERIVED, DEFAULT, NONE = "adaptive-derived", "adaptive-default", "no-speculation"
# The derived adaptive setting must be within this fraction of each level's best static point.
WITHIN = 0.03


def _static_arm(point: dict, role: str) -> dict:
    return {
        "id": point["id"],
        "kind": "static",
        "role": role,
        "steps": point["steps"],
        "topk": point["topk"],
        "draft_tokens": point["draft_tokens"],
        "dropin": {"num_steps": point["steps"], "eagle_topk": point["topk"], "num_draft_tokens": point["draft_tokens"]},
    }


def arms(deploy: dict, best_levels: list, config_path: str) -> list:
    """The arms to measure: the derived and default adaptive settings (unless SGLang refuses adaptive here), the
    best static setting, no speculation, and every level's best point not among them. ``dropin`` is the
    speculative point each is applied as (sglang_service speculative_dropin); the adaptive ones let SGLang pick
    the initial steps among the candidates."""
    result = []
    adaptive = deploy["adaptive"]
    bare = {"num_steps": None, "eagle_topk": None, "num_draft_tokens": None, "adaptive": True}
    if adaptive["config"] is not None:
        result.append(
            {"id": DERIVED, "kind": "adaptive", "role": "derived", "dropin": dict(bare, adaptive_config=config_path)}
        )
    if adaptive["refused"] is None:
        result.append(
            {"id": DEFAULT, "kind": "adaptive", "role": "sglang default", "dropin": dict(bare, adaptive_config="")}
        )
    static = deploy["static"]["point"]
    if static:
        result.append(_static_arm(static, "best static"))
    result.append(
        {
            "id": NONE,
            "kind": "none",
            "role": "no speculation",
            "dropin": {"algorithm": "", "num_steps": None, "eagle_topk": None, "num_draft_tokens": None,
                       "draft_model_path": ""},
        }
    )  # fmt: skip
    known = {arm["id"] for arm in result}
    for entry in best_levels:
        best = entry.get("best")
        if best and best["id"] not in known:
            known.add(best["id"])
            result.append(_static_arm(best, "level best"))
    for arm in result:
        arm.setdefault("steps", None)
        arm.setdefault("topk", None)
        arm.setdefault("draft_tokens", None)
    return result


def schedule(arm_list: list, rounds: int) -> list:
    """[{round, arm}] in measuring order: round r runs the arms rotated by r."""
    count = len(arm_list)
    order = []
    for number in range(rounds):
        shift = number % count if count else 0
        for arm in arm_list[shift:] + arm_list[:shift]:
            order.append({"round": number + 1, "arm": arm})
    return order


def _verdict(low: float | None, high: float | None, target: float, rounds: int) -> str:
    if low is None or high is None:
        return "not measured"
    if rounds < 2:
        return "inconclusive"
    if low >= target:
        return "meets"
    if high < target:
        return "misses"
    return "inconclusive"


def _figure(values: list, target: float | None) -> dict:
    """The median of per-round ratios, its spread (lowest, highest round) and the verdict against ``target``."""
    values = sorted(values)
    if not values:
        return {"ratio": None, "low": None, "high": None, "rounds": 0, "verdict": "not measured", "target": target}
    middle = len(values) // 2
    median = values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
    figure = {"ratio": median, "low": values[0], "high": values[-1], "rounds": len(values), "target": target}
    figure["verdict"] = _verdict(values[0], values[-1], target, len(values)) if target is not None else None
    return figure


def _throughput(rows: list) -> dict:
    """{(arm id, round, concurrency): median output tok/s} of the measured arm records."""
    table = {}
    for row in rows:
        if row["status"] == MEASURED and row["output_throughput_median"]:
            table[(row["id"], row["round"], row["concurrency"])] = row["output_throughput_median"]
    return table


def compare(rows: list, arm_list: list, best_levels: list, levels: list) -> dict:
    """Each arm against each level's best static point (measured in the same rounds), and the derived adaptive
    setting against the best static setting and SGLang's default adaptive config, averaged over the levels."""
    table = _throughput(rows)
    rounds = sorted({row["round"] for row in rows})
    reference = {entry["concurrency"]: (entry.get("best") or {}).get("id") for entry in best_levels}
    per_arm = []
    for arm in arm_list:
        by_level = []
        for level in levels:
            ref = reference.get(level)
            ratios, values = [], []
            for number in rounds:
                value = table.get((arm["id"], number, level))
                base = table.get((ref, number, level))
                if value is not None:
                    values.append(value)
                if value is not None and base:
                    ratios.append(value / base)
            target = 1.0 - WITHIN if arm["id"] == DERIVED else None
            by_level.append(dict(_figure(ratios, target), concurrency=level, reference=ref, output_throughput=values))
        per_arm.append({"arm": arm["id"], "role": arm["role"], "levels": by_level})
    static_id = next((arm["id"] for arm in arm_list if arm["role"] == "best static"), None)
    averaged = {
        "adaptive_vs_best_static": _averaged(table, rounds, levels, DERIVED, static_id),
        "adaptive_vs_sglang_default": _averaged(table, rounds, levels, DERIVED, DEFAULT),
    }
    return {"rounds": len(rounds), "within": WITHIN, "arms": per_arm, "averaged": averaged}


def _averaged(table: dict, rounds: list, levels: list, arm: str, other: str | None) -> dict:
    """Per round, the mean over the levels of arm / other; then the median over rounds, its spread and whether it
    beats the other (target: above 1)."""
    ratios = []
    for number in rounds:
        pairs = [(table.get((arm, number, level)), table.get((other, number, level))) for level in levels]
        if other is None or not pairs or any(a is None or not b for a, b in pairs):
            continue
        ratios.append(sum(a / b for a, b in pairs) / len(pairs))
    figure = _figure(ratios, 1.0)
    if figure["verdict"] == "meets" and figure["low"] == 1.0:
        figure["verdict"] = "inconclusive"  # a tie does not beat
    figure.update(arm=arm, other=other)
    return figure


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{(value - 1.0) * 100:+.1f} %"


def _spread(figure: dict) -> str:
    if figure["ratio"] is None:
        return "not measured"
    if figure["rounds"] < 2:
        return f"{_pct(figure['ratio'])} (one round: no spread)"
    return f"{_pct(figure['ratio'])} ({_pct(figure['low'])} to {_pct(figure['high'])})"


def markdown_lines(proof: dict | None) -> list:
    """The report's section on the proof."""
    lines = ["", "## The deployable configuration, proven in this run", ""]
    if not proof:
        lines.append("Not measured in this run (sweep_prove_rounds: 0, check mode, or the sweep stopped before it).")
        return lines
    lines.append(
        f"Each arm measured at every level in {proof['rounds']} round(s), in rotated order. Each figure is the arm's "
        "output tok/s over the level's best static point's in the same round, as the median over the rounds "
        "(lowest to highest round); the derived adaptive setting's target is to be within "
        f"{proof['within'] * 100:g} % of it. A spread that crosses the target reads inconclusive."
    )
    lines += ["", "| arm | concurrency | vs the level's best static point | verdict |", "|---|---:|---|---|"]
    for arm in proof["arms"]:
        for level in arm["levels"]:
            verdict = level["verdict"] or "-"
            lines.append(f"| {arm['arm']} ({arm['role']}) | {level['concurrency']} | {_spread(level)} | {verdict} |")
    lines += ["", "| averaged over the levels | figure | verdict (target: above 0 %) |", "|---|---|---|"]
    for name, figure in proof["averaged"].items():
        lines.append(f"| {name.replace('_', ' ')} | {_spread(figure)} | {figure['verdict']} |")
    return lines


def csv_rows(proof: dict | None) -> list:
    """One row per arm and level, then the averaged figures."""
    rows = [["arm", "role", "concurrency", "reference", "ratio", "low", "high", "rounds", "target", "verdict"]]
    if not proof:
        return rows
    for arm in proof["arms"]:
        for level in arm["levels"]:
            rows.append(
                [arm["arm"], arm["role"], level["concurrency"], level["reference"], level["ratio"], level["low"],
                 level["high"], level["rounds"], level["target"], level["verdict"]]
            )  # fmt: skip
    for name, figure in proof["averaged"].items():
        rows.append(
            [figure["arm"], name, "all", figure["other"], figure["ratio"], figure["low"], figure["high"],
             figure["rounds"], figure["target"], figure["verdict"]]
        )  # fmt: skip
    return rows
