"""The test labs' cache of compiled module code: a module imported from a zip runs the code its source gives,
compiled once per source, named after the zip it came from this time."""

from __future__ import annotations

import importlib.util
import traceback
import zipfile
import zipimport
from pathlib import Path

import pytest

CACHE_SOURCE = Path(__file__).resolve().parents[1] / "labctl" / "module_code_cache.py"
MODULE = "def fail():\n    raise ValueError('from the zip')\n\nVALUE = 42\n"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """The cache installed as on a lab host, writing under tmp_path; zipimport is restored afterwards."""
    monkeypatch.setattr(zipimport, "_compile_source", zipimport._compile_source)
    spec = importlib.util.spec_from_file_location("module_code_cache_under_test", CACHE_SOURCE)
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    monkeypatch.setattr(installed, "CACHE_DIR", str(tmp_path / "cache"))
    compiled = []
    compile_source = installed._compile_source

    def counting(pathname, source):
        compiled.append(pathname)
        return compile_source(pathname, source)

    monkeypatch.setattr(installed, "_compile_source", counting)
    return installed, compiled


def payload(path: Path, source: str = MODULE) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ansible_collections/demo/module.py", source)
    return path


def run(zip_path: Path) -> dict:
    code = zipimport.zipimporter(str(zip_path / "ansible_collections/demo")).get_code("module")
    namespace = {}
    exec(code, namespace)
    return namespace


def test_a_module_is_compiled_once_and_runs_the_same_from_another_zip(cache, tmp_path):
    _installed, compiled = cache
    first = run(payload(tmp_path / "first.zip"))
    again = run(payload(tmp_path / "again.zip"))
    assert first["VALUE"] == again["VALUE"] == 42
    assert compiled == [str(tmp_path / "first.zip" / "ansible_collections/demo/module.py")]
    assert len(list((tmp_path / "cache").iterdir())) == 1
    # A traceback names the zip the module came from this time, not the one it was first compiled from.
    with pytest.raises(ValueError) as raised:
        again["fail"]()
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert frames[-1].filename == str(tmp_path / "again.zip" / "ansible_collections/demo/module.py")


def test_a_changed_source_is_compiled_again(cache, tmp_path):
    _installed, compiled = cache
    run(payload(tmp_path / "first.zip"))
    changed = run(payload(tmp_path / "changed.zip", MODULE.replace("42", "43")))
    assert changed["VALUE"] == 43
    assert len(compiled) == 2


def test_an_unwritable_cache_compiles_every_time(cache, tmp_path):
    installed, compiled = cache
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    installed.CACHE_DIR = str(blocker / "cache")
    assert run(payload(tmp_path / "first.zip"))["VALUE"] == run(payload(tmp_path / "again.zip"))["VALUE"] == 42
    assert len(compiled) == 2


def test_a_damaged_entry_is_compiled_again(cache, tmp_path):
    _installed, compiled = cache
    run(payload(tmp_path / "first.zip"))
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_bytes(b"\x00not marshal")
    assert run(payload(tmp_path / "again.zip"))["VALUE"] == 42
    assert len(compiled) == 2
