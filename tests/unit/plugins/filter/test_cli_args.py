"""cli_args: settings dictionary to long options."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.filter.cli_args import FilterModule, cli_args


def test_order_names_and_values():
    settings = {"model_path": "/m", "tp_size": 2, "mem_fraction_static": 0.85, "served-model-name": "q"}
    assert cli_args(settings) == [
        "--model-path",
        "/m",
        "--tp-size",
        "2",
        "--mem-fraction-static",
        "0.85",
        "--served-model-name",
        "q",
    ]


def test_unset_values_are_left_out_and_true_is_a_bare_flag():
    settings = {"a": None, "b": False, "c": "", "d": [], "enable_metrics": True, "port": 0}
    assert cli_args(settings) == ["--enable-metrics", "--port", "0"]


def test_lists_follow_their_option():
    assert cli_args({"cuda_graph_bs": [1, 2, 4]}) == ["--cuda-graph-bs", "1", "2", "4"]


@pytest.mark.parametrize("bad", [{"x": {"y": 1}}, {"x": [None]}, {"x": [True]}])
def test_non_scalar_values_are_refused_naming_the_option(bad):
    with pytest.raises(AnsibleFilterError, match="--x takes strings or numbers"):
        cli_args(bad)


@pytest.mark.parametrize("bad", [["--a"], "a", None])
def test_input_must_be_a_dict(bad):
    with pytest.raises(AnsibleFilterError, match="expects a dictionary"):
        cli_args(bad)


def test_empty_option_name_is_refused():
    with pytest.raises(AnsibleFilterError, match="empty option name"):
        cli_args({"--": 1})


def test_filter_is_registered():
    assert FilterModule().filters()["cli_args"] is cli_args
