"""sglang_info: an interpreter that can run SGLang passes; each missing requirement is named."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

# The installed-sglang stand-ins live with the module_utils tests.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "module_utils"))

from sglang_fixture import SYNTHETIC_FILES, FakeVenv, run_command

from ansible_collections.llmops.inference.plugins.modules.sglang_info import find_nvcc, inspect_install

RUNNING = "{}.{}".format(*sys.version_info[:2])


@pytest.fixture(scope="module")
def venv_dir(tmp_path_factory):
    return FakeVenv(tmp_path_factory.mktemp("venv"))


@pytest.fixture
def installed(venv_dir):
    venv_dir.clear()
    venv_dir.install(SYNTHETIC_FILES, version="0.5.23")
    script = venv_dir.root / "bin" / "sglang"
    script.unlink(missing_ok=True)
    return venv_dir


def params(python, **overrides) -> dict:
    return {
        "python": python,
        "version": "",
        "min_python": RUNNING,
        "require_script": False,
        "label": "sglang_service_python",
        **overrides,
    }


def test_an_interpreter_with_sglang_passes(installed):
    facts, problem = inspect_install(params(installed.python, version="0.5.23"), run_command)
    assert problem is None
    assert facts["version"] == "0.5.23" and facts["python_version"].startswith(RUNNING)
    assert facts["package_dir"] == str(installed.site / "sglang")
    assert facts["script"] is None


def test_missing_sglang_names_the_variable(venv_dir):
    venv_dir.clear()
    _facts, problem = inspect_install(params(venv_dir.python), run_command)
    assert problem.startswith(f"sglang_service_python {venv_dir.python} cannot run SGLang: ")
    assert "cannot import 'sglang'" in problem


def test_a_missing_interpreter_is_named():
    _facts, problem = inspect_install(params("/opt/none/bin/python"), run_command)
    assert problem.startswith(
        "sglang_service_python /opt/none/bin/python cannot run SGLang: python /opt/none/bin/python is not an "
        "executable file"
    )


def test_an_old_python_is_refused(installed):
    _facts, problem = inspect_install(params(installed.python, min_python="3.99"), run_command)
    assert f"is Python {sys.version_info[0]}.{sys.version_info[1]}" in problem
    assert "sglang needs Python >= 3.99" in problem


def test_another_sglang_version_is_refused(installed):
    _facts, problem = inspect_install(params(installed.python, version="0.5.22"), run_command)
    assert problem == (f"sglang_service_python {installed.python} has sglang 0.5.23, but version 0.5.22 is required")


def test_the_console_script_is_required_only_when_asked(installed):
    _facts, problem = inspect_install(params(installed.python, require_script=True), run_command)
    assert "no executable" in problem and problem.endswith("reinstall sglang in that environment with pip")
    script = installed.root / "bin" / "sglang"
    script.write_text("#!/bin/sh\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    facts, problem = inspect_install(params(installed.python, require_script=True), run_command)
    assert problem is None and facts["script"] == str(script)


def test_the_module_fails_with_the_problem(installed, capsys, monkeypatch, target_side_ansible):
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.llmops.inference.plugins.modules import sglang_info

    with patch_module_args(params(installed.python, version="9.9")), pytest.raises(SystemExit):
        sglang_info.main()
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] is True and "but version 9.9 is required" in result["msg"]
    assert result["version"] == "0.5.23"


def run_gpus_mode(capsys, monkeypatch, answer, args) -> dict:
    """sglang_info with only ``gpus`` set; ``answer`` stands in for inspect_gpu_list."""
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.llmops.inference.plugins.modules import sglang_info

    seen = {}

    def inspect(params, run_command):
        seen.update(params)
        return answer

    monkeypatch.setattr(sglang_info, "inspect_gpu_list", inspect)
    with patch_module_args(args), pytest.raises(SystemExit):
        sglang_info.main()
    return dict(json.loads(capsys.readouterr().out), seen=seen)


def test_the_gpus_mode_needs_no_interpreter_and_passes(capsys, monkeypatch, target_side_ansible):
    facts = {"backend": "nvml", "devices": [], "holders": [], "needed": 2, "cuda_devices": 2, "problems": []}
    args = {"gpus": {"devices": ["2", 3], "tp_size": 2, "unit": "sglang-qwen", "label": "sglang_service_gpus"}}
    result = run_gpus_mode(capsys, monkeypatch, (facts, [], ["processes on GPU 3 unknown"]), args)
    assert result.get("failed") is not True and result["changed"] is False
    assert result["msg"] == "sglang_service_gpus [2, 3] can work on this host" and result["gpus"] == facts
    assert "processes on GPU 3 unknown" in json.dumps(result["warnings"])
    assert result["seen"] == {
        "devices": ["2", "3"],
        "tp_size": 2,
        "extra_args": [],
        "unit": "sglang-qwen",
        "label": "sglang_service_gpus",
        "backend": "auto",
        "pids_visible": False,
    }


def test_the_gpus_mode_fails_with_every_problem(capsys, monkeypatch, target_side_ansible):
    problems = ["sglang_service_gpus must name GPUs this host has: 7 ...", "sglang_service_gpus must name each GPU ..."]
    result = run_gpus_mode(capsys, monkeypatch, ({"problems": problems}, problems, []), {"gpus": {"devices": ["7"]}})
    assert result["failed"] is True and result["msg"] == "\n".join(problems)


def test_one_mode_is_required(capsys, target_side_ansible):
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.llmops.inference.plugins.modules import sglang_info

    with patch_module_args({}), pytest.raises(SystemExit):
        sglang_info.main()
    result = json.loads(capsys.readouterr().out)
    assert (
        result["failed"] is True
        and "one of the following is required: python, gpus, node_group, nvcc_dirs" in result["msg"]
    )


def make_nvcc(directory, executable=True):
    directory.mkdir(parents=True, exist_ok=True)
    nvcc = directory / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755 if executable else 0o644)
    return str(nvcc)


def test_nvcc_is_the_first_executable_one_in_the_order_given(tmp_path):
    make_nvcc(tmp_path / "venv-bin", executable=False)
    later = make_nvcc(tmp_path / "usr-bin")
    first = make_nvcc(tmp_path / "cuda-bin")
    dirs = [str(tmp_path / name) for name in ("missing", "venv-bin", "cuda-bin", "usr-bin")]
    assert find_nvcc(dirs) == first
    assert find_nvcc(dirs[:2] + dirs[3:]) == later
    assert find_nvcc(dirs[:2]) is None


def test_the_module_returns_nvcc_or_null_without_failing(tmp_path, capsys, target_side_ansible):
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.llmops.inference.plugins.modules import sglang_info

    found = make_nvcc(tmp_path / "cuda" / "bin")
    for dirs, expected in (([str(tmp_path / "none"), str(tmp_path / "cuda" / "bin")], found), ([str(tmp_path)], None)):
        with patch_module_args({"nvcc_dirs": dirs}), pytest.raises(SystemExit):
            sglang_info.main()
        result = json.loads(capsys.readouterr().out)
        assert result.get("failed") is not True and result["changed"] is False
        assert result["nvcc"] == expected


def run_node_group_mode(capsys, monkeypatch, args, reach=None) -> dict:
    """sglang_info with only ``node_group`` set; ``reach`` stands in for the connection to the rank-0 address."""
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.llmops.inference.plugins.modules import sglang_info

    monkeypatch.setattr(sglang_info, "check_rank0_address", reach or (lambda *a: None))
    with patch_module_args(args), pytest.raises(SystemExit):
        sglang_info.main()
    return json.loads(capsys.readouterr().out)


def group_args(host: str, **view) -> dict:
    members = ["gpu-a", "gpu-b"]
    base = {"node_group": members, "tp_size": 4, "model_path": "m", "dist_init_port": 20000}
    views = {name: {**base, "address": f"10.0.0.{i + 1}", **view} for i, name in enumerate(members)}
    return {"node_group": {"host": host, "members": members, "views": views}}


def test_the_node_group_mode_returns_the_rank_and_the_rank0_address(capsys, monkeypatch, target_side_ansible):
    result = run_node_group_mode(capsys, monkeypatch, group_args("gpu-b"))
    assert result.get("failed") is not True and result["changed"] is False
    assert result["msg"] == "gpu-b is rank 1 of 2 nodes"
    assert result["node_group"] == {
        "nnodes": 2,
        "node_rank": 1,
        "dist_init_addr": "10.0.0.1:20000",
        "gpus_per_node": 2,
        "ranks": {"gpu-a": 0, "gpu-b": 1},
    }


def test_the_node_group_mode_fails_on_a_bad_group_or_an_unreachable_rank0(capsys, monkeypatch, target_side_ansible):
    result = run_node_group_mode(capsys, monkeypatch, group_args("gpu-b", tp_size=3))
    assert result["failed"] is True and "sglang_service_tp_size 3 does not divide by the 2 hosts" in result["msg"]
    result = run_node_group_mode(capsys, monkeypatch, group_args("gpu-b"), reach=lambda *a: "gpu-b cannot reach ...")
    assert result["failed"] is True and result["msg"] == "gpu-b cannot reach ..."


def test_the_drain_mode_refuses_settings_sglangs_drain_does_not_serve(capsys, target_side_ansible):
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.llmops.inference.plugins.modules import sglang_info

    args = {"drain": {"extra_args": ["--pp-size", "2"], "environment": {"SGLANG_RUST_SERVER": "1"}}}
    with patch_module_args(args), pytest.raises(SystemExit):
        sglang_info.main()
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] is True
    lines = result["msg"].splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("sglang_service_extra_args sets --pp-size 2:")
    assert lines[1].startswith("sglang_service_environment sets SGLANG_RUST_SERVER=1:")
    accepted = {"drain": {**args["drain"], "accept": True}}
    with patch_module_args(accepted), pytest.raises(SystemExit):
        sglang_info.main()
    result = json.loads(capsys.readouterr().out)
    assert result.get("failed") is not True
    assert result["msg"] == "the stop's drain serves the engine's settings"
