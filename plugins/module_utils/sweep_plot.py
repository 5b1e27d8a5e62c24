# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep's plot: output tok/s and accept length against steps, failed points marked, the best starred.

Private to the llmops.inference collection; not a public API. matplotlib is optional (ansible-core does not
need it): ``plot_available()`` says whether it can be imported, and ``render_png`` is only called then.
"""

from __future__ import annotations

import io


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _series_label(topk: int, draft_tokens: int) -> str:
    return "top-k 1, draft = steps + 1" if topk == 1 else f"top-k {topk}, draft {draft_tokens}"


def series(rows: list) -> dict:
    """Rows grouped into lines: one per top-k (top-k 1) or per (top-k, draft tokens), ordered by steps."""
    lines = {}
    for row in sorted(rows, key=lambda row: (row["topk"], row["draft_tokens"], row["steps"])):
        key = _series_label(row["topk"], 0 if row["topk"] == 1 else row["draft_tokens"])
        lines.setdefault(key, []).append(row)
    return lines


def render_png(rows: list, best: dict | None, title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, throughput_axis = pyplot.subplots(figsize=(9, 6), dpi=110)
    accept_axis = throughput_axis.twinx()
    colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for number, (label, line) in enumerate(series(rows).items()):
        color = colors[number % len(colors)]
        measured = [row for row in line if row["output_throughput_median"] is not None]
        if measured:
            throughput_axis.errorbar(
                [row["steps"] for row in measured],
                [row["output_throughput_median"] for row in measured],
                yerr=[row["output_throughput_mad"] or 0.0 for row in measured],
                color=color,
                marker="o",
                capsize=3,
                label=f"tok/s ({label})",
            )
            accepted = [row for row in measured if row["accept_length_median"] is not None]
            accept_axis.plot(
                [row["steps"] for row in accepted],
                [row["accept_length_median"] for row in accepted],
                color=color,
                linestyle="--",
                marker="s",
                markersize=4,
                label=f"accept length ({label})",
            )
    failed = [row for row in rows if row["output_throughput_median"] is None]
    if failed:
        throughput_axis.scatter(
            [row["steps"] for row in failed],
            [0.0] * len(failed),
            marker="x",
            s=80,
            color="red",
            zorder=5,
            clip_on=False,
            label="failed (see report)",
        )
        for row in failed:
            throughput_axis.annotate(
                "failed", (row["steps"], 0.0), textcoords="offset points", xytext=(0, 8), ha="center", color="red"
            )
    if best is not None:
        throughput_axis.scatter(
            [best["steps"]],
            [best["output_throughput_median"]],
            marker="*",
            s=260,
            color="gold",
            edgecolors="black",
            zorder=6,
            label="best",
        )
    throughput_axis.set_xlabel("speculative steps (--speculative-num-steps)")
    throughput_axis.set_ylabel("output throughput (tok/s), median +- MAD")
    accept_axis.set_ylabel("accept length (tokens per verify step)")
    throughput_axis.set_ylim(bottom=0)
    accept_axis.set_ylim(bottom=0)
    steps = sorted({row["steps"] for row in rows})
    throughput_axis.set_xticks(steps)
    throughput_axis.grid(True, alpha=0.3)
    handles, labels = throughput_axis.get_legend_handles_labels()
    more_handles, more_labels = accept_axis.get_legend_handles_labels()
    throughput_axis.legend(
        handles + more_handles,
        labels + more_labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
        fontsize="small",
    )
    throughput_axis.set_title(title)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    pyplot.close(figure)
    return out.getvalue()
