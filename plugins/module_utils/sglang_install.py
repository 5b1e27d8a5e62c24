# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sglang installed for a given Python interpreter, found and checked without importing it.

Private to the llmops.inference collection; not a public API. Standard library only.
The interpreter that runs sglang (usually a venv's) may differ from the one running Ansible's
module, so locating the package and compiling its sources run *that* interpreter; only its
standard library is used there (``importlib.util.find_spec`` does not import the package).
Commands run through ``run_command(args, data=None) -> (rc, stdout, stderr)``.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import subprocess
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import file_digest, is_temp_leftover
from ansible_collections.llmops.inference.plugins.module_utils.source_tree import BYTECODE_DIR

PACKAGE = "sglang"

# Runs under the target interpreter (Python 3.8+): no imports beyond its standard library.
LOCATE_SCRIPT = r"""
import importlib.metadata, importlib.util, json, os, sys
if sys.path and sys.path[0] in ('', os.getcwd()):
    del sys.path[0]
out = {'python_version': '%d.%d.%d' % sys.version_info[:3], 'sys_path': sys.path}
spec = importlib.util.find_spec(sys.argv[1])
if spec is not None and spec.submodule_search_locations:
    out['package_dir'] = list(spec.submodule_search_locations)[0]
    try:
        dist = importlib.metadata.distribution(sys.argv[1])
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        out['version'] = dist.version
        out['base_dir'] = str(dist.locate_file(''))
        records = [f for f in (dist.files or []) if f.name == 'RECORD' and f.parent.name.endswith('.dist-info')]
        out['record'] = str(records[0].locate()) if records else None
print(json.dumps(out))
"""

# Reads {path: base64 source} on stdin; compiles in memory (nothing written); prints {path: error}.
CHECK_SCRIPT = r"""
import base64, json, sys
errors = {}
for path, encoded in sorted(json.load(sys.stdin).items()):
    try:
        compile(base64.b64decode(encoded), path, 'exec', dont_inherit=True)
    except SyntaxError as exc:
        errors[path] = '%s at line %s: %s: %r' % (type(exc).__name__, exc.lineno, exc.msg, (exc.text or '').strip())
    except ValueError as exc:
        errors[path] = '%s: %s' % (type(exc).__name__, exc)
print(json.dumps(errors))
"""

# Reads [path, ...] on stdin; writes their bytecode like an install would; prints {path: error}.
COMPILE_SCRIPT = r"""
import json, py_compile, sys
errors = {}
for path in json.load(sys.stdin):
    try:
        py_compile.compile(path, doraise=True)
    except py_compile.PyCompileError as exc:
        errors[path] = str(exc.msg).strip()
print(json.dumps(errors))
"""


def subprocess_runner(args, data=None):
    """``run_command`` for callers outside a module: the command's (rc, stdout, stderr), run from /."""
    try:
        proc = subprocess.run(args, input=data, capture_output=True, text=True, cwd="/", check=False)
    except OSError as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


class InstallError(Exception):
    """The interpreter cannot be run, or has no usable sglang installation."""


@dataclass
class SglangInstall:
    python: str
    python_version: str
    version: str
    package_dir: str
    base_dir: str
    record: str | None

    def facts(self) -> dict:
        return dict(self.__dict__)


class TargetPython:
    """Runs small standard-library scripts under the interpreter that runs sglang."""

    def __init__(self, run_command, python: str):
        self.run_command = run_command
        self.python = python

    def run_json(self, script: str, args: list = (), payload=None):
        if not os.path.isabs(self.python) or not os.access(self.python, os.X_OK) or os.path.isdir(self.python):
            raise InstallError(
                f"python {self.python} is not an executable file; give the absolute path of the interpreter "
                "that runs sglang, like /opt/sglang/venv/bin/python"
            )
        data = None if payload is None else json.dumps(payload)
        rc, out, err = self.run_command([self.python, "-E", "-c", script, *args], data=data)
        if rc != 0:
            raise InstallError(f"python {self.python} failed (rc={rc}): {(err or out).strip()[-2000:]}")
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise InstallError(f"python {self.python} printed no result: {(out + err)[-2000:]!r}") from exc

    def locate(self, package: str = PACKAGE) -> SglangInstall:
        found = self.run_json(LOCATE_SCRIPT, [package])
        if "package_dir" not in found:
            raise InstallError(
                f"python {self.python} (Python {found.get('python_version')}) cannot import {package!r}: no such "
                f"package on its sys.path {found.get('sys_path')}; give the interpreter of the environment "
                f"{package} is installed in"
            )
        if "version" not in found:
            raise InstallError(
                f"{package!r} at {found['package_dir']} (python {self.python}) has no installed distribution "
                f"metadata (.dist-info); only a pip-installed {package} can be patched and verified"
            )
        package_dir = found["package_dir"]
        base_dir = os.path.normpath(found["base_dir"])
        if os.path.realpath(os.path.join(base_dir, package)) != os.path.realpath(package_dir):
            raise InstallError(
                f"python {self.python} imports {package!r} from {package_dir}, but its installed distribution "
                f"({found['version']}) lives in {base_dir}; remove the shadowing copy or use another interpreter"
            )
        return SglangInstall(
            self.python, found["python_version"], found["version"], package_dir, base_dir, found.get("record")
        )

    def syntax_errors(self, sources: dict) -> dict:
        """{name: error} for the in-memory ``sources`` ({name: bytes}) that do not compile; writes nothing."""
        if not sources:
            return {}
        payload = {name: base64.b64encode(data).decode() for name, data in sources.items()}
        return self.run_json(CHECK_SCRIPT, payload=payload)

    def compile_files(self, paths: list) -> dict:
        """Write fresh bytecode for ``paths``; {path: error} for those that do not compile."""
        if not paths:
            return {}
        return self.run_json(COMPILE_SCRIPT, payload=list(paths))


def read_record(install: SglangInstall) -> list:
    """RECORD rows as (path relative to the install base, algorithm, urlsafe-base64 digest or '')."""
    if not install.record or not os.path.isfile(install.record):
        raise InstallError(
            f"sglang {install.version} at {install.package_dir} has no RECORD file; cannot verify it against the wheel"
        )
    with open(install.record, newline="", encoding="utf-8") as handle:
        text = handle.read()
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        path, digest = row[0], row[1] if len(row) > 1 else ""
        algorithm, value = digest.split("=", 1) if "=" in digest else ("", "")
        rows.append((path, algorithm, value))
    return rows


def _record_digest(path: str, algorithm: str) -> str | None:
    digest = file_digest(path, algorithm)
    if digest is None:
        return None
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def verify_record(install: SglangInstall) -> dict:
    """Compare the installed files with the hashes in RECORD; also list files RECORD does not know."""
    modified, missing, checked = [], [], 0
    recorded = set()
    for rel, algorithm, expected in read_record(install):
        path = os.path.normpath(os.path.join(install.base_dir, rel))
        recorded.add(path)
        if not expected:
            continue
        checked += 1
        actual = _record_digest(path, algorithm)
        if actual is None:
            missing.append(rel)
        elif actual != expected:
            modified.append(rel)
    unrecorded = []
    for directory, dirs, files in os.walk(os.path.join(install.base_dir, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != BYTECODE_DIR)
        for name in sorted(files):
            path = os.path.normpath(os.path.join(directory, name))
            if path not in recorded:
                unrecorded.append(os.path.relpath(path, install.base_dir))
    return {
        "record": install.record,
        "checked": checked,
        "modified": modified,
        "missing": missing,
        "unrecorded": unrecorded,
        "pristine": not (modified or missing or unrecorded),
    }


def record_sha256(value: str) -> str:
    """The hex sha256 of a RECORD digest (urlsafe base64 without padding)."""
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def _stat_key(path: str) -> list | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    # ctime and the inode change with every write and every reinstall, and cannot be set back by hand.
    return [found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino]


def _cached_sha256(path: str, rel: str, cache: dict) -> str | None:
    key = _stat_key(path)
    if key is None:
        cache.pop(rel, None)
        return None
    known = cache.get(rel)
    if known is not None and known[:4] == key:
        return known[4]
    digest = file_digest(path)
    if digest is None:
        return None
    cache[rel] = [*key, digest.hexdigest()]
    return cache[rel][4]


def source_differences(install: SglangInstall, cache: dict | None = None) -> dict:
    """Every file of the package that is not as the wheel's RECORD has it, by content.

    Returns {path relative to the install base: {"sha256": hex of the file now or None (missing),
    "pristine": hex RECORD gives or None (not in RECORD)}}; bytecode caches are left out. ``cache``
    ({path: [size, mtime_ns, ctime_ns, inode, sha256]}) spares hashing a file whose stat is unchanged; it is
    updated in place for the caller to keep.
    """
    cache = {} if cache is None else cache
    prefix = PACKAGE + "/"
    recorded = set()
    found = {}
    for rel, algorithm, expected in read_record(install):
        rel = os.path.normpath(rel)
        recorded.add(rel)
        if not expected or not rel.startswith(prefix):
            continue
        if algorithm != "sha256":
            raise InstallError(
                f"{install.record} gives {rel} a {algorithm} digest; only sha256 RECORDs (every wheel installer "
                "writes them) can be compared"
            )
        pristine = record_sha256(expected)
        actual = _cached_sha256(os.path.join(install.base_dir, rel), rel, cache)
        if actual != pristine:
            found[rel] = {"sha256": actual, "pristine": pristine}
    for directory, dirs, files in os.walk(os.path.join(install.base_dir, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != BYTECODE_DIR)
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(directory, name), install.base_dir)
            if rel in recorded or is_temp_leftover(name):
                continue
            actual = _cached_sha256(os.path.join(directory, name), rel, cache)
            if actual is not None:
                found[rel] = {"sha256": actual, "pristine": None}
    for rel in [rel for rel in cache if rel not in recorded and rel not in found]:
        del cache[rel]
    return found
