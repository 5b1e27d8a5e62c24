#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: known_good
short_description: Read, restore and record the known-good snapshots of an SGLang unit
version_added: 0.1.0
description:
  - A known-good snapshot is what a host ran the last time its restart chain's probe gate passed - the unit file,
    its drop-ins, its environment file and the SGLang sources - kept under O(root) (the C(known_good_root) of the
    C(llmops.inference.sglang_service) role's C(tasks_from=facts)). The restart chain saves one each time its
    gate passes; the one it replaces becomes C(previous).
  - The snapshot records every installed sglang file that differs from the wheel's C(RECORD) (the patched,
    added and removed files) by sha256, and keeps their content and the wheel's original of each (from the
    C(sglang_patch) backups) in C(objects/<sha256>), so that C(llmops.inference.source_patch) can re-create its
    sources from any state.
  - O(state=read) returns both manifests.
  - O(state=restored) puts the unit file, drop-ins and environment file of O(snapshot) back (drop-ins the snapshot
    does not have are removed) and reports what the sources need in RV(sources). Every copy and source object
    of the snapshot is checked against its sha256 first; a snapshot that cannot be restored whole is refused,
    naming what is missing or damaged, and nothing changes. It does not reload systemd or restart anything.
  - O(state=saved) records the live files (and with O(python), the sources) as the C(current) snapshot, as the
    restart chain does after its gate passed. Saving the same state again only records the time it was verified
    again; a snapshot saved without its sources gains them.
  - 'Retention: two snapshots are kept. A save whose state differs from C(current) makes it C(previous) and
    drops the snapshot that was C(previous); then every object neither snapshot names is deleted. A rollback
    can target only C(current) and C(previous), so nothing it can reach is ever pruned.'
author:
  - llmops.inference contributors (@llmops)
attributes:
  check_mode:
    support: full
    description: Reports what O(state=restored) or O(state=saved) would change and writes nothing.
  diff_mode:
    support: full
    description:
      - O(state=restored) shows each unit file and drop-in it puts back or removes; the environment file is
        named without its content, which may hold the API key.
  idempotent:
    support: full
    description: Restoring a snapshot that is in place, or saving the state that is current, changes nothing.
options:
  root:
    description: The unit's snapshot store, such as C(/var/lib/llmops/known-good/sglang).
    type: path
    required: true
  state:
    description: V(read) reads; V(restored) puts a snapshot's unit files back; V(saved) records the live state.
    type: str
    choices: [read, restored, saved]
    default: read
  snapshot:
    description: With O(state=restored), which snapshot to put back.
    type: str
    choices: [current, previous]
    default: current
  dropin_dir:
    description: The unit's drop-in directory (C(dropin_dir) of the role's facts). Required with O(state=restored)
      and O(state=saved).
    type: path
  files:
    description:
      - With O(state=saved), the files to record by name, such as C(unit) the unit file and C(environment) its
        environment file; the C(*.conf) drop-ins of O(dropin_dir) are added.
    type: dict
    default: {}
  meta:
    description:
      - With O(state=saved), what else the manifest records, such as C(patch_state_id) and the probe's C(main_pid).
      - C(node_group_restart) names the group restart of a multi-node engine that passed; a save with another one
        is a new snapshot even when the files are the same, so that every member's C(previous) is the state of the
        same group restart.
    type: dict
    default: {}
  python:
    description:
      - The Python interpreter that runs SGLang, such as C(/opt/sglang/venv/bin/python).
      - With O(state=saved), the snapshot records the sources of the sglang it imports. With O(state=restored),
        RV(sources.differ) lists the files that differ from the snapshot's sources now.
    type: path
  backup_root:
    description: Where the C(sglang_patch) backups are; a snapshot takes the wheel's originals of its changed files
      from them.
    type: path
    default: /var/lib/llmops/sglang-backups
notes:
  - The C(llmops.inference.rollback) playbook uses O(state=restored), then C(llmops.inference.source_patch) with the
    options in RV(sources.source_patch), then the gated restart chain.
seealso:
  - module: llmops.inference.source_patch
  - module: llmops.inference.deploy_record
