"""redact: configured secrets and the API-key forms never leave a module."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.redact import MASK, Redactor, redact

KEY = "s3cret key$1"


def test_configured_secret_is_masked_wherever_it_appears():
    text = f"token {KEY} in a sentence, and again:{KEY}"
    assert Redactor([KEY]).text(text) == f"token {MASK} in a sentence, and again:{MASK}"


def test_secret_escaped_by_repr_or_json_is_masked_too():
    secret = 'back\\slash"quote'
    redactor = Redactor([secret])
    assert secret not in redactor.text(repr(secret))
    assert "slash" not in redactor.text(repr(secret))
    assert "slash" not in redactor.text('{"k": "back\\\\slash\\"quote"}')


def test_engine_server_args_line_is_masked_without_knowing_the_key():
    line = "[2025-01-01 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', api_key='abc123', port=30000)"
    out = Redactor().text(line)
    assert "abc123" not in out
    assert f"api_key='{MASK}'" in out
    assert "model_path='Qwen/Qwen3-8B'" in out and "port=30000" in out


@pytest.mark.parametrize(
    "text",
    [
        'api_key="abc123"',
        "api_key='it\\'s abc123'",
        "admin_api_key='abc123'",
        "--api-key abc123",
        "--api-key=abc123",
        "--admin-api-key abc123",
        "api-key: abc123",
        'api-key: "abc123"',
        '{"api_key": "abc123"}',
        "server_args={'model_path': 'Qwen/Qwen3-8B', 'api_key': 'abc123', 'port': 30000}",
        "Authorization: Bearer abc123",
        "authorization: bearer abc123",
    ],
)
def test_generic_forms_are_masked(text):
    out = Redactor().text(text)
    assert "abc123" not in out, out
    assert MASK in out


def test_unset_key_and_unrelated_text_stay():
    for text in ("api_key=None", "ServerArgs(port=30000)", "the key to success", ""):
        assert Redactor().text(text) == text


def test_value_walks_results():
    result = {
        "msg": f"failed: --api-key {KEY}",
        "journal": [f"server_args=ServerArgs(api_key='{KEY}')", "ok"],
        "nested": ({"text": KEY}, 3, None),
        KEY: True,
    }
    out = redact(result, [KEY])
    assert KEY not in repr(out)
    assert out["journal"][1] == "ok"
    assert out["nested"][1:] == (3, None)
    assert isinstance(out["nested"], tuple)


def test_empty_and_non_string_secrets_are_ignored():
    assert Redactor(["", None, 5]).text("plain text") == "plain text"


def test_engine_server_args_dict_keeps_the_quotes_around_the_mask():
    # SGLang 0.5.23 logs server_args as a dict repr (srt/entrypoints/engine.py:1185).
    line = "server_args={'host': '127.0.0.1', 'api_key': 'abc123', 'admin_api_key': None}"
    out = Redactor().text(line)
    assert f"'api_key': '{MASK}'" in out and "abc123" not in out
    assert "'host': '127.0.0.1'" in out
