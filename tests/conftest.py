"""Make the repository importable as ``ansible_collections.llmops.inference`` for pytest; shared fixtures."""

from __future__ import annotations

import os
import sys

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TREE = os.path.join(_ROOT, "build", "collections")
_LINK = os.path.join(_TREE, "ansible_collections", "llmops", "inference")

if not os.path.islink(_LINK):
    os.makedirs(os.path.dirname(_LINK), exist_ok=True)
    os.symlink(_ROOT, _LINK)
if _TREE not in sys.path:
    sys.path.insert(0, _TREE)


@pytest.fixture
def target_side_ansible(monkeypatch):
    """Run AnsibleModule code as it runs on a managed host, with no warnings left over from earlier tests.

    Importing controller code (``ansible.errors``, as filter plugins do) flips ``is_controller`` for the whole
    process, after which ``module.warn()`` goes to the controller's display instead of the module result.
    Warnings and deprecations are also collected process-wide and never cleared.
    """
    monkeypatch.setattr(ansible_internal, "is_controller", False)
    monkeypatch.setattr(ansible_warnings, "_global_warnings", {})
    monkeypatch.setattr(ansible_warnings, "_global_deprecations", {})
