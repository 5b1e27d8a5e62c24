"""systemd_env_value: values read back by systemd's environment file rules."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.filter.systemd_env_value import FilterModule, systemd_env_value

SHELL_NEED_ESCAPE = '"\\`$'


def parse_double_quoted(text: str) -> str:
    """systemd's env-file parser for one double-quoted value (DOUBLE_QUOTE_VALUE[_ESCAPE] states)."""
    assert text[0] == '"' and text[-1] == '"'
    body, out, index = text[1:-1], [], 0
    while index < len(body):
        char = body[index]
        if char == "\\":
            nxt = body[index + 1]
            out.append(nxt if nxt in SHELL_NEED_ESCAPE else "\\" + nxt)
            index += 2
            continue
        assert char != '"', f"unescaped quote inside {text!r}"
        out.append(char)
        index += 1
    return "".join(out)


@pytest.mark.parametrize(
    "value", ["s3cr3t", "a b", "with \"quotes\" and 'single'", "$HOME and ${X}", "back\\slash", "`cmd`", "#x", ""]
)
def test_round_trip(value):
    assert parse_double_quoted(systemd_env_value(value)) == value


def test_numbers_are_accepted():
    assert systemd_env_value(8) == '"8"'


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_line_breaking_values_are_refused(bad):
    with pytest.raises(AnsibleFilterError, match="cannot hold"):
        systemd_env_value(bad)


@pytest.mark.parametrize("bad", [None, True, ["x"], {"a": "b"}])
def test_non_scalars_are_refused(bad):
    with pytest.raises(AnsibleFilterError, match="expects a string or a number"):
        systemd_env_value(bad)


def test_filter_is_registered():
    assert FilterModule().filters()["systemd_env_value"] is systemd_env_value
