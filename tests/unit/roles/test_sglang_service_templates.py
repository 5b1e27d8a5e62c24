"""The sglang_service role's templates, rendered the way its preflight renders them (the template lookup, with the
role's defaults and vars): each field's escaping, and a line break in any value failing with the variable's name."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from templar_worker import RenderError, TemplarWorker

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "sglang_service"

BASE = {
    "sglang_service_name": "sglang-t",
    "sglang_service_model_path": "Qwen/Qwen3-8B",
    "sglang_service_python": "/opt/sglang/venv/bin/python",
    "sglang_service_tp_size": 2,
}
NEWLINE = "x\nExecStartPre=/bin/touch /tmp/pwned"


@pytest.fixture(scope="module")
def renderer():
    with TemplarWorker(REPO / "build" / "collections") as worker:
        yield worker


@pytest.fixture
def render(renderer):
    def _render(template: str, **overrides) -> str:
        variables = {
            **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
            **yaml.safe_load((ROLE / "vars" / "main.yml").read_text()),
            "role_path": str(ROLE),
            "ansible_search_path": [str(ROLE)],
            "ansible_managed": "Ansible managed",
            **BASE,
            **overrides,
        }
        return renderer.render("{{ lookup('ansible.builtin.template', '" + template + "') }}", variables)

    return _render


def line(text: str, prefix: str) -> str:
    return next(entry for entry in text.splitlines() if entry.startswith(prefix))


def systemd_words(command: str) -> list:
    """Split an Exec line back into words and undo the %% and $$ escapes (close enough for these values)."""
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(command)]


# -- the unit ----------------------------------------------------------------------------------------------


def test_default_unit_launches_sglang_serve_places_the_engine_and_drains_on_stop(render):
    unit = render("sglang.service.j2")
    exec_start = line(unit, "ExecStart=")
    assert exec_start.startswith(
        "ExecStart=/opt/sglang/venv/bin/sglang serve --model-type llm --model-path Qwen/Qwen3-8B --tp-size 2 "
    )
    assert "--enable-metrics" in exec_start and "--config" not in exec_start and "--api-key" not in exec_start
    assert line(unit, 'Environment="PATH') == (
        'Environment="PATH=/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
    )
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID" "CUDA_VISIBLE_DEVICES=0,1"' in unit
    assert line(unit, "ExecStop=") == (
        "ExecStop=/opt/sglang/venv/bin/python /usr/local/libexec/llmops/llmops_gate.py drain "
        "--url http://127.0.0.1:30000 --timeout 120 --tail 30 --pid ${MAINPID}"
    )
    # The stop waits for SGLang's own drain: budget 120, then the tail (its 5 s check + scheduler exit 15 + shutdown
    # tail 10), within TimeoutStopSec.
    assert "at most 150 s" in unit
    assert "gpu-free --gpus 0,1 --threshold-mib 1024 --wait 30 --unit sglang-t.service" in unit
    assert "ready --url http://127.0.0.1:30000/health --timeout 1200" in unit
    for setting in ("KillMode=control-group", "TimeoutStopSec=165", "Restart=on-failure", "StartLimitBurst=3"):
        assert setting in unit.splitlines()


def test_a_launch_module_is_run_with_the_python(render):
    unit = render("sglang.service.j2", sglang_service_launch_module="sglang_sim.launch_server")
    assert line(unit, "ExecStart=").startswith(
        "ExecStart=/opt/sglang/venv/bin/python -m sglang_sim.launch_server --model-path Qwen/Qwen3-8B"
    )


def test_gpus_by_uuid_and_mig_reach_cuda_visible_devices_and_the_gate(render):
    gpus = ["GPU-3b1c0f1e-0000-4000-8000-000000000000", "MIG-5c3d7e2a-0000-4000-8000-000000000001"]
    unit = render("sglang.service.j2", sglang_service_gpus=gpus)
    assert f'"CUDA_VISIBLE_DEVICES={",".join(gpus)}"' in unit
    assert f"gpu-free --gpus {','.join(gpus)} " in unit


def test_gpu_uuids_reach_cuda_visible_devices_as_the_hosts_indexes(render):
    """SGLang's custom all-reduce parses CUDA_VISIBLE_DEVICES with int(): preflight's look at the host's GPUs turns
    GPU UUIDs into indexes there, in the list's order; the gate keeps the UUIDs."""
    gpus = ["GPU-3b1c0f1e-0000-4000-8000-000000000002", "GPU-3b1c0f1e-0000-4000-8000-000000000000"]
    host = {"gpus": {"devices": [{"index": 2, "uuid": gpus[0]}, {"index": 0, "uuid": gpus[1]}]}}
    unit = render("sglang.service.j2", sglang_service_gpus=gpus, __sglang_service_gpu_host=host)
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID" "CUDA_VISIBLE_DEVICES=2,0"' in unit
    assert f"gpu-free --gpus {','.join(gpus)} " in unit


