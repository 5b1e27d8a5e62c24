"""log_redact: the engine's output reaches the journal with its API key masked, and the engine keeps its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ansible_collections.llmops.inference.plugins.module_utils import log_redact
from ansible_collections.llmops.inference.plugins.module_utils.redact import MASK, Redactor

KEY = "llmops-K3y 'odd' \"chars\"\\$1"
TREE = Path(__file__).resolve().parents[4] / "build" / "collections"
# What the role installs as llmops_log_filter.py (templates/llmops_log_filter.py.j2).
ENTRY = f"""
import sys
sys.path.insert(0, {str(TREE)!r})
from ansible_collections.llmops.inference.plugins.module_utils.log_redact import main
sys.exit(main())
"""
# The server_args line SGLang 0.5.23 logs at every start (srt/entrypoints/engine.py:1185): a dict repr.
SERVER_ARGS = "[2026-01-01 10:00:00] server_args={'model_path': 'Qwen/Qwen3-8B', 'api_key': %r, 'port': 30000}"


def config_text(key: str) -> str:
    """The config file as the role writes it (templates/sglang.yaml.j2: the key through to_json)."""
    return f"# Ansible managed\napi-key: {json.dumps(key)}\n"


def test_secrets_are_read_from_the_config_file_as_the_role_writes_it():
    assert log_redact.secrets_from_config(config_text(KEY)) == [KEY]


def test_config_file_forms_single_quoted_plain_admin_and_underscore():
    text = "model-path: Qwen\napi_key: 'it''s'\nadmin-api-key: plain-admin # note\n  api-key: nested\n#api-key: x\n"
    assert log_redact.secrets_from_config(text) == ["it's", "plain-admin"]


def test_an_unreadable_secrets_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(log_redact.SecretsFileError, match=r"missing\.yaml"):
        log_redact.read_secrets_file(str(tmp_path / "missing.yaml"))


def test_secrets_are_read_from_the_command_line():
    argv = ["sglang", "serve", "--api-key", "a1", "--admin-api-key=b2", "--port", "1", "--api-key"]
    assert log_redact.secrets_from_argv(argv) == ["a1", "b2"]


def test_whole_lines_pass_masked_and_an_unfinished_one_waits():
    line_filter = log_redact.LineFilter(Redactor([KEY]))
    first = (SERVER_ARGS % KEY).encode()
    out = line_filter.feed(first[:40], 0.0)
    assert out == b""
    out = line_filter.feed(first[40:] + b"\nnext ", 0.1)
    assert KEY.encode() not in out and out.endswith(b"\n")
    assert f"'api_key': '{MASK}'".encode() in out or MASK.encode() in out
    assert not line_filter.due(0.2)
    assert line_filter.due(0.1 + log_redact.IDLE_FLUSH_S)
    assert line_filter.flush() == b"next "


def test_a_key_split_between_reads_is_masked():
    line_filter = log_redact.LineFilter(Redactor([KEY]))
    data = f"token {KEY} end\n".encode()
    out = b"".join(line_filter.feed(data[i : i + 3], 0.0) for i in range(0, len(data), 3))
    assert out == f"token {MASK} end\n".encode()


def test_a_line_longer_than_the_limit_is_passed_on_without_splitting_a_key(monkeypatch):
    monkeypatch.setattr(log_redact, "MAX_PENDING", 1000)
    monkeypatch.setattr(log_redact, "OVERLAP", 100)
    line_filter = log_redact.LineFilter(Redactor([KEY]))
    out = line_filter.feed(b"x" * 960 + KEY.encode(), 0.0) + line_filter.feed(b" tail\n", 0.0)
    assert KEY.encode() not in out
    assert out == b"x" * 960 + MASK.encode() + b" tail\n"


def test_undecodable_bytes_pass_through_unchanged():
    line_filter = log_redact.LineFilter(Redactor([KEY]))
    assert line_filter.feed(b"\xff\xfe bytes\n", 0.0) == b"\xff\xfe bytes\n"


def test_pump_copies_each_stream_to_its_own_writer_masked():
    (in_out, out_w), (in_err, err_w) = os.pipe(), os.pipe()
    (sink_out_r, sink_out), (sink_err_r, sink_err) = os.pipe(), os.pipe()
    os.write(out_w, f"out {KEY}\n".encode())
    os.write(err_w, f"err {KEY} unfinished".encode())
    os.close(out_w)
    os.close(err_w)
    log_redact.pump({in_out: sink_out, in_err: sink_err}, Redactor([KEY]))
    os.close(sink_out)
    os.close(sink_err)
    assert os.read(sink_out_r, 4096) == f"out {MASK}\n".encode()
    assert os.read(sink_err_r, 4096) == f"err {MASK} unfinished".encode()


# The engine stand-in: logs the key on both streams, starts a child that logs it too, kills its own process tree
# (as SGLang's kill_process_tree does on the way out), then logs one last line and exits 3.
ENGINE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    key = sys.argv[1]
    print(SERVER_ARGS % key, file=sys.stderr, flush=True)
    print("stdout", key, "pid", os.getpid(), flush=True)
    subprocess.run([sys.executable, "-c", "import sys; print('child', sys.argv[1], file=sys.stderr)", key])
    children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
    print("children", children, flush=True)
    sys.stdin.readline()
    print("last", key, file=sys.stderr, flush=True)
    sys.exit(3)
    """
).replace("SERVER_ARGS", repr(SERVER_ARGS))


