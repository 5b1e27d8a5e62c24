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


def states(parsed: dict, base=None) -> dict:
    base = labels() if base is None else base
    return {
        name: parsed[("llmops_sglang_probe_state", base | {("state", name)})]
        for name in ("serving", "not_serving", "hung", "needs_gpu_reset")
    }


def test_the_hosts_state_is_one_of_four_samples():
    assert states(samples(render_probe({**probe_result(), "state": "serving"}, URL, UNIT))) == {
        "serving": 1.0,
        "not_serving": 0.0,
        "hung": 0.0,
        "needs_gpu_reset": 0.0,
    }
    older = samples(render_probe(probe_result(healthy=False), URL, UNIT))
    assert states(older)["not_serving"] == 1.0, "a result without a state reads as serving or not serving"


def test_a_hung_host_is_its_own_state_with_the_progress_counts():
    result = {
        **probe_result(healthy=False),
        "state": "hung",
        "progress": {
            "window_s": 10,
            "metrics": True,
            "verdict": "hung",
            "running": 3,
            "queued": 5,
            "generated_tokens": 0.0,
            "processed_tokens": 0.0,
            "observed_s": 10.0,
        },
    }
    parsed = samples(render_probe(result, URL, UNIT))
    assert states(parsed) == {"serving": 0.0, "not_serving": 0.0, "hung": 1.0, "needs_gpu_reset": 0.0}
    assert parsed[("llmops_sglang_probe_progress_running_requests", labels())] == 3.0
    assert parsed[("llmops_sglang_probe_progress_queued_requests", labels())] == 5.0
    assert parsed[("llmops_sglang_probe_progress_tokens", labels())] == 0.0
    assert parsed[("llmops_sglang_probe_progress_window_seconds", labels())] == 10.0


def test_a_host_that_needs_a_gpu_reset_is_its_own_state_with_the_memory_per_gpu():
    unreapable = [
        {"gpu": 0, "uuid": "GPU-a", "pid": 7, "state": "D", "ppid": 1, "title": "t", "mib": 30000, "evidence": "x"},
        {
            "gpu": 0,
            "uuid": "GPU-a",
            "pid": None,
            "state": None,
            "ppid": None,
            "title": None,
            "mib": 2000,
            "evidence": "",
        },
        {"gpu": 2, "uuid": "GPU-c", "pid": 9, "state": "Z", "ppid": 8, "title": "t", "mib": None, "evidence": "x"},
    ]
    result = {**probe_result(healthy=False), "state": "needs_gpu_reset", "unreapable": unreapable}
    parsed = samples(render_probe(result, URL, UNIT))
    assert states(parsed)["needs_gpu_reset"] == 1.0 and states(parsed)["not_serving"] == 0.0
    assert parsed[("llmops_sglang_probe_gpu_needs_reset", labels(gpu="0"))] == 1.0
    assert parsed[("llmops_sglang_probe_gpu_needs_reset", labels(gpu="2"))] == 1.0
    assert parsed[("llmops_sglang_probe_gpu_unreapable_memory_bytes", labels(gpu="0"))] == 32000 * 1024 * 1024
    assert ("llmops_sglang_probe_gpu_needs_reset", labels(gpu="1")) not in parsed


def test_soak_results_are_exported():
    result = {
        **probe_result(),
        "soak": {"requests": 5, "completed": 5, "latencies_s": [0.1, 0.4, 0.2], "failed_request": None},
    }
    parsed = samples(render_probe(result, URL, UNIT))
    assert parsed[("llmops_sglang_probe_soak_requests", labels())] == 5.0
    assert parsed[("llmops_sglang_probe_soak_completed_requests", labels())] == 5.0
    assert parsed[("llmops_sglang_probe_soak_max_latency_seconds", labels())] == 0.4
