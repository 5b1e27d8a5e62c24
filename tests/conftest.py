"""Make the repository importable as ``ansible_collections.llmops.inference`` for pytest."""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TREE = os.path.join(_ROOT, "build", "collections")
_LINK = os.path.join(_TREE, "ansible_collections", "llmops", "inference")

if not os.path.islink(_LINK):
    os.makedirs(os.path.dirname(_LINK), exist_ok=True)
    os.symlink(_ROOT, _LINK)
if _TREE not in sys.path:
    sys.path.insert(0, _TREE)
