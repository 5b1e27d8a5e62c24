from __future__ import annotations

import shutil

import pytest
from sglang_fixture import SYNTHETIC_FILES, FakeVenv, run_command

from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import (
    InstallError,
    TargetPython,
    verify_record,
)


@pytest.fixture(scope="module")
def fake_venv(tmp_path_factory):
    return FakeVenv(tmp_path_factory.mktemp("venv"))


@pytest.fixture
def installed(fake_venv):
    fake_venv.clear()
    fake_venv.install(SYNTHETIC_FILES, version="0.0.7")
    return fake_venv


def test_locates_sglang_of_the_given_python_without_importing_it(installed):
    (installed.site / "sglang" / "__init__.py").write_bytes(b"raise SystemExit('imported!')\n")
    install = TargetPython(run_command, installed.python).locate()
    assert install.version == "0.0.7"
    assert install.package_dir == str(installed.site / "sglang")
    assert install.base_dir == str(installed.site)
    assert install.record == str(installed.site / "sglang-0.0.7.dist-info" / "RECORD")
    assert install.python_version.count(".") == 2


def test_python_without_sglang_is_a_clear_error(fake_venv):
    fake_venv.clear()
    with pytest.raises(InstallError, match=r"cannot import 'sglang': no such package on its sys.path"):
        TargetPython(run_command, fake_venv.python).locate()


@pytest.mark.parametrize("python", ["/nonexistent/bin/python", "python3", "/tmp"])
def test_python_that_is_not_an_executable_is_a_clear_error(python):
    with pytest.raises(InstallError, match=f"python {python} is not an executable file"):
        TargetPython(run_command, python).locate()


def test_sglang_without_dist_info_is_refused(installed):
    shutil.rmtree(installed.site / "sglang-0.0.7.dist-info")
    with pytest.raises(InstallError, match=r"no installed distribution metadata"):
        TargetPython(run_command, installed.python).locate()


def test_syntax_errors_are_found_in_memory_and_compile_writes_bytecode(installed):
    python = TargetPython(run_command, installed.python)
    errors = python.syntax_errors({"sglang/good.py": b"x = 1\n", "sglang/bad.py": b"def f(:\n"})
    assert list(errors) == ["sglang/bad.py"] and errors["sglang/bad.py"].startswith("SyntaxError at line 1:")
    module = installed.site / "sglang" / "srt" / "server.py"
    assert python.compile_files([str(module)]) == {}
    assert list((module.parent / "__pycache__").glob("server.*.pyc"))
    module.write_bytes(b"x = = 1\n")
    assert "invalid syntax" in python.compile_files([str(module)])[str(module)]


def test_verify_record_finds_modified_missing_and_unrecorded_files(installed):
    install = TargetPython(run_command, installed.python).locate()
    assert verify_record(install)["pristine"] is True
    (installed.site / "sglang" / "srt" / "server.py").write_bytes(b"PORT = 1\n")
    (installed.site / "sglang" / "srt" / "algos.py").unlink()
    (installed.site / "sglang" / "srt" / "extra.py").write_bytes(b"")
    (installed.site / "sglang" / "srt" / "__pycache__").mkdir()
    (installed.site / "sglang" / "srt" / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"")
    report = verify_record(install)
    assert report["checked"] == len(SYNTHETIC_FILES)
    assert report["modified"] == ["sglang/srt/server.py"]
    assert report["missing"] == ["sglang/srt/algos.py"]
    assert report["unrecorded"] == ["sglang/srt/extra.py"]
    assert report["pristine"] is False