def test_a_mig_device_keeps_its_uuid_in_cuda_visible_devices(render):
    mig = "MIG-5c3d7e2a-0000-4000-8000-000000000001"
    host = {"gpus": {"devices": [{"index": 0, "uuid": mig, "mig_index": 1, "parent_uuid": "GPU-a"}]}}
    unit = render(
        "sglang.service.j2", sglang_service_gpus=[mig], sglang_service_tp_size=1, __sglang_service_gpu_host=host
    )
    assert f'"CUDA_VISIBLE_DEVICES={mig}"' in unit


# -- a multi-node engine ---------------------------------------------------------------------------------------------
GROUP_PLAN = {"node_group": {"nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:20000", "gpus_per_node": 2}}


def test_one_host_renders_no_multi_node_flags(render):
    exec_start = line(render("sglang.service.j2"), "ExecStart=")
    assert "--nnodes" not in exec_start and "--node-rank" not in exec_start and "--dist-init-addr" not in exec_start


def test_a_host_of_a_group_renders_its_rank_and_rank0s_address_and_half_the_gpus(render):
    unit = render(
        "sglang.service.j2",
        sglang_service_tp_size=4,
        sglang_service_node_group=["gpu-a", "gpu-b"],
        sglang_service_dist_timeout=120,
        __sglang_service_node_group_info=GROUP_PLAN,
    )
    words = systemd_words(line(unit, "ExecStart=")[len("ExecStart=") :])
    assert words[words.index("--tp-size") : words.index("--tp-size") + 2] == ["--tp-size", "4"]
    start = words.index("--nnodes")
    assert words[start : start + 8] == [
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:20000", "--dist-timeout", "120",
    ]  # fmt: skip
    # tp_size is the engine's; each host runs tp_size / hosts ranks on its own GPUs 0 .. 1
    assert '"CUDA_VISIBLE_DEVICES=0,1"' in unit and "gpu-free --gpus 0,1 " in unit


def test_rank_0_renders_node_rank_0_and_the_dropin_keeps_the_group(render):
    plan = {"node_group": {**GROUP_PLAN["node_group"], "node_rank": 0}}
    unit = render("sglang.service.j2", sglang_service_tp_size=4, __sglang_service_node_group_info=plan)
    assert "--nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.1:20000" in line(unit, "ExecStart=")
    point = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "draft_model_path": ""}
    dropin = render(
        "speculative.conf.j2", __sglang_service_speculative_active=point, __sglang_service_node_group_info=plan
    )
    assert "--nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.1:20000" in dropin


def test_a_rank_above_0_has_no_drain_a_short_stop_and_comes_back_by_itself(render):
    """SGLang's rank >= 1 only logs a SIGTERM and exits 0 when rank 0's ShutdownReq ends it: a drain would wait its
    whole budget for nothing, and Restart=on-failure would never bring it back."""
    unit = render("sglang.service.j2", sglang_service_tp_size=4, __sglang_service_node_group_info=GROUP_PLAN)
    assert "ExecStop=" not in unit
    settings = unit.splitlines()
    assert "TimeoutStopSec=30" in settings and "Restart=always" in settings
    assert "# Rank 1 of a node group: it serves no request, so its stop has no drain." in unit
    plan = {"node_group": {**GROUP_PLAN["node_group"], "node_rank": 0}}
    rank0 = render("sglang.service.j2", sglang_service_tp_size=4, __sglang_service_node_group_info=plan).splitlines()
    assert "TimeoutStopSec=165" in rank0 and "Restart=on-failure" in rank0
    assert any(entry.startswith("ExecStop=") and " drain " in entry for entry in rank0)


def test_the_cuda_toolkit_is_exported_with_its_bin_on_path(render):
    unit = render("sglang.service.j2", sglang_service_cuda_home="/opt/cuda-12.8")
    assert line(unit, 'Environment="CUDA_HOME') == 'Environment="CUDA_HOME=/opt/cuda-12.8"'
    assert line(unit, 'Environment="PATH') == (
        'Environment="PATH=/opt/sglang/venv/bin:/opt/cuda-12.8/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin'
        ':/sbin:/bin"'
    )


