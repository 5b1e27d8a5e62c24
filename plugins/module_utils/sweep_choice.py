# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The choices made from a sweep's rows (one per point and load level, from sweep_records.summarize).

Private to the llmops.inference collection; not a public API. Pure functions, standard library only.

A record is one point measured at one load level (concurrency). The choices, each stated in the report:

- best per level: each measured record's output tok/s over its repeats gives a median and a MAD (median
  absolute deviation from the median, unscaled); score = median - mad_penalty * MAD. The top score wins,
  except that every point scoring within ``tolerance`` (a fraction) of it counts as just as good, and among
  those the one with the fewest steps (then the lowest top-k, then the fewest draft tokens) wins: it uses the
  least draft memory and compute for the same throughput. Its margin is its median minus the runner-up's (the
  next best score), with both MADs over the repeat runs as the spread; the margin is clear when it exceeds the
  sum of the two MADs.
- robust choice: per point, the worst over every load level of (its median tok/s at that level / the best
  median at that level); a level it failed at counts 0. The highest worst case wins (within ``tolerance``,
  fewest steps).
- SLA choice (with an SLO such as {p99_tpot_ms: 30}): a point survives a level when it was measured there and
  every bound holds in every repeat run; per point, the heaviest level it survives with every lighter level
  survived too, and its median tok/s there. The highest of those wins (within ``tolerance``, fewest steps).
- losslessness: a point whose greedy output differs from the model's without speculation (``lossless`` false) is
  never chosen, best, robust or SLA, however fast; it still counts for nothing else.
- Pareto frontier: over every measured record, output tok/s per user against output tok/s per GPU; a record is
  on the frontier when no other one is at least as good on both and better on one.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import MEASURED


def _shape(row: dict) -> tuple:
    return (row["steps"], row["topk"], row["draft_tokens"])


def _pick(candidates: list, value_key: str, tolerance: float):
    """The candidate within ``tolerance`` of the top ``value_key`` with the fewest steps (then top-k, draft)."""
    top = max(candidate[value_key] for candidate in candidates)
    floor = top - abs(top) * tolerance
    near = [candidate for candidate in candidates if candidate[value_key] >= floor]
    return min(near, key=lambda candidate: (_shape(candidate), -candidate[value_key]))


def lossless(row: dict) -> bool:
    """Whether a row may be chosen: not known to change greedy output (``lossless`` False)."""
    return row.get("lossless") is not False


def choose_best(rows: list, tolerance: float) -> dict | None:
    """The best measured row of one level (see the module docstring), or None when nothing was measured."""
    scored = [row for row in rows if row["score"] is not None and lossless(row)]
    return _pick(scored, "score", tolerance) if scored else None


def _point_ref(row: dict) -> dict:
    return {"id": row["id"], "steps": row["steps"], "topk": row["topk"], "draft_tokens": row["draft_tokens"]}


def best_per_level(rows: list, levels: list, tolerance: float) -> list:
    """Per level: the best point, the runner-up, the margin between their medians and its spread."""
    result = []
    for level in levels:
        at_level = [row for row in rows if row["concurrency"] == level]
        best = choose_best(at_level, tolerance)
        entry = {
            "concurrency": level,
            "best": None,
            "runner_up": None,
            "margin_tok_s": None,
            "margin_pct": None,
            "spread_source": None,
            "clear": None,
            "measured_points": sum(1 for row in at_level if row["status"] == MEASURED),
        }
        if best is not None:
            others = [row for row in at_level if row["score"] is not None and row["id"] != best["id"] and lossless(row)]
            runner = max(others, key=lambda row: (row["score"], tuple(-part for part in _shape(row))), default=None)
            entry["best"] = dict(
                _point_ref(best),
                output_throughput_median=best["output_throughput_median"],
                output_throughput_mad=best["output_throughput_mad"],
                repeats=best["repeats"],
                host=best["host"],
            )
            repeats = min(best["repeats"], runner["repeats"]) if runner else best["repeats"]
            entry["spread_source"] = (
                f"repeat runs: MAD of output tok/s over {repeats} runs"
                if repeats >= 2
                else "none: one run per level (set sweep_repeats >= 2 for a spread)"
            )
            if runner is not None:
                margin = best["output_throughput_median"] - runner["output_throughput_median"]
                entry.update(
                    runner_up=dict(
                        _point_ref(runner),
                        output_throughput_median=runner["output_throughput_median"],
                        output_throughput_mad=runner["output_throughput_mad"],
                        repeats=runner["repeats"],
                        host=runner["host"],
                    ),
                    margin_tok_s=margin,
                    margin_pct=100.0 * margin / runner["output_throughput_median"]
                    if runner["output_throughput_median"]
                    else None,
                    clear=(margin > best["output_throughput_mad"] + runner["output_throughput_mad"])
                    if repeats >= 2
                    else None,
                )
        result.append(entry)
    return result


