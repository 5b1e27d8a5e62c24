# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a source_patch run is asked for: a patch set to apply, a recorded source state to re-create, and the move
from one patch state to another.

Private to the llmops.inference collection; not a public API. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import sha256_bytes
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import PRISTINE, validate_name

COMPILE_FAIL, COMPILE_WARN = "fail", "warn"
INTERRUPTED_STATE = "interrupted"
MODIFIED_STATE = "modified"


class SourcePatchError(Exception):
    """A request that cannot be carried out; the message says why and what would be accepted."""


class PatchSetInput:
    """A named patch set: unified diffs applied in order, then whole-file replacements."""

    def __init__(self, name: str, patches: list, replacements: list = ()):
        self.name = validate_name(name)
        self.patches = list(patches)  # [(label, bytes)]
        self.replacements = list(replacements)  # [(dest, label, bytes)]
        if not self.patches and not self.replacements:
            raise ValueError(f"patch set {name} is empty: give at least one patch or replacement")

    @property
    def checksum(self) -> str:
        canonical = {
            "patches": [sha256_bytes(patch[1]) for patch in self.patches],
            "replacements": [[dest, sha256_bytes(data)] for dest, _label, data in self.replacements],
        }
        return sha256_bytes(json.dumps(canonical, sort_keys=True).encode())

    def ref(self) -> dict:
        return {"name": self.name, "checksum": self.checksum}

    def describe(self) -> dict:
        return {
            "name": self.name,
            "checksum": self.checksum,
            "patches": [{"name": label, "sha256": sha256_bytes(data)} for label, data in self.patches],
            "replacements": [
                {"dest": dest, "source": label, "sha256": sha256_bytes(data)} for dest, label, data in self.replacements
            ],
        }


@dataclass
class SourceTarget:
    """A recorded source state to re-create: every file that differs from the wheel's RECORD in it.

    ``files``: {path: {"sha256": content or None (absent), "pristine": RECORD's sha256 or None}};
    ``content(sha256)``: the stored bytes with that sha256, checked, or None.
    """

    label: str
    name: str
    files: dict
    state_id: str | None
    applied_sets: list
    sglang_version: str
    package_dir: str
    content: object

    @property
    def digest(self) -> str:
        return sha256_bytes(json.dumps(self.files, sort_keys=True).encode())

    def final_state(self) -> tuple:
        """(patch state id, applied sets) the sources are in once the target is reached."""
        if not self.files:
            return PRISTINE, []
        if self.state_id and self.state_id not in (PRISTINE, MODIFIED_STATE, INTERRUPTED_STATE, "unknown"):
            return self.state_id, list(self.applied_sets)
        # Sources no patch set accounts for (edited by hand, say): named by their content.
        return self.digest[:16], [{"name": self.name, "checksum": self.digest}]

    def describe(self) -> dict:
        return {"name": self.name, "checksum": self.digest, "target": self.label, "files": len(self.files)}


@dataclass
class Transition:
    """Where an apply starts from and what it leads to, in patch-set terms."""

    patch_set: PatchSetInput
    exclusive: bool
    state_before: str
    sets_before: list
    sets_after: list


def sha_of(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)