@pytest.mark.parametrize(
    ("nvcc", "home"),
    [("/usr/local/cuda/bin/nvcc", "/usr/local/cuda"), ("/usr/bin/nvcc", None), (None, None)],
)
def test_the_cuda_toolkit_defaults_to_usr_local_cuda_where_it_holds_nvcc(render, nvcc, home):
    unit = render("sglang.service.j2", __sglang_service_install={"nvcc": nvcc})
    homes = [entry for entry in unit.splitlines() if entry.startswith('Environment="CUDA_HOME')]
    assert homes == ([f'Environment="CUDA_HOME={home}"'] if home else [])
    assert ("/usr/local/cuda/bin:" in line(unit, 'Environment="PATH')) is (home is not None)


def test_the_api_key_goes_to_the_config_file_never_to_the_unit(render):
    key = 's3cret: "key" $1 %n'
    unit = render("sglang.service.j2", sglang_service_api_key=key)
    assert "--config /etc/llmops/sglang-t.yaml" in line(unit, "ExecStart=")
    # The stop's abort at the end of the drain budget sends the key, read from the same file.
    assert line(unit, "ExecStop=").endswith("--tail 30 --config /etc/llmops/sglang-t.yaml --pid ${MAINPID}")
    assert "s3cret" not in unit
    config = render("sglang.yaml.j2", sglang_service_api_key=key)
    assert yaml.safe_load(config) == {"api-key": key}


def test_description_and_working_directory_escape_specifiers(render):
    unit = render(
        "sglang.service.j2",
        sglang_service_description="100% up, $HOME stays",
        sglang_service_working_directory="/srv/my models/%h",
    )
    assert "Description=100%% up, $HOME stays" in unit.splitlines()
    assert "WorkingDirectory=/srv/my models/%%h" in unit.splitlines()


def test_exec_start_arguments_reach_the_process_intact(render):
    tricky = "a b%c$d\"e'f\\g"
    unit = render(
        "sglang.service.j2",
        sglang_service_served_model_name=tricky,
        sglang_service_extra_args=["--sim-load-time", 1, "--chat-template", "x y"],
    )
    words = systemd_words(line(unit, "ExecStart=")[len("ExecStart=") :])
    assert words[words.index("--served-model-name") + 1] == tricky
    assert words[-4:] == ["--sim-load-time", "1", "--chat-template", "x y"]


def test_a_python_path_with_a_percent_is_escaped_on_the_path_line(render):
    unit = render("sglang.service.j2", sglang_service_python="/opt/a%b/bin/python")
    assert line(unit, 'Environment="PATH').startswith('Environment="PATH=/opt/a%%b/bin:')


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("sglang_service_description", NEWLINE, "sglang_service_description"),
        ("sglang_service_description", "tab\there", "sglang_service_description"),
        ("sglang_service_description", "line\u2028separator", "sglang_service_description"),
        ("sglang_service_working_directory", "/srv\nExecStartPre=/bin/true", "sglang_service_working_directory"),
        ("sglang_service_user", NEWLINE, "sglang_service_user"),
        ("sglang_service_group", NEWLINE, "sglang_service_group"),
        ("sglang_service_model_path", NEWLINE, "sglang_service_model_path"),
        ("sglang_service_served_model_name", NEWLINE, "sglang_service_served_model_name"),
        ("sglang_service_host", NEWLINE, "sglang_service_host"),
        ("sglang_service_speculative_draft_model_path", NEWLINE, "sglang_service_speculative_draft_model_path"),
        ("sglang_service_extra_args", ["--ok", NEWLINE], "sglang_service_extra_args[1]"),
        ("sglang_service_gpus", ["0", "1\n"], "sglang_service_gpus[1]"),
        ("sglang_service_python", "/opt/x\n/python", "sglang_service_python"),
        ("sglang_service_launch_module", "m\nx", "sglang_service_launch_module"),
        ("sglang_service_probe_url", "http://h:1\n", "sglang_service_probe_url"),
        ("sglang_service_config_dir", "/etc/x\n", "sglang_service_config_dir"),
        ("sglang_service_libexec_dir", "/usr/x\n", "sglang_service_libexec_dir"),
        ("sglang_service_unit_dir", "/etc/x\n", "sglang_service_unit_dir"),
        ("sglang_service_name", "sglang\nx", "sglang_service_name"),
    ],
)
def test_a_control_character_in_any_unit_field_fails_naming_its_variable(render, variable, value, named):
    with pytest.raises(RenderError) as refused:
        render("sglang.service.j2", **{variable: value})
    assert re.search(rf"failed: {re.escape(named)}(\[\d+\])?: ", str(refused.value)), str(refused.value)
    assert "is not allowed in a unit, drop-in or environment file" in str(refused.value)
    assert "pwned" not in str(refused.value)


