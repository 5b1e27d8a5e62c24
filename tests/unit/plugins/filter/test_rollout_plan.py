"""The rollout_plan filter: the module_utils plan, and a clear error for a batch that is no size."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.filter.rollout_plan import FilterModule


def test_the_filter_returns_the_plan():
    rollout_plan = FilterModule().filters()["rollout_plan"]
    plan = rollout_plan(["gpu-a", "gpu-b", "gpu-c"], 1, {"gpu-a": ["gpu-a", "gpu-b"], "gpu-b": ["gpu-a", "gpu-b"]}, {})
    assert plan["sizes"] == [2, 1] and plan["batches"] == [["gpu-a", "gpu-b"], ["gpu-c"]]


def test_a_batch_that_is_no_size_fails_the_filter_naming_it():
    rollout_plan = FilterModule().filters()["rollout_plan"]
    with pytest.raises(AnsibleFilterError, match=r"rollout_plan: the batch must be a number >= 1 .* got '0%'"):
        rollout_plan(["a"], "0%", {}, {})
