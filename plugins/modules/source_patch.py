#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: source_patch
short_description: Patch, restore and verify the installed SGLang sources, with checksummed backups
version_added: 0.1.0
description:
  - Locates the C(sglang) package installed for the interpreter O(python) without importing it, and records
    its version.
  - O(state=applied) applies a named patch set (unified diffs and whole-file replacements). Every hunk of every
    file is applied in memory first; if anything does not apply, nothing changes and the error names the patch
    file, the target file and the hunk. Before the first file changes, the originals and a manifest (for each
    file its path, sha256 before and after, and whether it existed; the sglang version, the package directory,
    the patch checksums) are written to a new backup directory C(<backup_root>/<UTC timestamp>-<name>/) (mode
    0700). Each file is replaced atomically (temporary file in the same directory, then rename; the mode is
    kept), the cached bytecode of each changed module is purged, and each changed module is compiled.
  - O(state=restored) returns the sources to the state a backup was taken in (O(backup_id), C(latest) by default)
    or to a patch state (O(target_state_id)). Newer applied backups are undone first, newest first. The original of
    every file is checked against the manifest's sha256 before anything is touched; an incomplete or damaged
    backup is refused with nothing changed. Files the patch set created are removed, bytecode is purged, and
    every restored file is checked again afterwards.
  - O(state=restored) with O(known_good_snapshot) makes the sources what that known-good snapshot recorded
    (C(llmops.inference.known_good)) - each file the snapshot holds gets its stored content, and every other file
    its content in the wheel, from any state the sources are in (another patch state, partly patched, or
    reinstalled from the wheel). Every content needed is found and checked against its sha256 first (the
    snapshot's objects, else the originals in the backups); when one is missing or damaged the module fails
    naming it and nothing changes. The files that change are backed up first like an apply (restoring that
    backup returns to the state before), bytecode is purged, the result is checked against the snapshot's
    checksums and compiled. A snapshot saved without its sources returns to the patch state it recorded, as
    O(target_state_id) does.
  - O(state=verified) changes nothing; it compares every installed sglang file with the sha256 in the
    distribution's C(RECORD) (the wheel's hashes) and lists modified, missing and unrecorded files.
  - The patch state id (RV(state_id)) is C(pristine) when no patch set is applied, else a stable hash of the
    sglang version and the checksums of the applied patch sets, so equal sources on different hosts have equal
    ids. It is C(interrupted) while a run's recovery is pending, and C(modified) when files differ from what the
    last backup recorded.
  - An interrupted apply or restore (the play was killed; the manifest was left C(pending) or C(restoring)) is
    rolled back to the backed-up originals at the start of the next apply or restore, which then carries on with
    its own request; this is reported in RV(recovered). Rolling back rather than completing needs nothing but
    the backup, so no original is lost whatever the next run asks for.
author:
  - llmops.inference contributors (@llmops)
requirements:
  - The interpreter O(python) runs Python 3.8 or later and has C(sglang) installed by pip (with its C(.dist-info)).
  - No C(patch) binary is needed; diffs are applied in Python.
attributes:
  check_mode:
    support: full
    description:
      - Computes everything a real run would (including the recovery of an interrupted run) in memory and writes
        nothing; C(changed) and the diff are exact.
  diff_mode:
    support: full
    description: Returns the unified diff of every file changed (or that would change).
  idempotent:
    support: full
    description:
      - Applying an applied patch set again, or restoring to the state the sources are in, reports no change.
