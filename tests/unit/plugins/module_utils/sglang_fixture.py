"""Installed-sglang stand-ins for unit tests: a bare venv with a small package and its .dist-info.

Two kinds: a synthetic ``sglang`` package (a few files, any content; never skips) and real files
extracted from the sglang 0.5.23 wheel with their RECORD rows copied verbatim (skips when the wheel
is absent). Both are located the real way: the venv's python runs importlib's find_spec.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import TargetPython
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import BackupStore
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_inputs import PatchSetInput
from ansible_collections.llmops.inference.plugins.module_utils.source_patcher import SourcePatcher
from ansible_collections.llmops.inference.plugins.module_utils.source_tree import SourceTree

# Where `make lab-wheels` (the lab image step) puts the wheel: tests/lab/labctl/image.py WHEEL_DIR.
WHEEL_DIR = Path(os.environ.get("LLMOPS_LAB_CACHE", "/var/cache/llmops-lab")) / "wheels"
WHEEL_VERSION = "0.5.23"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"


def run_command(args, data=None):
    """The subprocess equivalent of AnsibleModule.run_command for module_utils under test."""
    proc = subprocess.run(args, input=data, capture_output=True, text=True, cwd="/", check=False)
    return proc.returncode, proc.stdout, proc.stderr


class FakeVenv:
    """A venv without pip whose site-packages the tests fill."""

    def __init__(self, root: Path):
        venv.EnvBuilder(with_pip=False, symlinks=True).create(str(root))
        self.root = root
        self.python = str(root / "bin" / "python")
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        self.site = root / "lib" / version / "site-packages"

    def clear(self) -> None:
        for entry in self.site.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def install(self, files: dict, version: str = "0.0.1", record_rows: list | None = None) -> Path:
        """Write ``files`` ({path under site-packages: bytes}) plus a .dist-info for sglang ``version``."""
        for rel, data in files.items():
            target = self.site / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        dist_info = self.site / f"sglang-{version}.dist-info"
        dist_info.mkdir(exist_ok=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        rows = record_rows if record_rows is not None else [record_row(rel, data) for rel, data in files.items()]
        rows = [*rows, [f"sglang-{version}.dist-info/METADATA", "", ""], [f"sglang-{version}.dist-info/RECORD", "", ""]]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        (dist_info / "RECORD").write_text(out.getvalue())
        return self.site / "sglang"


def record_row(rel: str, data: bytes) -> list:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [rel, f"sha256={digest}", str(len(data))]


def wheel_path() -> Path | None:
    found = sorted(WHEEL_DIR.glob(f"sglang-{WHEEL_VERSION}-*.whl"))
    return found[0] if found else None


def wheel_files(members: list) -> tuple:
    """({path: bytes}, [RECORD rows]) for ``members`` of the real wheel; skips the test without it."""
    wheel = wheel_path()
    if wheel is None:
        pytest.skip(f"the sglang {WHEEL_VERSION} wheel is not in {WHEEL_DIR} (the lab image step downloads it)")
    with zipfile.ZipFile(wheel) as archive:
        files = {member: archive.read(member) for member in members}
        record = archive.read(f"sglang-{WHEEL_VERSION}.dist-info/RECORD").decode()
    rows = [row for row in csv.reader(io.StringIO(record)) if row and row[0] in files]
    return files, rows


SYNTHETIC_FILES = {
    "sglang/__init__.py": b'__version__ = "0.0.1"\n',
    "sglang/srt/__init__.py": b"",
    "sglang/srt/algos.py": (
        b"from enum import Enum, auto\n"
        b"\n"
        b"\n"
        b"class Algo(Enum):\n"
        b"    EAGLE = auto()\n"
        b"    NGRAM = auto()\n"
        b"    NONE = auto()\n"
        b"\n"
        b"\n"
        b"def names():\n"
        b"    return [member.name for member in Algo]\n"
    ),
    "sglang/srt/server.py": b"PORT = 30000\nHOST = '127.0.0.1'\n",
}

ALGOS_PATCH = b"""--- a/sglang/srt/algos.py
+++ b/sglang/srt/algos.py
@@ -5,3 +5,4 @@
     EAGLE = auto()
     NGRAM = auto()
     NONE = auto()
+    LLMOPS_DEMO = auto()
"""

SERVER_PATCH = b"""--- a/sglang/srt/server.py
+++ b/sglang/srt/server.py
@@ -1,2 +1,2 @@
-PORT = 30000
+PORT = 30001
 HOST = '127.0.0.1'
"""

NEW_MODULE_PATCH = b"""--- /dev/null
+++ b/sglang/srt/extra/demo.py
@@ -0,0 +1,2 @@
+def hello():
+    return "demo"
"""

BROKEN_SYNTAX_PATCH = b"""--- a/sglang/srt/server.py
+++ b/sglang/srt/server.py
@@ -1,2 +1,2 @@
-PORT = 30000
+PORT = = 30000
 HOST = '127.0.0.1'
"""


def make_patcher(python: str, backup_root, check_mode: bool = False):
    """A SourcePatcher wired the way the module wires it, for the sglang of ``python``."""
    target = TargetPython(run_command, python)
    install = target.locate()
    tree = SourceTree(install.base_dir, install.package_dir)
    return SourcePatcher(install, BackupStore(str(backup_root)), tree, target, check_mode=check_mode)


def patch_set(name: str, *patches: bytes, replacements=()):
    labels = [(f"{index:04d}-{name}.diff", data) for index, data in enumerate(patches, 1)]
    return PatchSetInput(name, labels, [(dest, dest.rsplit("/", 1)[-1], data) for dest, data in replacements])


def snapshot(site: Path) -> dict:
    """Every source file under the sglang package as {relative path: bytes} (bytecode caches left out)."""
    root = site / "sglang"
    return {
        str(path.relative_to(site)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def algos_request(venv: FakeVenv, work: Path) -> dict:
    """A fresh synthetic sglang in ``venv`` and the source_patch options that apply ALGOS_PATCH to it as ``demo``
    (the patch file and the backups under ``work``)."""
    venv.clear()
    venv.install(SYNTHETIC_FILES)
    (work / "algos.diff").write_bytes(ALGOS_PATCH)
    return {
        "python": venv.python,
        "name": "demo",
        "patches": [str(work / "algos.diff")],
        "backup_root": str(work / "backups"),
    }
