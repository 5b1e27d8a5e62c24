"""Crash-safe writes (old or new bytes, never a mix), the file's mode kept, and content hashes."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from ansible_collections.llmops.inference.plugins.module_utils import atomic_file
from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import (
    TEMP_SUFFIX,
    atomic_write,
    file_digest,
    is_temp_leftover,
    read_bytes,
    sha256_bytes,
    sha256_file,
)


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_the_bytes_and_mode_0644_and_no_temporary_file_is_left(tmp_path):
    target = tmp_path / "state.json"
    atomic_write(str(target), b"{}\n")
    assert target.read_bytes() == b"{}\n"
    assert mode_of(target) == 0o644
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_replaced_file_keeps_its_mode_unless_one_is_given(tmp_path):
    target = tmp_path / "unit.conf"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    atomic_write(str(target), b"new")
    assert (target.read_bytes(), mode_of(target)) == (b"new", 0o600)
    atomic_write(str(target), b"newer", mode=0o640)
    assert (target.read_bytes(), mode_of(target)) == (b"newer", 0o640)


def test_a_failed_write_leaves_the_old_bytes_and_removes_its_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    target.write_bytes(b"old")

    def crash(_source, _dest):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_file.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["record.json"]


def test_only_the_writers_own_temporary_names_count_as_leftovers():
    assert is_temp_leftover(".record.json.abc123" + TEMP_SUFFIX)
    assert not is_temp_leftover("record.json" + TEMP_SUFFIX)
    assert not is_temp_leftover(".record.json")


def test_hashes_and_reads_of_a_file_and_of_a_missing_one(tmp_path):
    target = tmp_path / "weights.bin"
    data = b"x" * (atomic_file.CHUNK + 7)  # more than one read chunk
    target.write_bytes(data)
    assert sha256_file(str(target)) == sha256_bytes(data) == hashlib.sha256(data).hexdigest()
    assert file_digest(str(target), "md5").hexdigest() == hashlib.md5(data).hexdigest()
    assert read_bytes(str(target)) == data
    missing = str(tmp_path / "missing")
    assert (sha256_file(missing), file_digest(missing), read_bytes(missing)) == (None, None, None)
