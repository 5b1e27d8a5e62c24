"""The probe's Prometheus textfile: parsed back with prometheus_client's own parser; atomic replacement."""

from __future__ import annotations

import os
import stat

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.llmops.inference.plugins.module_utils.textfile import (
    render_probe,
    validate_textfile_path,
    write_probe_textfile,
)

URL = "http://127.0.0.1:30000"
UNIT = "sglang-qwen.service"


def probe_result(healthy=True):
    generate = {"name": "generate", "status": "ok" if healthy else "failed", "reason": "", "elapsed_s": 0.61}
    return {
        "healthy": healthy,
        "tiers": [
            {"name": "unit", "status": "ok", "reason": "", "elapsed_s": 0.012},
            {"name": "gpu", "status": "ok", "reason": "", "elapsed_s": 0.2},
            {"name": "health", "status": "ok", "reason": "", "elapsed_s": 0.003},
            {"name": "model", "status": "ok", "reason": "", "elapsed_s": 0.01},
            generate,
            {"name": "floors", "status": "skipped", "reason": "no floors set", "elapsed_s": 0.0},
        ],
        "n_restarts": 2,
        "gpu_memory_mib": {"0": 69324, "1": 69300},
        "generation": {
            "text": "2, 3, 5",
            "completion_tokens": 32,
            "latency_s": 0.61,
            "ttft_s": 0.043,
            "tokens_per_s": 54.6,
            "accept_length": None if not healthy else 2.87,
        },
        "waited_s": 41.5,
        "elapsed_s": 42.2,
    }


def samples(text: str) -> dict:
    """{(metric name, frozenset(labels)): value} for every sample, via prometheus_client's parser."""
    found = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge"
        assert family.documentation
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def labels(**extra) -> frozenset:
    return frozenset({"url": URL, "unit": UNIT, **extra}.items())


def test_rendered_result_parses_with_prometheus_client():
    parsed = samples(render_probe(probe_result(), URL, UNIT, now=1700000000.0))
    assert parsed[("llmops_sglang_probe_healthy", labels())] == 1.0
    assert parsed[("llmops_sglang_probe_tier_ok", labels(tier="gpu"))] == 1.0
    assert parsed[("llmops_sglang_probe_tier_duration_seconds", labels(tier="generate"))] == 0.61
    assert ("llmops_sglang_probe_tier_ok", labels(tier="floors")) not in parsed
    assert parsed[("llmops_sglang_probe_gpu_memory_bytes", labels(gpu="0"))] == 69324 * 1024 * 1024
    assert parsed[("llmops_sglang_probe_generation_ttft_seconds", labels())] == 0.043
    assert parsed[("llmops_sglang_probe_generation_tokens_per_second", labels())] == 54.6
    assert parsed[("llmops_sglang_probe_spec_accept_length", labels())] == 2.87
    assert parsed[("llmops_sglang_probe_waited_seconds", labels())] == 41.5
    assert parsed[("llmops_sglang_probe_unit_restarts", labels())] == 2.0
    assert parsed[("llmops_sglang_probe_last_run_timestamp_seconds", labels())] == 1700000000.0


def test_unhealthy_result_reports_the_failed_tier_and_leaves_out_unknown_values():
    parsed = samples(render_probe(probe_result(healthy=False), URL))
    base = frozenset({"url": URL}.items())
    assert parsed[("llmops_sglang_probe_healthy", base)] == 0.0
    assert parsed[("llmops_sglang_probe_tier_ok", base | {("tier", "generate")})] == 0.0
    assert not any(key[0] == "llmops_sglang_probe_spec_accept_length" for key in parsed)


def test_label_values_are_escaped():
    url = 'http://h:1/"quoted"\\path'
    parsed = samples(render_probe({"healthy": True, "tiers": []}, url))
    assert any(dict(key[1])["url"] == url for key in parsed)


def test_write_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "sglang_probe.prom"
    path.write_text("old content\n")
    write_probe_textfile(str(path), probe_result(), URL, UNIT)
    text = path.read_text()
    assert samples(text)[("llmops_sglang_probe_healthy", labels())] == 1.0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.listdir(tmp_path) == ["sglang_probe.prom"]


def test_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "sglang_probe.prom"

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_probe_textfile(str(path), probe_result(), URL)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("relative/probe.prom", "textfile_path must be an absolute path"),
        ("/tmp/probe.txt", "textfile_path must name a file ending in .prom"),
        ("/nonexistent-dir/probe.prom", "textfile_path's directory /nonexistent-dir does not exist"),
    ],
)
def test_bad_paths_are_refused_naming_textfile_path(path, message):
    with pytest.raises(ValueError, match="^" + message):
        validate_textfile_path(path)