def _points_of(rows: list) -> dict:
    points = {}
    for row in rows:
        points.setdefault(row["id"], []).append(row)
    return points


def robust_choice(rows: list, levels: list, tolerance: float) -> dict:
    """The point whose worst ratio to each level's best is highest (see the module docstring)."""
    best_at = {}
    for level in levels:
        medians = [row["output_throughput_median"] for row in rows if row["concurrency"] == level and lossless(row)]
        medians = [value for value in medians if value]
        if medians:
            best_at[level] = max(medians)
    candidates = []
    for point_rows in _points_of(rows).values():
        by_level = {row["concurrency"]: row for row in point_rows}
        ratios = {}
        for level, best in best_at.items():
            row = by_level.get(level)
            value = row["output_throughput_median"] if row is not None else None
            ratios[level] = value / best if value and lossless(row) else 0.0
        if not ratios:
            continue
        worst_level = min(ratios, key=lambda level: (ratios[level], level))
        worst_row = by_level.get(worst_level)
        candidates.append(
            dict(
                _point_ref(point_rows[0]),
                worst_ratio=ratios[worst_level],
                worst_at={"concurrency": worst_level, "host": worst_row["host"] if worst_row else None},
                ratios={str(level): ratio for level, ratio in sorted(ratios.items())},
            )
        )
    candidates.sort(key=_shape)
    rated = [candidate for candidate in candidates if candidate["worst_ratio"] > 0]
    chosen = _pick(rated, "worst_ratio", tolerance) if rated else None
    skipped = [level for level in levels if level not in best_at]
    return {
        "point": chosen,
        "candidates": candidates,
        "levels_without_measurement": skipped,
        "reason": None if chosen else "no point was measured at every load level",
    }


def _meets(row: dict, slo: dict) -> bool:
    worst = row.get("worst") or {}
    return (
        row["status"] == MEASURED
        and lossless(row)
        and all(key in worst and worst[key] <= bound for key, bound in slo.items())
    )


def sla_choice(rows: list, levels: list, slo: dict, tolerance: float) -> dict | None:
    """The highest-throughput point at the heaviest level it survives under ``slo``; None without an SLO."""
    if not slo:
        return None
    candidates = []
    for point_rows in _points_of(rows).values():
        by_level = {row["concurrency"]: row for row in point_rows}
        survived = None
        for level in levels:
            row = by_level.get(level)
            if row is None or not _meets(row, slo):
                break
            survived = row
        candidates.append(
            dict(
                _point_ref(point_rows[0]),
                heaviest_concurrency=survived["concurrency"] if survived else None,
                output_throughput_median=survived["output_throughput_median"] if survived else None,
                values={key: survived["worst"].get(key) for key in slo} if survived else None,
            )
        )
    candidates.sort(key=_shape)
    rated = [candidate for candidate in candidates if candidate["output_throughput_median"]]
    chosen = _pick(rated, "output_throughput_median", tolerance) if rated else None
    return {
        "slo": slo,
        "point": chosen,
        "candidates": candidates,
        "reason": None if chosen else f"no point meets {slo} even at concurrency {levels[0] if levels else '-'}",
    }


def pareto(rows: list) -> list:
    """Every measured row as (per user, per GPU), marked when on the frontier."""
    measured = [
        row
        for row in rows
        if row["output_throughput_per_user_median"] is not None and row["output_throughput_per_gpu_median"] is not None
    ]
    entries = []
    for row in measured:
        user, gpu = row["output_throughput_per_user_median"], row["output_throughput_per_gpu_median"]
        dominated = any(
            other["output_throughput_per_user_median"] >= user
            and other["output_throughput_per_gpu_median"] >= gpu
            and (other["output_throughput_per_user_median"] > user or other["output_throughput_per_gpu_median"] > gpu)
            for other in measured
        )
        entries.append(
            dict(
                _point_ref(row),
                concurrency=row["concurrency"],
                output_throughput_per_user=user,
                output_throughput_per_gpu=gpu,
                frontier=not dominated,
            )
        )
    entries.sort(key=lambda entry: (entry["output_throughput_per_gpu"], entry["output_throughput_per_user"]))
    return entries


def applied_choice(robust: dict, sla: dict | None) -> dict:
    """What ``sweep_apply: best`` applies: the SLA choice when an SLO is set, else the robust choice."""
    if sla is not None:
        return {"rule": "sla", "point": sla["point"], "reason": sla["reason"]}
    return {"rule": "robust", "point": robust["point"], "reason": robust["reason"]}
