from __future__ import annotations

import hashlib
import os
import shutil

import pytest
from sglang_fixture import SYNTHETIC_FILES, run_command

from ansible_collections.llmops.inference.plugins.module_utils import sglang_install
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import (
    InstallError,
    TargetPython,
    record_sha256,
    source_differences,
    subprocess_runner,
    verify_record,
)


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


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_source_differences_name_each_changed_file_by_content_and_by_the_wheels_hash(installed):
    install = TargetPython(run_command, installed.python).locate()
    assert source_differences(install) == {}
    package = installed.site / "sglang" / "srt"
    (package / "server.py").write_bytes(b"PORT = 1\n")
    (package / "algos.py").unlink()
    (package / "extra.py").write_bytes(b"X = 1\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"")
    (package / ".server.py.abc.llmops-tmp").write_bytes(b"half written")

    found = source_differences(install)

    assert found == {
        "sglang/srt/server.py": {
            "sha256": sha(b"PORT = 1\n"),
            "pristine": sha(SYNTHETIC_FILES["sglang/srt/server.py"]),
        },
        "sglang/srt/algos.py": {"sha256": None, "pristine": sha(SYNTHETIC_FILES["sglang/srt/algos.py"])},
        "sglang/srt/extra.py": {"sha256": sha(b"X = 1\n"), "pristine": None},
    }


def test_the_cache_spares_hashing_unchanged_files_and_sees_every_rewrite(installed, monkeypatch):
    install = TargetPython(run_command, installed.python).locate()
    cache = {}
    source_differences(install, cache)
    assert set(cache) == set(SYNTHETIC_FILES)
    hashed = []
    real = sglang_install.file_digest
    monkeypatch.setattr(sglang_install, "file_digest", lambda path, *a: hashed.append(path) or real(path, *a))

    assert source_differences(install, cache) == {}
    assert hashed == []

    # Same size, and the old mtime put back: the inode and ctime still tell the rewrite.
    server = installed.site / "sglang" / "srt" / "server.py"
    before = os.stat(server)
    server.write_bytes(SYNTHETIC_FILES["sglang/srt/server.py"].replace(b"30000", b"30001"))
    os.utime(server, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert list(source_differences(install, cache)) == ["sglang/srt/server.py"]
    assert hashed == [str(server)]


def test_a_record_that_is_not_sha256_is_refused(installed):
    record = installed.site / "sglang-0.0.7.dist-info" / "RECORD"
    record.write_text(record.read_text().replace("sha256=", "sha512=", 1))
    install = TargetPython(run_command, installed.python).locate()
    with pytest.raises(InstallError, match="sha512 digest; only sha256 RECORDs"):
        source_differences(install)


def test_record_hashes_convert_to_hex():
    assert record_sha256("47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU") == sha(b"")


def test_the_subprocess_runner_answers_like_run_command():
    assert subprocess_runner(["/bin/sh", "-c", "cat; echo err >&2; exit 3"], data="in") == (3, "in", "err\n")
    assert subprocess_runner(["/nonexistent"])[0] == 127