# -- the drop-in, the environment file, the config file ----------------------------------------------------------


def test_dropin_sets_exec_start_again_with_the_point(render):
    point = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "draft_model_path": ""}
    text = render("speculative.conf.j2", __sglang_service_speculative_active=point)
    assert "ExecStart=\nExecStart=/opt/sglang/venv/bin/sglang serve" in text
    assert "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1" in text


def test_dropin_point_with_a_line_break_fails_naming_the_point(render):
    point = {"algorithm": "EAGLE", "num_steps": 3, "draft_model_path": NEWLINE}
    with pytest.raises(RenderError, match=r"sglang_service_speculative_point\.draft_model_path: a line break"):
        render("speculative.conf.j2", __sglang_service_speculative_active=point)


def test_environment_file_quotes_values_and_names_a_bad_one(render):
    text = render("sglang.env.j2", sglang_service_environment={"HF_HOME": "/data/hf cache", "N": 3})
    assert 'HF_HOME="/data/hf cache"' in text.splitlines() and 'N="3"' in text.splitlines()
    with pytest.raises(RenderError, match=r"sglang_service_environment\.HF_TOKEN: a line break"):
        render("sglang.env.j2", sglang_service_environment={"HF_TOKEN": "abc\nX=1"})
    with pytest.raises(RenderError, match=r"failed: sglang_service_environment: a line break"):
        render("sglang.env.j2", sglang_service_environment={"A\nB": "1"})


def test_config_file_refuses_a_key_with_a_line_break_without_showing_it(render):
    with pytest.raises(RenderError) as refused:
        render("sglang.yaml.j2", sglang_service_api_key="top\nsecret")
    assert "sglang_service_api_key: a line break (\\n) at character 4" in str(refused.value)
    assert "secret" not in str(refused.value).replace("secrets", "")


def test_every_template_starts_with_ansible_managed(render):
    for template in sorted(os.listdir(ROLE / "templates")):
        assert (ROLE / "templates" / template).read_text().startswith("{{ ansible_managed | comment }}"), template


# With an API key the engine runs through the log filter (base unit and speculative drop-in); with the filter off,
# journald >= 253 drops SGLang's server_args= lines.
LOG_FILTER_KEY = "s3cret-key"
LOG_FILTER_PREFIX = (
    "/opt/sglang/venv/bin/python /usr/local/libexec/llmops/llmops_log_filter.py "
    "--secrets-file /etc/llmops/sglang-t.yaml -- "
)


def test_with_a_key_the_engine_is_exec_d_by_the_log_filter(render):
    unit = render("sglang.service.j2", sglang_service_api_key=LOG_FILTER_KEY)
    exec_start = line(unit, "ExecStart=")
    engine = "/opt/sglang/venv/bin/sglang serve --model-type llm "
    assert exec_start.startswith("ExecStart=" + LOG_FILTER_PREFIX + engine)
    assert exec_start.endswith("--config /etc/llmops/sglang-t.yaml")
    assert LOG_FILTER_KEY not in unit and "LogFilterPatterns" not in unit


def test_the_speculative_dropin_runs_the_engine_through_the_filter_too(render):
    dropin = render(
        "speculative.conf.j2",
        sglang_service_api_key=LOG_FILTER_KEY,
        sglang_service_speculative_algorithm="EAGLE",
        sglang_service_speculative_num_steps=3,
    )
    assert dropin.splitlines()[-1].startswith("ExecStart=" + LOG_FILTER_PREFIX)


def test_without_a_key_there_is_no_filter(render):
    unit = render("sglang.service.j2")
    assert "llmops_log_filter" not in line(unit, "ExecStart=")


def test_filter_off_drops_server_args_lines_on_systemd_253_only(render):
    off = {"sglang_service_api_key": LOG_FILTER_KEY, "sglang_service_log_filter": False}
    new = render("sglang.service.j2", ansible_facts={"systemd": {"version": 253}}, **off)
    assert "llmops_log_filter" not in line(new, "ExecStart=")
    assert "LogFilterPatterns=~server_args=" in new.splitlines()
    old = render("sglang.service.j2", ansible_facts={"systemd": {"version": 252}}, **off)
    assert "LogFilterPatterns" not in old


def test_a_crash_dump_folder_reaches_sglang_only_when_set(render):
    assert "--crash-dump-folder" not in line(render("sglang.service.j2"), "ExecStart=")
    unit = render("sglang.service.j2", sglang_service_crash_dump_folder="/var/lib/sglang/crash")
    assert "--crash-dump-folder /var/lib/sglang/crash" in line(unit, "ExecStart=")
