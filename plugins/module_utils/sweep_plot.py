# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep's plots: output tok/s against steps per load level, and the Pareto plot of tok/s per user
against tok/s per GPU over every point and level, frontier marked.

Private to the llmops.inference collection; not a public API. They run on the controller only, with the
matplotlib the collection already lists for it (requirements.txt); it is optional (ansible-core does not need
it): ``plot_available()`` says whether it can be imported, and the renderers are only called then.
"""

from __future__ import annotations

import io


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _png(pyplot, figure) -> bytes:
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    pyplot.close(figure)
    return out.getvalue()


def _series_label(concurrency: int, topk: int, draft_tokens: int, several_shapes: bool) -> str:
    label = f"concurrency {concurrency}"
    if several_shapes:
        label += ", top-k 1, draft = steps + 1" if topk == 1 else f", top-k {topk}, draft {draft_tokens}"
    return label


def series(rows: list) -> dict:
    """Rows grouped into lines: one per load level and top-k (top-k 1) or (top-k, draft tokens), by steps."""
    shapes = {(row["topk"], 0 if row["topk"] == 1 else row["draft_tokens"]) for row in rows}
    lines = {}
    ordered = sorted(rows, key=lambda row: (row["concurrency"], row["topk"], row["draft_tokens"], row["steps"]))
    for row in ordered:
        draft = 0 if row["topk"] == 1 else row["draft_tokens"]
        key = _series_label(row["concurrency"], row["topk"], draft, len(shapes) > 1)
        lines.setdefault(key, []).append(row)
    return lines


def render_png(rows: list, best_levels: list, title: str) -> bytes:
    """Output tok/s (median +- MAD) against steps, one line per load level; failed levels marked, points that are
    not lossless boxed in red, each level's best starred."""
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(9, 6), dpi=110)
    colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for number, (label, line) in enumerate(series(rows).items()):
        measured = [row for row in line if row["output_throughput_median"] is not None]
        if measured:
            axis.errorbar(
                [row["steps"] for row in measured],
                [row["output_throughput_median"] for row in measured],
                yerr=[row["output_throughput_mad"] or 0.0 for row in measured],
                color=colors[number % len(colors)],
                marker="o",
                capsize=3,
                label=label,
            )
    failed = [row for row in rows if row["output_throughput_median"] is None]
    if failed:
        axis.scatter(
            [row["steps"] for row in failed],
            [0.0] * len(failed),
            marker="x",
            s=80,
            color="red",
            zorder=5,
            clip_on=False,
            label="failed (see report)",
        )
    lossy = [row for row in rows if row.get("lossless") is False and row["output_throughput_median"] is not None]
    if lossy:
        axis.scatter(
            [row["steps"] for row in lossy],
            [row["output_throughput_median"] for row in lossy],
            marker="s",
            s=140,
            facecolors="none",
            edgecolors="red",
            linewidths=2,
            zorder=6,
            label="not lossless (greedy output differs; never chosen)",
        )
    best = [entry["best"] for entry in best_levels if entry["best"]]
    if best:
        axis.scatter(
            [entry["steps"] for entry in best],
            [entry["output_throughput_median"] for entry in best],
            marker="*",
            s=260,
            color="gold",
            edgecolors="black",
            zorder=6,
            label="best at its load level",
        )
    axis.set_xlabel("speculative steps (--speculative-num-steps)")
    axis.set_ylabel("output throughput (tok/s), median +- MAD")
    axis.set_ylim(bottom=0)
    axis.set_xticks(sorted({row["steps"] for row in rows}))
    axis.grid(True, alpha=0.3)
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize="small")
    axis.set_title(title)
    return _png(pyplot, figure)


def _point_label(entry: dict) -> str:
    return f"s{entry['steps']}" if entry["topk"] == 1 else f"s{entry['steps']}k{entry['topk']}d{entry['draft_tokens']}"


def render_pareto_png(entries: list, title: str) -> bytes:
    """Output tok/s per user against output tok/s per GPU, one colour per load level, the frontier joined."""
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(9, 6), dpi=110)
    colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for number, level in enumerate(sorted({entry["concurrency"] for entry in entries})):
        at_level = [entry for entry in entries if entry["concurrency"] == level]
        axis.scatter(
            [entry["output_throughput_per_gpu"] for entry in at_level],
            [entry["output_throughput_per_user"] for entry in at_level],
            color=colors[number % len(colors)],
            s=36,
            label=f"concurrency {level}",
            zorder=3,
        )
        for entry in at_level:
            axis.annotate(
                _point_label(entry),
                (entry["output_throughput_per_gpu"], entry["output_throughput_per_user"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize="x-small",
            )
    frontier = sorted(
        (entry for entry in entries if entry["frontier"]), key=lambda entry: entry["output_throughput_per_gpu"]
    )
    if frontier:
        axis.plot(
            [entry["output_throughput_per_gpu"] for entry in frontier],
            [entry["output_throughput_per_user"] for entry in frontier],
            color="black",
            linestyle="--",
            marker="D",
            markerfacecolor="none",
            markersize=10,
            label="Pareto frontier",
            zorder=4,
        )
    axis.set_xlabel("output tok/s per GPU")
    axis.set_ylabel("output tok/s per user")
    axis.set_xlim(left=0)
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small")
    axis.set_title(title)
    return _png(pyplot, figure)
