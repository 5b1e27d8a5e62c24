"""The sweep's plots: the lines they draw (one per load level and draft shape) and the PNGs themselves."""

from __future__ import annotations

import struct
import sys

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_plot import (
    plot_available,
    render_pareto_png,
    render_png,
    series,
)


def row(steps: int, concurrency: int, throughput: float | None, topk: int = 1, draft_tokens: int | None = None):
    return {
        "steps": steps,
        "topk": topk,
        "draft_tokens": steps + 1 if draft_tokens is None else draft_tokens,
        "concurrency": concurrency,
        "output_throughput_median": throughput,
        "output_throughput_mad": None if throughput is None else 2.0,
    }


def png_size(data: bytes) -> tuple:
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_one_line_per_load_level_ordered_by_steps():
    lines = series([row(3, 8, 300.0), row(1, 8, 200.0), row(2, 1, 90.0), row(1, 1, 80.0)])
    assert list(lines) == ["concurrency 1", "concurrency 8"]
    assert [item["steps"] for item in lines["concurrency 8"]] == [1, 3]


def test_the_draft_shape_is_named_only_when_the_sweep_has_several():
    rows = [row(2, 1, 90.0), row(2, 1, 95.0, topk=4, draft_tokens=8), row(3, 1, 99.0)]
    lines = series(rows)
    assert list(lines) == ["concurrency 1, top-k 1, draft = steps + 1", "concurrency 1, top-k 4, draft 8"]
    assert [item["steps"] for item in lines["concurrency 1, top-k 1, draft = steps + 1"]] == [2, 3]


def test_plots_are_unavailable_when_matplotlib_cannot_be_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot_available() is False


def test_both_plots_render_as_png_with_failed_levels_and_the_frontier():
    pytest.importorskip("matplotlib")
    rows = [row(1, 1, 80.0), row(2, 1, 90.0), row(3, 1, None)]
    best = [{"concurrency": 1, "best": rows[1]}, {"concurrency": 8, "best": None}]
    assert png_size(render_png(rows, best, "EAGLE sweep")) == (990, 660)
    entries = [
        {"steps": 1, "topk": 1, "draft_tokens": 2, "concurrency": 1, "output_throughput_per_gpu": 80.0,
         "output_throughput_per_user": 80.0, "frontier": True},
        {"steps": 2, "topk": 4, "draft_tokens": 8, "concurrency": 8, "output_throughput_per_gpu": 400.0,
         "output_throughput_per_user": 50.0, "frontier": True},
        {"steps": 3, "topk": 1, "draft_tokens": 4, "concurrency": 8, "output_throughput_per_gpu": 300.0,
         "output_throughput_per_user": 40.0, "frontier": False},
    ]  # fmt: skip
    assert png_size(render_pareto_png(entries, "EAGLE: Pareto")) == (990, 660)