"""

EXAMPLES = r"""
- name: Read both snapshots
  llmops.inference.known_good:
    root: /var/lib/llmops/known-good/sglang
  register: snapshots

- name: Put back the unit files of the previous snapshot
  llmops.inference.known_good:
    root: /var/lib/llmops/known-good/sglang
    state: restored
    snapshot: previous
    dropin_dir: /etc/systemd/system/sglang.service.d
    python: /opt/sglang/venv/bin/python
  register: restored

- name: Then its sources, from whatever state they are in
  llmops.inference.source_patch:
    python: /opt/sglang/venv/bin/python
    state: restored
    known_good_root: /var/lib/llmops/known-good/sglang
    known_good_snapshot: previous
"""

RETURN = r"""
msg:
  description: What was done.
  returned: always
  type: str
current:
  description: With O(state=read), the manifest of the current snapshot (null when absent) - C(files) (name to
    C(path), C(sha256), C(mode)), C(patch_state_id), C(saved_at), C(verified_at), C(sources) and what the restart
    chain recorded (C(main_pid), C(gpu_memory_mib), C(model), C(speculative)).
  returned: with O(state=read)
  type: dict
previous:
  description: With O(state=read), the manifest of the previous snapshot (null when absent).
  returned: with O(state=read)
  type: dict
manifest:
  description: With O(state=restored) the manifest put back; with O(state=saved) the current manifest.
  returned: with O(state=restored) or O(state=saved)
  type: dict
restored:
  description: With O(state=restored), the files put back (or that would be).
  returned: with O(state=restored)
  type: list
  elements: str
removed:
  description: With O(state=restored), the drop-ins removed because the snapshot does not have them.
  returned: with O(state=restored)
  type: list
  elements: str
sources:
  description: With O(state=restored), what the snapshot recorded of the sources and what they need.
  returned: with O(state=restored)
  type: dict
  contains:
    recorded:
      description: Whether the snapshot holds its sources (false for one saved without them).
      type: bool
    patch_state_id:
      description: The patch state id the snapshot recorded.
      type: str
    state_id:
      description: The patch state the sglang_patch backups gave those sources when the snapshot was saved.
      type: str
    files:
      description: The files the snapshot's sources hold that differ from the wheel.
      type: list
      elements: str
    python:
      description: The interpreter whose sglang the snapshot recorded.
      type: str
    differ:
      description: With O(python), the files that differ from the snapshot's sources now (empty when they match).
      type: list
      elements: str
    installation:
      description: With O(python), why the installed sglang is not the one recorded (null when it is).
      type: str
    source_patch:
      description: The C(llmops.inference.source_patch) options that return the sources to the snapshot.
      type: dict
rotated:
  description: With O(state=saved), whether the snapshot that was current became previous.
  returned: with O(state=saved)
  type: bool
pruned:
  description: With O(state=saved), the objects and leftovers the retention rule removed.
  returned: with O(state=saved)
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.known_good import SNAPSHOTS, SnapshotError  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.known_good_request import handle  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.module_support import command_runner  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import InstallError  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import DEFAULT_ROOT  # noqa: E402

ARGUMENT_SPEC = dict(
    root=dict(type="path", required=True),
    state=dict(type="str", default="read", choices=["read", "restored", "saved"]),
    snapshot=dict(type="str", default="current", choices=list(SNAPSHOTS)),
    dropin_dir=dict(type="path"),
    files=dict(type="dict", default={}),
    meta=dict(type="dict", default={}),
    python=dict(type="path"),
    backup_root=dict(type="path", default=DEFAULT_ROOT),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
        required_if=[("state", "restored", ["dropin_dir"]), ("state", "saved", ["dropin_dir"])],
    )
    try:
        result = handle(module.params, command_runner(module, cwd="/"), module.check_mode)
    except (SnapshotError, InstallError, OSError) as exc:
        module.fail_json(msg=str(exc), changed=False)
    diff = result.pop("diff", None)
    if module._diff and diff:
        result["diff"] = diff
    for warning in result.pop("warnings", []):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
