"""systemd_escape_args: what systemd reads back is what was given."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.filter.systemd_escape_args import (
    FilterModule,
    escape_arg,
    systemd_escape_args,
)

_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "v": "\v", "f": "\f", "\\": "\\", '"': '"', "'": "'"}


def systemd_split(line: str) -> list:
    """Split like systemd reads ExecStart=: specifiers, words and quotes, C escapes, then ``$$``.

    A port of the parts of systemd's unit_full_printf(), extract_first_word(EXTRACT_UNQUOTE |
    EXTRACT_CUNESCAPE) and replace_env_argv() that quoted literal arguments go through.
    """
    expanded = []
    index = 0
    while index < len(line):
        if line[index] == "%":
            assert line[index + 1] == "%", f"unescaped specifier in {line!r}"
            index += 1
        expanded.append(line[index])
        index += 1
    text = "".join(expanded)

    words, index = [], 0
    while index < len(text):
        while index < len(text) and text[index] in " \t\n\r":
            index += 1
        if index >= len(text):
            break
        word, quote, started = [], None, False
        while index < len(text):
            char = text[index]
            if quote is None and char in " \t\n\r":
                break
            if char == "\\":
                nxt = text[index + 1]
                if nxt == "x":
                    word.append(chr(int(text[index + 2 : index + 4], 16)))
                    index += 4
                    continue
                assert nxt in _SIMPLE_ESCAPES, f"unknown escape \\{nxt}"
                word.append(_SIMPLE_ESCAPES[nxt])
                index += 2
                continue
            if quote is None and char in "\"'":
                quote, started = char, True
            elif char == quote:
                quote = None
            else:
                word.append(char)
            index += 1
        assert quote is None, f"unterminated quote in {line!r}"
        words.append("".join(word) if word or started else "")
    return [word.replace("$$", "\0").replace("$", "<VAR>").replace("\0", "$") for word in words]


TRICKY = [
    "plain",
    "a b",
    "a b%c$d\"e'",
    "",
    ";",
    "back\\slash",
    "100%",
    "$HOME",
    "${HOME}",
    "%%n",
    "new\nline",
    "tab\there",
    "bell\x07",
    "ünïcödé 模型",
    "'single'",
    '"double"',
    "trailing\\",
    "--served-model-name=a b",
]


@pytest.mark.parametrize("value", TRICKY)
def test_round_trip_through_systemd_rules(value):
    line = systemd_escape_args(["/opt/venv/bin/python", "-m", "sglang.launch_server", value, "--next"])
    assert systemd_split(line) == ["/opt/venv/bin/python", "-m", "sglang.launch_server", value, "--next"]


def test_plain_arguments_stay_unquoted():
    assert systemd_escape_args(["/usr/bin/python3", "-m", "sglang.launch_server", "--tp-size", 2, 0.85]) == (
        "/usr/bin/python3 -m sglang.launch_server --tp-size 2 0.85"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a b%c$d\"e'", '"a b%%c$$d\\"e\'"'),
        ("", '""'),
        (";", '";"'),
        ("50%", "50%%"),
        ("$x", "$$x"),
        ("a\\b", '"a\\\\b"'),
        ("x\ny", '"x\\ny"'),
        ("\x01", '"\\x01"'),
    ],
)
def test_escape_arg_exact_forms(value, expected):
    assert escape_arg(value) == expected


@pytest.mark.parametrize("executable", ["", "-/usr/bin/python3", "@/bin/x", "!/bin/x", "+/bin/x", ":/bin/x"])
def test_executable_with_prefix_or_empty_is_refused(executable):
    with pytest.raises(AnsibleFilterError, match="executable"):
        systemd_escape_args([executable, "x"])


@pytest.mark.parametrize("bad", [None, True, {"a": 1}, ["x"]])
def test_non_scalar_argument_is_refused_with_its_position(bad):
    with pytest.raises(AnsibleFilterError, match="argument 2"):
        systemd_escape_args(["/bin/echo", "ok", bad])


@pytest.mark.parametrize("bad", ["/bin/echo a", 42, None, []])
def test_input_must_be_a_nonempty_list(bad):
    with pytest.raises(AnsibleFilterError):
        systemd_escape_args(bad)


def test_filter_is_registered():
    assert FilterModule().filters()["systemd_escape_args"] is systemd_escape_args