options:
  python:
    description:
      - Absolute path of the Python interpreter that runs SGLang, such as C(/opt/sglang/venv/bin/python).
        The installed sglang is the one this interpreter imports (run with C(-E), outside any directory that
        could shadow it).
    type: path
    required: true
  state:
    description:
      - V(applied) applies the patch set O(name); V(restored) restores a backup or patch state; V(verified)
        only reports.
    type: str
    choices: [applied, restored, verified]
    default: applied
  name:
    description:
      - Name of the patch set (letters, digits, C(_), C(.), C(-); up to 64 characters). Used in backup ids.
      - Required with O(state=applied).
    type: str
  patches:
    description:
      - Unified diff files on the managed host, applied in this order. Paths inside a diff are relative to the
        directory that holds the C(sglang) package (site-packages), as in its C(RECORD), for example
        C(sglang/srt/speculative/spec_info.py); git's C(a/) and C(b/) prefixes are removed.
      - A path that is absolute, contains C(..), or resolves through symlinks outside the package directory is
        refused before anything changes.
    type: list
    elements: path
    default: []
  replacements:
    description:
      - Whole files to install, after the patches.
    type: list
    elements: dict
    default: []
    suboptions:
      src:
        description: The new content, a file on the managed host.
        type: path
        required: true
      dest:
        description: The file to replace or create, relative to site-packages like the paths in O(patches).
        type: str
        required: true
  exclusive:
    description:
      - V(true) makes the sources the pristine files plus this patch set only. Patch sets applied earlier are
        left out, in the same transaction, so one backup returns to the previous state.
      - V(false) applies this patch set on top of the ones already applied.
    type: bool
    default: true
  backup_id:
    description:
      - With O(state=restored), the backup to return to the state before, or V(latest) (the newest backup of this
        installation). An unknown id is refused with the list of available ids.
      - Mutually exclusive with O(target_state_id) and O(known_good_snapshot). Defaults to V(latest) when none is given.
    type: str
  target_state_id:
    description:
      - With O(state=restored), the patch state id to return to, such as V(pristine) or a RV(state_id) recorded
        earlier (a known-good snapshot). Refused when no sequence of undoing the applied backups reaches it.
    type: str
  known_good_snapshot:
    description:
      - With O(state=restored), the known-good snapshot whose sources to re-create, V(current) or V(previous).
      - Needs O(known_good_root). Mutually exclusive with O(backup_id) and O(target_state_id).
    type: str
    choices: [current, previous]
  known_good_root:
    description:
      - The snapshot store of the unit, such as the C(known_good_root) of the C(llmops.inference.sglang_service)
        role's C(tasks_from=facts).
    type: path
  backup_root:
    description: Directory holding the backups.
    type: path
    default: /var/lib/llmops/sglang-backups
  compile_check:
    description:
      - What to do when a patched module does not compile (checked in memory with O(python) before anything is
        written).
      - V(fail) refuses the patch set with nothing changed. V(warn) installs it anyway, warns, and lists the errors
        in RV(compile_errors) - for a deliberate test of the serving gate.
    type: str
    choices: [fail, warn]
    default: fail
  lock_timeout:
    description: Seconds to wait for another run on the same host (they hold a lock in O(backup_root)).
    type: int
    default: 60
notes:
  - Notify your service's restart when the module reports C(changed); a running server keeps the old code until it
    restarts.
  - A patch set found already applied without a backup record (for example after the backup directory was
    removed) is adopted - its originals are computed by reversing the diffs and recorded - with no change to
    the sources.
seealso:
  - name: Binary distribution format (RECORD)
    description: The hashes O(state=verified) compares with.
    link: https://packaging.python.org/en/latest/specifications/recording-installed-packages/
"""

EXAMPLES = r"""
- name: Prove that every sglang file matches the wheel
  llmops.inference.source_patch:
    python: /opt/sglang/venv/bin/python
    state: verified
  register: verified
  failed_when: not verified.verify.pristine

- name: Apply the example patch set (copied to the host beforehand)
  llmops.inference.source_patch:
    python: /opt/sglang/venv/bin/python
    name: eagle_lab
    patches:
      - /tmp/sglang_patch/0001-register-llmops-demo.diff
  register: patched
  notify: llmops_sglang_restart

- name: Show what a whole-file replacement on top of the applied patch sets would change, without changing anything
  llmops.inference.source_patch:
    python: /opt/sglang/venv/bin/python
    name: spec_info_hotfix
    exclusive: false
    replacements:
      - src: /tmp/sglang_patch/spec_info.py
        dest: sglang/srt/speculative/spec_info.py
  check_mode: true
  diff: true

- name: Return to the state before the newest backup
  llmops.inference.source_patch:
    python: /opt/sglang/venv/bin/python
    state: restored
    backup_id: latest

- name: Return to a known-good patch state
  llmops.inference.source_patch:
    python: /opt/sglang/venv/bin/python
    state: restored
    target_state_id: "{{ known_good.patch_state_id }}"

- name: Re-create the sources of the current known-good snapshot, from whatever state they are in
  llmops.inference.source_patch:
    python: /opt/sglang/venv/bin/python
    state: restored
    known_good_root: "{{ sglang_service_facts.known_good_root }}"
    known_good_snapshot: current
"""

RETURN = r"""
state_id:
  description: The patch state id at the end (in check mode, the one a real run would reach).
  returned: success
  type: str
  sample: 3f9a0c2be41d7765
state_id_before:
  description: The patch state id at the start.
  returned: success
  type: str
  sample: pristine
applied_sets:
  description: The patch sets applied at the end, oldest first.
  returned: success
  type: list
  elements: dict
  sample: [{name: eagle_lab, checksum: 9d1f...}]
backup_id:
  description:
    - With O(state=applied), the backup this run created (null when nothing changed, or in check mode).
    - With O(state=restored), the oldest backup undone; with O(known_good_snapshot), the backup this run
      created of the files it changed.
  returned: success
  type: str
  sample: 20261129T162130Z-eagle_lab
