"""Renders Jinja expressions with Ansible's own Templar, in an interpreter of its own, one request a line: the unit
tests of the roles' templates and of the playbooks' variables share it.

Ansible finds the collection's filters only through its collection finder, which must be installed before anything
imports ansible_collections (the other unit tests import it plainly), hence the separate interpreter. Import this
file by path (``sys.path``), not through a conftest.py: tests/e2e and tests/lab/tests have conftest.py files of
their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WORKER = """
import json, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=sys.argv[1:])._install()
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

def trusted(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return value

for request in sys.stdin:
    expression, variables = json.loads(request)
    try:
        templar = Templar(loader=DataLoader(), variables=trusted(variables))
        answer = {"value": templar.template(trust_as_template(expression))}
    except Exception as exc:
        answer = {"error": str(exc)}
    print(json.dumps(answer, default=str), flush=True)
"""


class RenderError(Exception):
    """The Templar refused the expression; the message is Ansible's."""


class TemplarWorker:
    """One worker interpreter; ``collections`` are the paths its collection finder searches (none: the builtin
    plugins only)."""

    def __init__(self, *collections: Path):
        self._proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, *map(str, collections)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def render(self, expression: str, variables: dict):
        self._proc.stdin.write(json.dumps([expression, variables]) + "\n")
        self._proc.stdin.flush()
        answer = json.loads(self._proc.stdout.readline())
        if "error" in answer:
            raise RenderError(answer["error"])
        return answer["value"]

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=30)

    def __enter__(self) -> TemplarWorker:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
