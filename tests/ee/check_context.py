"""Check the build context `ansible-builder create` wrote for execution-environment.yml (`make ee`).

No container engine is needed: this checks the Containerfile and the files it copies, and that
ansible-builder's introspection of the packaged collection asks for the collection's controller-side
Python dependencies (meta/ee-requirements.txt) and nothing else, such as the test tools of requirements.txt.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

COLLECTION_TARBALL = "_build/collections/llmops-inference.tar.gz"


def requirement_name(line: str) -> str | None:
    line = line.split("#", 1)[0].strip()
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
    return match.group(0).lower().replace("_", "-") if match else None


def containerfile_problems(context: Path, definition: dict) -> list[str]:
    containerfile = context / "Containerfile"
    if not containerfile.is_file():
        return [f"{containerfile}: not written"]
    text = containerfile.read_text(encoding="utf-8")
    deps = definition["dependencies"]
    expected = {
        "base image": f'ARG EE_BASE_IMAGE="{definition["images"]["base_image"]["name"]}"',
        "ansible-core pin": deps["ansible_core"]["package_pip"],
        "ansible-runner pin": deps["ansible_runner"]["package_pip"],
        "collection install": "ansible-galaxy collection install",
        "ansible check": "/output/scripts/check_ansible",
    }
    return [f"{containerfile}: no {what} ({needle!r})" for what, needle in expected.items() if needle not in text]


def collection_problems(context: Path, ee_requirements: Path, builder: str) -> list[str]:
    tarball = context / COLLECTION_TARBALL
    if not tarball.is_file():
        return [f"{tarball}: missing (the EE would not contain the collection)"]
    galaxy_requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text(encoding="utf-8"))
    names = [entry["name"] for entry in galaxy_requirements.get("collections", [])]
    problems = [] if "collections/llmops-inference.tar.gz" in names else [f"_build/requirements.yml lists {names}"]
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "ansible_collections" / "llmops" / "inference"
        target.mkdir(parents=True)
        with tarfile.open(tarball) as archive:
            # Our own build output; the "data" filter where this Python has it (3.11.4 and later).
            archive.extractall(target, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        manifest = json.loads((target / "MANIFEST.json").read_text(encoding="utf-8"))["collection_info"]
        if (manifest["namespace"], manifest["name"]) != ("llmops", "inference"):
            problems.append(f"{tarball}: holds {manifest['namespace']}.{manifest['name']}")
        result = subprocess.run([builder, "introspect", "--sanitize", tmp], capture_output=True, text=True, check=True)
    introspected = yaml.safe_load(result.stdout.split("---", 1)[1]) or {}
    wanted = {requirement_name(line) for line in ee_requirements.read_text(encoding="utf-8").splitlines()} - {None}
    found = {requirement_name(line) for line in introspected.get("python") or []} - {None}
    if found != wanted:
        problems.append(f"introspection asks for {sorted(found)}; {ee_requirements} declares {sorted(wanted)}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=Path, required=True, help="the directory given to ansible-builder create")
    parser.add_argument("--definition", type=Path, default=Path("execution-environment.yml"))
    parser.add_argument("--ee-requirements", type=Path, default=Path("meta/ee-requirements.txt"))
    parser.add_argument("--ansible-builder", default=str(Path(sys.executable).parent / "ansible-builder"))
    args = parser.parse_args()

    definition = yaml.safe_load(args.definition.read_text(encoding="utf-8"))
    problems = containerfile_problems(args.context, definition)
    problems += collection_problems(args.context, args.ee_requirements, args.ansible_builder)
    for problem in problems:
        print(f"ee: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"ee: {args.context / 'Containerfile'} and its context are complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
