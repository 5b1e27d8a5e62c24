# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the deploy playbook reads and writes on a host in one round trip; run as `python -c` (standard library).

read PATHS DOCUMENTS BACKUP_ROOT
    PATHS: a JSON list of files to checksum; DOCUMENTS: a JSON object name -> path of JSON files to read.
    Prints {"checksums": {path: sha256 or null}, "documents": {name: object or null}, "backups_digest": ...}.
write RECORD_PATH RECORD BACKUP_ROOT
    Writes the JSON object RECORD, with the current backups_digest added, to RECORD_PATH (mode 0600, atomically).

backups_digest is a digest of every sglang_patch backup manifest under BACKUP_ROOT: any apply, restore or
interrupted run since changes it, so a record with the same digest means the sources' patch state is the
recorded one.
"""

import hashlib
import json
import os
import sys
import tempfile


def read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def sha256(path):
    data = read_bytes(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def document(path):
    data = read_bytes(path)
    return None if data is None else json.loads(data)


def backups_digest(root):
    digest = hashlib.sha256()
    try:
        backups = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    except FileNotFoundError:
        backups = []
    for name in backups:
        digest.update(json.dumps([name, sha256(os.path.join(root, name, "manifest.json"))]).encode())
    return digest.hexdigest()


def read(paths, documents, root):
    return {
        "checksums": {path: sha256(path) for path in json.loads(paths)},
        "documents": {name: document(path) for name, path in json.loads(documents).items()},
        "backups_digest": backups_digest(root),
    }


def write(path, record, root):
    record = dict(json.loads(record), backups_digest=backups_digest(root))
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".record-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=2, sort_keys=True)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)
    return {"changed": True, "record": record}


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    print(json.dumps({"read": read, "write": write}[command](*arguments)))
