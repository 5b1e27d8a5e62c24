# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Known-good snapshots of an SGLang unit: its unit file, drop-ins and environment file, with checksums.

``save`` copies the live files into ROOT/current after the probe gate passed; the snapshot it replaces
becomes ROOT/previous. Saving the same files and patch state again only records the new verification time.
``restore`` puts a snapshot's files back (drop-ins that the snapshot does not have are removed), ``show``
prints both manifests. Installed by the sglang_service role and run with the Python that Ansible uses on the
host; standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

EXIT_OK = 0
EXIT_ERROR = 2
SNAPSHOTS = ("current", "previous")
MANIFEST = "manifest.json"
FILES_DIR = "files"
# Snapshot entries whose content is compared to tell a new known-good state from the current one.
IDENTITY_KEYS = ("files", "patch_state_id")


class SnapshotError(Exception):
    pass


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def live_files(unit_file: str, dropin_dir: str, env_file: str) -> dict:
    """{snapshot name: {path, sha256, mode}} for the unit, its *.conf drop-ins and the environment file."""
    entries = {"unit": unit_file, "environment": env_file}
    if os.path.isdir(dropin_dir):
        for name in sorted(os.listdir(dropin_dir)):
            if name.endswith(".conf"):
                entries[f"dropins/{name}"] = os.path.join(dropin_dir, name)
    files = {}
    for key, path in entries.items():
        if not os.path.isfile(path):
            raise SnapshotError(f"{path} does not exist; nothing known-good to record")
        files[key] = {"path": path, "sha256": sha256(path), "mode": oct(os.stat(path).st_mode & 0o7777)}
    return files


def read_manifest(root: str, which: str) -> dict | None:
    try:
        with open(os.path.join(root, which, MANIFEST), encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def _write_json(path: str, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".manifest.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def save(root: str, unit_file: str, dropin_dir: str, env_file: str, meta: dict) -> dict:
    files = live_files(unit_file, dropin_dir, env_file)
    manifest = dict(meta, files=files, saved_at=now_iso())
    manifest["verified_at"] = manifest["saved_at"]
    current = read_manifest(root, "current")
    if current is not None and all(current.get(key) == manifest.get(key) for key in IDENTITY_KEYS):
        current["verified_at"] = manifest["verified_at"]
        _write_json(os.path.join(root, "current", MANIFEST), current)
        return {"changed": False, "rotated": False, "manifest": current, "msg": "current snapshot re-verified"}

    os.makedirs(root, mode=0o700, exist_ok=True)
    staging = tempfile.mkdtemp(dir=root, prefix=".new.")
    for key, entry in files.items():
        target = os.path.join(staging, FILES_DIR, key)
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        shutil.copy2(entry["path"], target)
        if sha256(target) != entry["sha256"]:
            raise SnapshotError(f"{entry['path']} changed while it was being saved; run the restart chain again")
    _write_json(os.path.join(staging, MANIFEST), manifest)

    previous = os.path.join(root, "previous")
    if current is not None:
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(os.path.join(root, "current"), previous)
    os.replace(staging, os.path.join(root, "current"))
    return {"changed": True, "rotated": current is not None, "manifest": manifest, "msg": "snapshot saved"}


def _install(source: str, path: str, mode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
    os.close(fd)
    shutil.copyfile(source, tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def restore(root: str, which: str, dropin_dir: str, check: bool) -> dict:
    manifest = read_manifest(root, which)
    if manifest is None:
        available = [name for name in SNAPSHOTS if read_manifest(root, name) is not None]
        raise SnapshotError(
            f"no known-good snapshot {which!r} under {root}; available: {', '.join(available) or 'none'}"
        )
    restored, removed = [], []
    for key, entry in sorted(manifest["files"].items()):
        path = entry["path"]
        if os.path.isfile(path) and sha256(path) == entry["sha256"]:
            continue
        restored.append(path)
        if not check:
            _install(os.path.join(root, which, FILES_DIR, key), path, int(entry["mode"], 8))
    kept = {entry["path"] for key, entry in manifest["files"].items() if key.startswith("dropins/")}
    if os.path.isdir(dropin_dir):
        for name in sorted(os.listdir(dropin_dir)):
            path = os.path.join(dropin_dir, name)
            if name.endswith(".conf") and path not in kept:
                removed.append(path)
                if not check:
                    os.unlink(path)
    changed = bool(restored or removed)
    return {
        "changed": changed,
        "restored": restored,
        "removed": removed,
        "manifest": manifest,
        "msg": f"{which} snapshot from {manifest.get('saved_at')}: {len(restored)} restored, {len(removed)} removed",
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    take = commands.add_parser("save", help="record the live files as the current known-good snapshot")
    take.add_argument("--root", required=True)
    take.add_argument("--unit-file", required=True)
    take.add_argument("--dropin-dir", required=True)
    take.add_argument("--env-file", required=True)
    take.add_argument("--meta", type=json.loads, default={}, help="JSON object stored in the manifest")
    back = commands.add_parser("restore", help="put a snapshot's files back")
    back.add_argument("--root", required=True)
    back.add_argument("--which", choices=SNAPSHOTS, default="current")
    back.add_argument("--dropin-dir", required=True)
    back.add_argument("--check", action="store_true", help="only report what would change")
    show = commands.add_parser("show", help="print the current and previous manifests")
    show.add_argument("--root", required=True)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "save":
            answer = save(args.root, args.unit_file, args.dropin_dir, args.env_file, args.meta)
        elif args.command == "restore":
            answer = restore(args.root, args.which, args.dropin_dir, args.check)
        else:
            answer = {name: read_manifest(args.root, name) for name in SNAPSHOTS}
            answer["changed"] = False
    except (SnapshotError, OSError) as exc:
        sys.stderr.write(f"known_good {args.command}: {exc}\n")
        sys.stdout.write(json.dumps({"failed": True, "msg": str(exc)}) + "\n")
        return EXIT_ERROR
    sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
