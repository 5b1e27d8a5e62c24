"""The sglang_service unit with an API key: the engine runs through the log filter (base unit and speculative drop-in),
or, with the filter off, journald >= 253 drops SGLang's server_args= lines."""

# ruff: noqa: F811 - the fixtures come from the templates' test module
from __future__ import annotations

from test_sglang_service_templates import line, render, renderer  # noqa: F401

KEY = "s3cret-key"
FILTER = (
    "/opt/sglang/venv/bin/python /usr/local/libexec/llmops/llmops_log_filter.py "
    "--secrets-file /etc/llmops/sglang-t.yaml -- "
)


def test_with_a_key_the_engine_is_exec_d_by_the_log_filter(render):
    unit = render("sglang.service.j2", sglang_service_api_key=KEY)
    exec_start = line(unit, "ExecStart=")
    assert exec_start.startswith("ExecStart=" + FILTER + "/opt/sglang/venv/bin/sglang serve --model-type llm ")
    assert exec_start.endswith("--config /etc/llmops/sglang-t.yaml")
    assert KEY not in unit and "LogFilterPatterns" not in unit


def test_the_speculative_dropin_runs_the_engine_through_the_filter_too(render):
    dropin = render(
        "speculative.conf.j2",
        sglang_service_api_key=KEY,
        sglang_service_speculative_algorithm="EAGLE",
        sglang_service_speculative_num_steps=3,
    )
    assert dropin.splitlines()[-1].startswith("ExecStart=" + FILTER)


def test_without_a_key_there_is_no_filter(render):
    unit = render("sglang.service.j2")
    assert "llmops_log_filter" not in line(unit, "ExecStart=")


def test_filter_off_drops_server_args_lines_on_systemd_253_only(render):
    off = {"sglang_service_api_key": KEY, "sglang_service_log_filter": False}
    new = render("sglang.service.j2", ansible_facts={"systemd": {"version": 253}}, **off)
    assert "llmops_log_filter" not in line(new, "ExecStart=")
    assert "LogFilterPatterns=~server_args=" in new.splitlines()
    old = render("sglang.service.j2", ansible_facts={"systemd": {"version": 252}}, **off)
    assert "LogFilterPatterns" not in old
