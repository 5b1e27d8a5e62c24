"""Sweep points as SGLang resolves them, the errors that stop a sweep before any host restarts, host assignment."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import (
    Point,
    SweepInputError,
    assign,
    check_algorithm,
    check_counts,
    check_host_args,
    check_levels,
    check_slo,
    expand_points,
    last_load_s,
    level_plan,
    level_warnings,
    load_budget,
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
        ({"steps": [2], "topk": 4}, r"steps 2, top-k 4, draft tokens unset: top-k 4 needs draft tokens"),
        ({"steps": [2], "draft_tokens": 5}, r"steps 2, top-k 1, draft tokens 5: with top-k 1 SGLang sets draft tokens"),
        ({"steps": [2], "topk": 4, "draft_tokens": 1}, r"one draft token verifies no drafted token \[draft-below-two"),
        ({"steps": [1], "topk": 2, "draft_tokens": 4}, r"larger than the EAGLE tree offers: at most 3 "),
        ({"steps": [1], "grid": {"steps": [1]}}, r"sweep_grid and sweep_steps are both set"),
        ({"grid": {"topk": [1]}}, r"sweep_grid needs a 'steps' list"),
        ({"grid": [{"topk": 2, "draft_tokens": 3}]}, r"sweep_grid\[0\] gives top-k or draft tokens without steps"),
        ({"grid": {"steps": [1], "depth": [2]}}, r"sweep_grid has unknown keys \['depth'\]"),
        ({"grid": []}, r"sweep_grid must be a mapping of lists"),
        ({"grid": [{"steps": 2}, {"steps": 2}]}, r"sweep_grid\[1\] repeats the point"),
        ({"grid": [{"steps": [2, 3]}]}, r"sweep_grid\[0\] must give one value per key"),
        ({"grid": [{"steps": 2, "depth": 2}]}, r"sweep_grid\[0\] must be a mapping with 'steps'"),
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


def test_a_multi_node_engine_takes_points_as_one_and_each_of_its_hosts_gets_them():
    points = expand_points(steps=[1, 2, 3, 4, 5])
    groups = {"a0": ["a0", "a1"], "a1": ["a0", "a1"], "b": []}
    plan = assign(points, ["a0", "b", "a1"], groups)
    assert [point.steps for point in plan["a0"]] == [1, 3, 5]
    assert plan["a1"] == plan["a0"]
    assert [point.steps for point in plan["b"]] == [2, 4]


def test_a_multi_node_engine_swept_in_part_is_refused_naming_the_missing_host():
    groups = {"a0": ["a0", "a1"], "a1": ["a0", "a1"]}
    with pytest.raises(SweepInputError) as caught:
        assign([], ["a0", "b"], groups)
    assert caught.value.variable == "sweep_hosts"
    assert "holds a0 but not a1 of the multi-node engine a0, a1" in str(caught.value)


def test_every_rejected_combination_is_named_with_its_rule_and_sglang_source():
    with pytest.raises(SweepInputError) as caught:
        expand_points(grid=[{"steps": 1, "topk": 4, "draft_tokens": 8}, {"steps": 3, "topk": 4, "draft_tokens": 8},
                            {"steps": 2, "topk": 2}, {"steps": 4, "draft_tokens": 3}])  # fmt: skip
    error = caught.value
    assert error.variable == "sweep_grid"
    assert str(error).startswith("sweep_grid has 3 combination(s) SGLang 0.5.23 would reject or rewrite")
    assert [(item["point"], item["rule"]) for item in error.rejected] == [
        ({"steps": 1, "topk": 4, "draft_tokens": 8}, "draft-above-tree"),
        ({"steps": 2, "topk": 2, "draft_tokens": None}, "topk-needs-draft"),
        ({"steps": 4, "topk": 1, "draft_tokens": 3}, "topk1-draft"),
    ]
    assert "at most 5 (1 + the 4 candidates of topk + (steps - 1) * topk^2)" in str(error)
    assert error.rejected[0]["source"].startswith("srt/speculative/eagle_utils.py organize_draft_results")
    assert error.rejected[2]["source"] == "srt/arg_groups/speculative_hook.py _handle_eagle_family"


def test_a_product_lists_each_point_outside_the_tree():
    with pytest.raises(SweepInputError) as caught:
        expand_points(steps=[1, 2, 3], topk=[1, 4], draft_tokens=[8])
    # steps 1 at top-k 4 offers 4 candidates (draft tokens <= 5); steps 2 offers 4 + 16; top-k 1 points collapse
    assert [item["point"]["steps"] for item in caught.value.rejected] == [1]
    valid = expand_points(steps=[2, 3], topk=[1, 4], draft_tokens=[8])
    assert shapes(valid) == [(2, 1, 3), (2, 4, 8), (3, 1, 4), (3, 4, 8)]


def test_the_largest_tree_is_accepted_and_one_more_draft_token_is_not():
    most = tree_candidates(3, 2) + 1  # 2 + 2 * 4 candidates, plus the root
    assert shapes(expand_points(steps=[3], topk=2, draft_tokens=most)) == [(3, 2, 11)]
    with pytest.raises(SweepInputError, match="draft tokens 12: draft tokens larger than the EAGLE tree offers"):
        expand_points(steps=[3], topk=2, draft_tokens=most + 1)


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        (["--speculative-use-rejection-sampling"], "rejection-sampling-topk"),
        (["--attention-backend", "trtllm_mha"], "trtllm-mha-topk"),
        (["--page-size=16", "--attention-backend", "flashmla"], "paged-tree-backend"),
    ],
)
def test_the_hosts_own_sglang_arguments_rule_out_top_k_above_1(args, rule):
    points = expand_points(steps=[2], topk=[1, 4], draft_tokens=[6])
    with pytest.raises(SweepInputError) as caught:
        check_host_args(points, {"h1": ["--sim-x", "1", *args], "h2": []})
    assert [(item["point"], item["rule"]) for item in caught.value.rejected] == [
        ({"steps": 2, "topk": 4, "draft_tokens": 6}, rule)
    ]
    assert "h1: " in caught.value.rejected[0]["reason"]
    check_host_args(expand_points(steps=[2, 3]), {"h1": args})  # top-k 1 is fine
    check_host_args(points, {"h1": ["--page-size", "16", "--attention-backend", "fa3"]})


def test_load_levels_are_distinct_positive_integers_in_ascending_order():
    assert check_levels([32, 1, 8]) == [1, 8, 32]
    assert check_levels(4) == [4]
    cases = (([], "must not be empty"), ([1, 0], "must hold only integers >= 1, got 0"), ([8, 8], "lists 8 more"))
    for bad, message in cases:
        with pytest.raises(SweepInputError, match=f"sweep_concurrency {message}"):
            check_levels(bad)


def test_each_level_is_sized_from_the_benchmark_and_gets_a_budget():
    bench = {"num_prompts": 16, "request_timeout": 60.0}
    plan = level_plan([1, 8, 32], bench, repeats=3, warmup_requests=2)
    assert [(level["concurrency"], level["num_prompts"]) for level in plan] == [(1, 16), (8, 16), (32, 32)]
    # waves: ceil(warm-up / C) + repeats * ceil(requests / C); budget: waves * request_timeout + 30 s
    assert [level["waves"] for level in plan] == [2 + 3 * 16, 1 + 3 * 2, 1 + 3 * 1]
    assert plan[1]["budget_s"] == 7 * 60.0 + 30.0


def test_levels_above_the_speculative_running_request_cap_are_warned_about():
    assert level_warnings([1, 8, 32], {"h1": []}) == []
    warned = level_warnings([8, 64], {"h1": [], "h2": ["--max-running-requests", "64"]})
    assert len(warned) == 1 and "[64]" in warned[0] and "on h1 the rest queue" in warned[0]


def test_slo_bounds_name_a_latency_statistic():
    assert check_slo(None) == {}
    assert check_slo({"p99_tpot_ms": 30, "p99_ttft_ms": 500}) == {"p99_tpot_ms": 30.0, "p99_ttft_ms": 500.0}
    with pytest.raises(SweepInputError, match=r"sweep_slo has unknown keys \['tpot'\]; accepted: <stat>_<latency>_ms"):
        check_slo({"tpot": 30})
    with pytest.raises(SweepInputError, match=r"sweep_slo\.p99_itl_ms must be a number of milliseconds > 0, got 0"):
        check_slo({"p99_itl_ms": 0})
    with pytest.raises(SweepInputError, match="sweep_slo must be a mapping"):
        check_slo([30])


ACTIVE = {
    "ActiveState": "active",
    "ExecMainStartTimestampMonotonic": "5000000",
    "ActiveEnterTimestampMonotonic": "95000000",
}


def test_the_load_budget_follows_the_hosts_last_load():
    assert last_load_s(ACTIVE) == 90.0
    assert load_budget(ACTIVE, role_wait_s=1260)["load_budget_s"] == 2 * 90 + 60
    fast = dict(ACTIVE, ActiveEnterTimestampMonotonic="6500000")
    assert load_budget(fast, role_wait_s=1260)["load_budget_s"] == 120.0  # the floor
    slow = dict(ACTIVE, ActiveEnterTimestampMonotonic="905000000")
    assert load_budget(slow, role_wait_s=1260)["load_budget_s"] == 1260.0  # never above the role's own wait
    unknown = load_budget({"ActiveState": "failed"}, role_wait_s=1260)
    assert unknown["load_budget_s"] == 1260.0 and unknown["last_load_s"] is None
    assert unknown["source"] == "the role's probe wait (no earlier load known)"
    assert load_budget(ACTIVE, role_wait_s=1260, fixed=45)["load_budget_s"] == 45.0
    with pytest.raises(SweepInputError, match="sweep_load_timeout must be a number of seconds > 0"):
        load_budget(ACTIVE, fixed=0)
