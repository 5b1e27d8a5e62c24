"""Bring a lab host's installed sglang package back to the wheel's files, run by the venv's python at a reset.

Each file under sglang/ that differs from the wheel (or is missing) is written again from it, each file the wheel
does not have is removed, with the bytecode of both, and the files written again are compiled as pip compiles
them. A `pip install --force-reinstall` of the wheel ends in the same state but rewrites and compiles all of its
4,700 sources: about 13 CPU-s per host, where a patch changes a handful of files.
"""

import base64
import csv
import glob
import hashlib
import os
import py_compile
import sys
import zipfile

SITE = "/opt/sglang/venv/lib/python3.11/site-packages"
PACKAGE = "sglang/"


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def bytecode_of(path: str) -> list:
    folder, name = os.path.split(path)
    return glob.glob(os.path.join(folder, "__pycache__", name[: -len(".py")] + ".*.pyc"))


def main() -> int:
    (wheel,) = glob.glob("/var/cache/llmops-lab/wheels/sglang-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        record_name = next(name for name in archive.namelist() if name.endswith(".dist-info/RECORD"))
        hashes = {row[0]: row[1] for row in csv.reader(archive.read(record_name).decode().splitlines()) if row}
        members = {name for name in archive.namelist() if name.startswith(PACKAGE) and not name.endswith("/")}
        written = []
        for name in sorted(members):
            target = os.path.join(SITE, name)
            try:
                with open(target, "rb") as installed:
                    if digest(installed.read()) == hashes[name]:
                        continue
            except FileNotFoundError:
                os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as restored:
                restored.write(archive.read(name))
            written.append(target)
    removed = []
    for root, dirs, files in os.walk(os.path.join(SITE, PACKAGE)):
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        removed += [
            os.path.join(root, name) for name in files if os.path.relpath(os.path.join(root, name), SITE) not in members
        ]
    for path in removed:
        os.remove(path)
    for path in written + removed:
        if path.endswith(".py"):
            for stale in bytecode_of(path):
                os.remove(stale)
    for root, _dirs, _files in os.walk(os.path.join(SITE, PACKAGE), topdown=False):
        if not os.listdir(root) and os.path.relpath(root, SITE) + "/" != PACKAGE:
            os.rmdir(root)  # a folder a patch added, or its emptied __pycache__
    for path in written:
        if path.endswith(".py"):
            py_compile.compile(path, doraise=False, quiet=2)
    print(f"sglang sources restored from {os.path.basename(wheel)}: {len(written)} written, {len(removed)} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
