"""unit_value: the one check of every value rendered into a unit, drop-in or environment file."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.filter.unit_value import FilterModule, unit_value


@pytest.mark.parametrize(
    ("text", "what", "position"),
    [
        ("a\nb", "a line break (\\n)", 2),
        ("ab\r", "a carriage return (\\r)", 3),
        ("\tx", "a tab (\\t)", 1),
        ("x\0", "a NUL (\\0)", 2),
        ("x\x1by", "the control character U+001B", 2),
        ("x\x7f", "the control character U+007F", 2),
        ("x\x85", "the control character U+0085", 2),
        ("x\u2028", "the control character U+2028", 2),
        ("x\u2029", "the control character U+2029", 2),
    ],
)
def test_control_characters_are_refused_naming_the_variable_and_the_position(text, what, position):
    with pytest.raises(AnsibleFilterError) as refused:
        unit_value(text, "sglang_service_description")
    assert str(refused.value).startswith(f"sglang_service_description: {what} at character {position} is not allowed")


def test_the_value_is_never_shown_in_the_error():
    with pytest.raises(AnsibleFilterError) as refused:
        unit_value("top-secret\nkey", "sglang_service_api_key")
    assert "top-secret" not in str(refused.value)


def test_items_of_lists_and_mappings_are_named():
    with pytest.raises(AnsibleFilterError, match=r"^sglang_service_extra_args\[2\]: a line break"):
        unit_value(["--a", 1, "b\nc"], "sglang_service_extra_args")
    with pytest.raises(AnsibleFilterError, match=r"^sglang_service_model_path: a line break"):
        unit_value({"tp_size": 2, "model_path": "m\n"}, "sglang_service_{}")
    with pytest.raises(AnsibleFilterError, match=r"^point\.draft: a line break"):
        unit_value({"draft": "m\n"}, "point")
    with pytest.raises(AnsibleFilterError, match=r"^point \(a key\): a line break"):
        unit_value({"a\nb": 1}, "point")


def test_raw_returns_the_value_unchanged():
    for value in ("plain % $ 'x' \"y\"", 3, 1.5, True, None, ["a", 1], {"k": "v"}):
        assert unit_value(value, "v") == value


def test_text_doubles_specifiers_only():
    assert unit_value("100% up $HOME 'q' \\", "d", "text") == "100%% up $HOME 'q' \\"
    assert unit_value(30, "d", "text") == "30"


def test_path_must_be_absolute_and_doubles_specifiers():
    assert unit_value("/srv/my models/%h", "w", "path") == "/srv/my models/%%h"
    with pytest.raises(AnsibleFilterError, match=r"^w: must be an absolute path, got 'srv'"):
        unit_value("srv", "w", "path")


def test_environment_quotes_each_assignment():
    rendered = unit_value({"PATH": '/opt/a "b"/bin:/usr/bin', "X": "c\\d%e$f", "N": None}, "v", "environment")
    assert rendered == '"PATH=/opt/a \\"b\\"/bin:/usr/bin" "X=c\\\\d%%e$f" "N="'
    with pytest.raises(AnsibleFilterError, match=r"^sglang_service_gpus: a line break"):
        unit_value({"CUDA_VISIBLE_DEVICES": "0\n"}, "sglang_service_gpus", "environment")
    with pytest.raises(AnsibleFilterError, match="takes a dictionary"):
        unit_value("PATH=/x", "v", "environment")


def test_bad_calls_are_refused():
    with pytest.raises(AnsibleFilterError, match="kind must be one of raw, text, path, environment"):
        unit_value("x", "v", "shell")
    with pytest.raises(AnsibleFilterError, match="name the variable"):
        unit_value("x", "")
    with pytest.raises(AnsibleFilterError, match="expected text for kind 'text'"):
        unit_value(["x"], "v", "text")
    with pytest.raises(AnsibleFilterError, match="expected text, a number or a list"):
        unit_value(object(), "v")


def test_filter_is_registered():
    assert FilterModule().filters()["unit_value"] is unit_value