def filter_pids(marker: str) -> list:
    """PIDs of the log filters whose command line holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry / "comm").read_text().strip() == log_redact.FILTER_COMM.decode():
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.fixture
def engine(tmp_path):
    entry = tmp_path / "llmops_log_filter.py"
    entry.write_text(ENTRY)
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    config = tmp_path / "sglang.yaml"
    config.write_text(config_text(KEY))
    argv = [sys.executable, str(entry), "--secrets-file", str(config), "--", sys.executable, str(script), KEY]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield proc, str(script)
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_the_engine_runs_with_the_wrappers_pid_and_its_output_masked_to_the_end(engine):
    proc, marker = engine
    first = proc.stdout.readline().decode()
    assert first.startswith(f"stdout {MASK} pid "), first
    assert int(first.split()[-1]) == proc.pid  # exec'd: MainPID is the engine's
    children = proc.stdout.readline().decode()
    filters = filter_pids(marker)
    assert len(filters) == 1, filters
    assert str(filters[0]) not in children  # the engine's kill_process_tree never reaches the filter
    # systemd's stop signals the whole group; the filter goes on until the engine's last line.
    os.kill(filters[0], signal.SIGTERM)
    time.sleep(0.2)
    out, err = proc.communicate(b"\n", timeout=30)
    assert proc.returncode == 3
    text = first + children + out.decode() + err.decode()
    assert KEY not in text and "K3y" not in text, text
    assert f"'api_key': '{MASK}'" in err.decode()
    assert f"child {MASK}" in err.decode()
    assert f"last {MASK}" in err.decode()
    deadline = time.monotonic() + 10
    while filter_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not filter_pids(marker)  # every writer closed: the filter ended


def test_a_command_that_cannot_run_is_reported_through_the_filter(tmp_path):
    entry = tmp_path / "llmops_log_filter.py"
    entry.write_text(ENTRY)
    proc = subprocess.run(
        [sys.executable, str(entry), "--", str(tmp_path / "no-such-engine"), "--api-key", KEY],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == log_redact.EXIT_EXEC_FAILED
    assert "cannot run" in proc.stderr and "no-such-engine" in proc.stderr


def test_no_command_is_a_usage_error(capsys):
    assert log_redact.main(["--secrets-file", "x"]) == log_redact.EXIT_USAGE
    assert "no command to run" in capsys.readouterr().err