files:
  description: Files (relative to site-packages) whose content changed, or would change in check mode.
  returned: success
  type: list
  elements: str
  sample: [sglang/srt/speculative/spec_info.py]
recovered:
  description: Interrupted runs found and rolled back, each with C(backup_id), C(interrupted) (apply or restore),
    C(action) and C(files).
  returned: success
  type: list
  elements: dict
restored:
  description: Backups undone by O(state=restored), newest first.
  returned: when something was restored from backups
  type: list
  elements: str
compile_errors:
  description: Modules that do not compile, with the compiler's message.
  returned: success
  type: dict
  sample: {"sglang/srt/speculative/spec_info.py": "File \"...\", line 49 ... SyntaxError: invalid syntax"}
adopted:
  description: True when the patch set was found applied without a record and a backup was recorded for it.
  returned: when adopted
  type: bool
sglang:
  description: The installation found for O(python).
  returned: success
  type: dict
  contains:
    python:
      description: The interpreter.
      type: str
    python_version:
      description: Its version.
      type: str
      sample: 3.11.2
    version:
      description: The installed sglang version.
      type: str
      sample: 0.5.23
    package_dir:
      description: The sglang package directory.
      type: str
      sample: /opt/sglang/venv/lib/python3.11/site-packages/sglang
    base_dir:
      description: The directory paths are relative to (site-packages).
      type: str
    record:
      description: The distribution's RECORD file.
      type: str
backups:
  description: Every backup in O(backup_root), oldest first.
  returned: success
  type: list
  elements: dict
  contains:
    backup_id:
      description: Backup id (its directory name).
      type: str
    name:
      description: Patch set name.
      type: str
    state:
      description: C(pending), C(applied), C(restoring) or C(restored).
      type: str
    created:
      description: UTC creation time.
      type: str
    sglang_version:
      description: sglang version the backup belongs to.
      type: str
    package_dir:
      description: Package directory the backup belongs to.
      type: str
    state_id_before:
      description: Patch state before the apply; restoring the backup returns to it.
      type: str
    state_id_after:
      description: Patch state after the apply.
      type: str
    files:
      description: Files in the backup.
      type: list
      elements: str
    adopted:
      description: Whether the originals were computed by reversing the patch set.
      type: bool
verify:
  description: With O(state=verified), the comparison with RECORD.
  returned: when O(state=verified)
  type: dict
  contains:
    record:
      description: The RECORD file.
      type: str
    checked:
      description: Number of files with a hash in RECORD.
      type: int
    modified:
      description: Files whose sha256 differs from RECORD.
      type: list
      elements: str
    missing:
      description: Files in RECORD that do not exist.
      type: list
      elements: str
    unrecorded:
      description: Files in the package directory that RECORD does not list (bytecode caches excluded).
      type: list
      elements: str
    pristine:
      description: True when nothing is modified, missing or unrecorded.
      type: bool
drift:
  description: With O(state=verified), files whose content differs from what the last backup recorded.
  returned: when O(state=verified)
  type: list
  elements: str
interrupted:
  description: Backups of interrupted runs not yet rolled back; the next apply or restore rolls them back.
  returned: when O(state=verified)
  type: list
  elements: str
  sample: [20261129T162130Z-eagle_lab]
msg:
  description: What was done.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.module_support import command_runner  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import DEFAULT_ROOT  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.source_patch_request import (  # noqa: E402
    REQUEST_ERRORS,
    run,
)

ARGUMENT_SPEC = dict(
    python=dict(type="path", required=True),
    state=dict(type="str", default="applied", choices=["applied", "restored", "verified"]),
    name=dict(type="str"),
    patches=dict(type="list", elements="path", default=[]),
    replacements=dict(
        type="list",
        elements="dict",
        default=[],
        options=dict(src=dict(type="path", required=True), dest=dict(type="str", required=True)),
    ),
    exclusive=dict(type="bool", default=True),
    backup_id=dict(type="str"),
    target_state_id=dict(type="str"),
    known_good_snapshot=dict(type="str", choices=["current", "previous"]),
    known_good_root=dict(type="path"),
    backup_root=dict(type="path", default=DEFAULT_ROOT),
    compile_check=dict(type="str", default="fail", choices=["fail", "warn"]),
    lock_timeout=dict(type="int", default=60),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
        required_if=[("state", "applied", ["name"])],
        mutually_exclusive=[("backup_id", "target_state_id", "known_good_snapshot")],
        required_together=[("known_good_snapshot", "known_good_root")],
    )
    try:
        result, diff, warnings = run(module.params, command_runner(module, cwd="/"), module.check_mode)
    except REQUEST_ERRORS as exc:
        module.fail_json(msg=str(exc), changed=getattr(exc, "changed", False))
    for warning in warnings:
        module.warn(warning)
    if module._diff:
        result["diff"] = {"prepared": diff}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
