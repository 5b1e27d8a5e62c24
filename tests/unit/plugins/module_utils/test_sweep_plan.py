"""Sweep points as SGLang resolves them, the errors that stop a sweep before any host restarts, host assignment."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import (
    Point,
    SweepInputError,
    assign,
    check_algorithm,
    check_counts,
    expand_points,
    tree_candidates,
)


def shapes(points) -> list:
    return [(point.steps, point.topk, point.draft_tokens) for point in points]


def test_steps_at_top_k_1_get_steps_plus_one_draft_tokens():
    assert shapes(expand_points(steps=[1, 2, 3])) == [(1, 1, 2), (2, 1, 3), (3, 1, 4)]
    assert shapes(expand_points(steps=5)) == [(5, 1, 6)]
    assert shapes(expand_points(steps=[4], topk=1, draft_tokens=5)) == [(4, 1, 5)]


def test_top_k_and_draft_token_lists_are_swept_as_a_product():
    points = expand_points(steps=[2, 3], topk=[1, 4], draft_tokens=[6, 8])
    # top-k 1 points collapse to steps + 1 draft tokens; the draft-token axis is for top-k 4
    assert shapes(points) == [(2, 1, 3), (2, 4, 6), (2, 4, 8), (3, 1, 4), (3, 4, 6), (3, 4, 8)]


def test_grid_mapping_and_grid_list():
    assert shapes(expand_points(grid={"steps": [3], "topk": [2], "draft_tokens": [4, 7]})) == [(3, 2, 4), (3, 2, 7)]
    listed = expand_points(grid=[{"steps": 3}, {"steps": 5, "topk": 4, "draft_tokens": 8}])
    assert shapes(listed) == [(3, 1, 4), (5, 4, 8)]


def test_point_ids_are_stable_and_sort_by_steps():
    ids = [point.id for point in expand_points(steps=[10, 2])]
    assert ids == ["steps010-topk01-draft011", "steps002-topk01-draft003"]
    assert sorted(ids)[0].startswith("steps002")
    assert Point(3, 1, 4).as_dict() == {"id": "steps003-topk01-draft004", "steps": 3, "topk": 1, "draft_tokens": 4}


def test_tree_candidates_follow_the_eagle_draft_tree():
    # organize_draft_results: topk scores at the first step, topk * topk at each later one
    assert tree_candidates(1, 4) == 4
    assert tree_candidates(3, 4) == 4 + 2 * 16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": []}, r"sweep_steps must not be empty"),
        ({"steps": [1, 0, 3]}, r"sweep_steps must hold only integers >= 1, got 0"),
        ({"steps": [2, -1]}, r"sweep_steps must hold only integers >= 1, got -1"),
        ({"steps": ["3"]}, r"sweep_steps must hold only integers >= 1, got '3'"),
        ({"steps": [True]}, r"sweep_steps must hold only integers >= 1"),
        ({"steps": [2, 3, 2]}, r"sweep_steps lists 2 more than once"),
        ({}, r"sweep_steps is not set"),
        ({"steps": [2], "topk": 0}, r"sweep_topk must hold only integers >= 1, got 0"),
        ({"steps": [2], "topk": 4}, r"sweep_steps needs draft tokens for top-k 4"),
        ({"steps": [2], "draft_tokens": 5}, r"steps 2, top-k 1, draft tokens 5: with top-k 1 SGLang sets draft tokens"),
        ({"steps": [2], "topk": 4, "draft_tokens": 1}, r"draft tokens must be from 2 to 21"),
        ({"steps": [1], "topk": 2, "draft_tokens": 4}, r"draft tokens must be from 2 to 3 "),
        ({"steps": [1], "grid": {"steps": [1]}}, r"sweep_grid and sweep_steps are both set"),
        ({"grid": {"topk": [1]}}, r"sweep_grid needs a 'steps' list"),
        ({"grid": {"steps": [1], "depth": [2]}}, r"sweep_grid has unknown keys \['depth'\]"),
        ({"grid": []}, r"sweep_grid must be a mapping of lists"),
        ({"grid": [{"steps": 2}, {"steps": 2}]}, r"sweep_grid\[1\] repeats the point"),
        ({"grid": [{"steps": [2, 3]}]}, r"sweep_grid\[0\] must give one value per key"),
        ({"grid": [{"topk": 2}]}, r"sweep_grid\[0\] must be a mapping with 'steps'"),
        ({"grid": {"steps": [2], "topk": [0]}}, r"sweep_grid.topk must hold only integers >= 1"),
    ],
)
def test_points_sglang_rejects_or_rewrites_are_errors_naming_the_variable(kwargs, message):
    with pytest.raises(SweepInputError, match=message):
        expand_points(**kwargs)


def test_algorithm_must_honour_steps():
    assert check_algorithm(" EAGLE3 ") == "EAGLE3"
    assert check_algorithm("LLMOPS_DEMO") == "LLMOPS_DEMO"
    with pytest.raises(SweepInputError, match="sweep_algorithm is empty"):
        check_algorithm("")
    with pytest.raises(SweepInputError, match="sweep_algorithm is DFLASH, for which SGLang fixes steps"):
        check_algorithm("DFLASH")
    with pytest.raises(SweepInputError, match="is ngram"):
        check_algorithm("ngram")


def test_counts():
    check_counts(sweep_repeats=(1, 1), sweep_warmup_requests=(0, 0))
    with pytest.raises(SweepInputError, match="sweep_repeats must be an integer >= 1, got 0"):
        check_counts(sweep_repeats=(0, 1))


def test_points_go_to_hosts_in_turn():
    points = expand_points(steps=list(range(1, 11)))
    plan = assign(points, ["h1", "h2", "h3"])
    assert [point.steps for point in plan["h1"]] == [1, 4, 7, 10]
    assert [point.steps for point in plan["h2"]] == [2, 5, 8]
    assert [point.steps for point in plan["h3"]] == [3, 6, 9]
    assert assign(points[:1], ["h1", "h2"]) == {"h1": points[:1], "h2": []}
    with pytest.raises(SweepInputError, match="sweep_hosts matches no hosts"):
        assign(points, [])
