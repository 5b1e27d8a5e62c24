from __future__ import annotations

import os
import re
import stat

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import TEMP_SUFFIX
from ansible_collections.llmops.inference.plugins.module_utils.source_tree import PathSafetyError, SourceTree


@pytest.fixture
def tree(tmp_path):
    site = tmp_path / "site-packages"
    package = site / "sglang" / "srt"
    package.mkdir(parents=True)
    (package / "mod.py").write_bytes(b"x = 1\n")
    (site / "outside.py").write_bytes(b"secret\n")
    return SourceTree(str(site), str(site / "sglang"))


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/etc/passwd", "absolute paths are refused"),
        ("~/x.py", "absolute paths are refused"),
        ("sglang/../outside.py", "'..'"),
        ("../../etc/passwd", "'..'"),
        ("outside.py", "outside the package"),
        ("sglang-0.5.23.dist-info/RECORD", "outside the package"),
        ("sglang", "outside the package directory"),
        ("sglang/srt", "is a directory"),
        ("", "empty path"),
    ],
)
def test_paths_outside_the_package_are_refused(tree, path, reason):
    with pytest.raises(PathSafetyError, match=re.escape(reason)):
        tree.path_of(path)


def test_symlink_escaping_the_package_is_refused(tree, tmp_path):
    os.symlink(tmp_path / "site-packages" / "outside.py", tmp_path / "site-packages" / "sglang" / "srt" / "link.py")
    os.symlink(tmp_path, tmp_path / "site-packages" / "sglang" / "escape")
    with pytest.raises(PathSafetyError, match="symlink escape"):
        tree.path_of("sglang/srt/link.py")
    with pytest.raises(PathSafetyError, match="symlink escape"):
        tree.path_of("sglang/escape/new_file.py")


def test_normal_and_new_paths_resolve_inside(tree, tmp_path):
    assert tree.path_of("sglang//srt/./mod.py") == str(tmp_path / "site-packages" / "sglang" / "srt" / "mod.py")
    assert tree.check("sglang/srt/./new.py") == "sglang/srt/new.py"
    assert tree.missing_parents("sglang/srt/a/b/c.py") == ["sglang/srt/a", "sglang/srt/a/b"]


def test_write_is_atomic_keeps_mode_and_leaves_no_temp_file(tree, tmp_path):
    target = tmp_path / "site-packages" / "sglang" / "srt" / "mod.py"
    target.chmod(0o640)
    tree.write("sglang/srt/mod.py", b"x = 2\n")
    assert target.read_bytes() == b"x = 2\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not [name for name in os.listdir(target.parent) if name.endswith(TEMP_SUFFIX)]
    created = tree.write("sglang/srt/pkg/new.py", b"y = 1\n", 0o644)
    assert created == ["sglang/srt/pkg"]
    assert tree.read("sglang/srt/pkg/new.py") == b"y = 1\n"


def test_purge_bytecode_removes_only_that_module(tree, tmp_path):
    srt = tmp_path / "site-packages" / "sglang" / "srt"
    cache = srt / "__pycache__"
    cache.mkdir()
    doomed = ["mod.cpython-311.pyc", "mod.cpython-312.opt-1.pyc", "mod.pypy39.pyc"]
    kept = ["mod_other.cpython-311.pyc", "model.cpython-311.pyc", "mod.cpython-311.pyc.tmp"]
    for name in doomed + kept:
        (cache / name).write_bytes(b"")
    (srt / "mod.pyc").write_bytes(b"")
    removed = tree.purge_bytecode("sglang/srt/mod.py")
    assert sorted(removed) == sorted(["sglang/srt/mod.pyc"] + [f"sglang/srt/__pycache__/{n}" for n in doomed])
    assert sorted(os.listdir(cache)) == sorted(kept)


def test_temp_leftovers_of_a_crashed_write_are_removed(tree, tmp_path):
    srt = tmp_path / "site-packages" / "sglang" / "srt"
    (srt / f".mod.py.abc123{TEMP_SUFFIX}").write_bytes(b"half")
    (srt / f".other.py.abc123{TEMP_SUFFIX}").write_bytes(b"half")
    assert tree.remove_temp_leftovers("sglang/srt/mod.py") == [f"sglang/srt/.mod.py.abc123{TEMP_SUFFIX}"]
    assert (srt / f".other.py.abc123{TEMP_SUFFIX}").exists()


def test_remove_empty_dirs_deepest_first(tree, tmp_path):
    tree.write("sglang/srt/a/b/c.py", b"")
    tree.remove("sglang/srt/a/b/c.py")
    (tmp_path / "site-packages" / "sglang" / "srt" / "a" / "b" / "__pycache__").mkdir()
    assert tree.remove_empty_dirs(["sglang/srt/a", "sglang/srt/a/b"]) == ["sglang/srt/a/b", "sglang/srt/a"]
    assert not (tmp_path / "site-packages" / "sglang" / "srt" / "a").exists()
