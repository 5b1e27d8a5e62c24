#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: deploy_record
short_description: Read and write what the last deploy left on an SGLang host, and the verdicts taken from it
version_added: 0.1.0
description:
  - The deploy record of a unit (C(<root>/<name>.json), mode 0600) holds what the last successful deploy step
    of C(llmops.inference.deploy) left on the host - a digest of the deploy's inputs, the unit and environment
    files' sha256, the sources' patch state and sglang version, the current known-good snapshot's time and a
    digest of the C(sglang_patch) backups.
  - O(state=read) reads, in one module run, the host's state - the checksums of O(unit_path) and O(env_path),
    both known-good manifests of O(known_good_root) (summarised), the record, and the digest of the backups
    in O(backup_root) now - and the verdicts the fleet playbooks take from it - RV(sources_as_deployed),
    RV(up_to_date) and, with O(way_back), where the host goes when a run must return it (RV(way_back)).
  - O(state=written) records the host's state as the last successful deploy step left it.
author:
  - llmops.inference contributors (@llmops)
attributes:
  check_mode:
    support: full
    description: O(state=read) changes nothing; O(state=written) reports whether the record would change.
  diff_mode:
    support: full
    description: O(state=written) shows the record before and after.
  idempotent:
    support: full
    description: Writing the same record again reports no change.
options:
  state:
    description: V(read) reads the host's state and the verdicts; V(written) records it.
    type: str
    choices: [read, written]
    default: read
  name:
    description: The unit's service name (without C(.service)), such as the C(name) of the
      C(llmops.inference.sglang_service) role's C(tasks_from=facts). The record is C(<root>/<name>.json).
    type: str
    required: true
  root:
    description: The directory of the deploy records.
    type: path
    default: /var/lib/llmops/deploy
  unit_path:
    description: The unit file (C(unit_path) of the role's facts).
    type: path
    required: true
  env_path:
    description: The unit's environment file (C(env_file) of the role's facts).
    type: path
    required: true
  known_good_root:
    description: The unit's known-good snapshot store (C(known_good_root) of the role's facts).
    type: path
    required: true
  backup_root:
    description: Where the C(sglang_patch) backups are (that role's C(sglang_patch_backup_root)).
    type: path
    default: /var/lib/llmops/sglang-backups
  fingerprint:
    description:
      - A digest of the deploy's inputs. O(state=read) compares it with the record's (RV(up_to_date)); O(state=written)
        records it.
    type: str
  serving:
    description: With O(state=read), whether the host serves now (a probe's verdict); a host that does not is never
      up to date.
    type: bool
    default: false
  snapshot:
    description:
      - With O(state=read), the known-good snapshot a run returns the host to - V(current) for a deploy, the
        C(rollback_snapshot) of a rollback. The sources are as deployed when they are at its patch state.
    type: str
    choices: [current, previous]
    default: current
  require_snapshot:
    description:
      - With O(state=read), fail when O(snapshot) does not exist (naming the snapshots there are) or cannot be
        restored whole (naming each copy or source object that is missing or does not match its checksum).
    type: bool
    default: false
  way_back:
    description:
      - With O(state=read), where a run returns the host. V(deploy) - where a failed deploy would take it (the
        current snapshot). V(rollback) - where C(llmops.inference.rollback) takes it (O(snapshot), or the
        sources to the state before O(backup_id)). V(deploy_failed) - a host whose deploy failed, after the fact
        (the snapshot this run saved is not the one to return to). V(batch_revert) - a host of a failed batch
        that had succeeded (back to the snapshot it had before the run; not needed when the run saved none).
    type: str
    choices: [deploy, rollback, deploy_failed, batch_revert]
  backup_id:
    description: With O(way_back=rollback), return only the sources, to the state before this backup.
    type: str
    default: ""
  before:
    description:
      - With O(way_back=deploy_failed) or O(way_back=batch_revert), the host's state before the run as the
        preflight recorded it - C(known_good) (this module's RV(known_good)), C(patch_state) and
        C(sources_cannot_return).
    type: dict
    default: {}
  patch_state:
    description: With O(state=written), the sources' patch state id after the step.
    type: str
  sglang_version:
    description: With O(state=written), the installed sglang version.
    type: str
notes:
  - The fleet playbooks use it; nothing else needs to.
seealso:
  - module: llmops.inference.known_good
  - module: llmops.inference.source_patch
"""

EXAMPLES = r"""
- name: Read the host's state and whether a deploy would change it
  llmops.inference.deploy_record:
    name: sglang
    unit_path: /etc/systemd/system/sglang.service
    env_path: /etc/llmops/sglang.env
    known_good_root: /var/lib/llmops/known-good/sglang
    fingerprint: "{{ inputs_digest }}"
    serving: "{{ probe.healthy }}"
    way_back: deploy
  register: host_state

- name: Read where a rollback to the previous snapshot takes the host, failing when it cannot be restored whole
  llmops.inference.deploy_record:
    name: sglang
    unit_path: /etc/systemd/system/sglang.service
    env_path: /etc/llmops/sglang.env
    known_good_root: /var/lib/llmops/known-good/sglang
    snapshot: previous
    require_snapshot: true
    way_back: rollback
  register: rollback_state

- name: Record what the deploy step left, with the unit's name and paths from the roles' facts (tasks_from=facts)
  llmops.inference.deploy_record:
    state: written
    name: "{{ sglang_service_facts.name }}"
    unit_path: "{{ sglang_service_facts.unit_path }}"
    env_path: "{{ sglang_service_facts.env_file }}"
    known_good_root: "{{ sglang_service_facts.known_good_root }}"
    backup_root: "{{ sglang_patch_facts.backup_root }}"
    fingerprint: "{{ inputs_digest }}"
    patch_state: "{{ sglang_patch_state_id }}"
    sglang_version: 0.5.23
"""

RETURN = r"""
unit_sha256:
  description: The unit file's sha256 (null when absent).
  returned: always
  type: str
env_sha256:
  description: The environment file's sha256 (null when absent).
  returned: always
  type: str
known_good:
  description:
    - The C(current) and C(previous) snapshots (null when absent), each with C(saved_at), C(verified_at),
      C(patch_state_id), C(sources_recorded), C(sources_digest), C(sources_in_place) (whether the files its sources
      changed still have the recorded content; null when it recorded none) and C(files) (name to sha256).
  returned: always
  type: dict
record:
  description: The record of the last successful deploy step (null when there is none); with O(state=written), the
    record as written.
  returned: always
  type: dict
backups_digest:
  description: A digest of every sglang_patch backup manifest now.
  returned: always
  type: str
sources_as_deployed:
  description: No backup was made or undone since the record, the record names O(snapshot) and its patch state, and
    the files the snapshot's sources changed still have the content it recorded.
  returned: with O(state=read)
  type: bool
up_to_date:
  description: Serving, and the inputs, unit and environment files, snapshot and sources all as the record says.
  returned: with O(state=read)
  type: bool
way_back:
  description: With O(way_back), where the host goes.
  returned: with O(way_back)
  type: dict
  contains:
    needed:
      description: Whether the host needs returning at all (a reverted host whose run saved no snapshot does not).
      type: bool
    snapshot:
      description: The snapshot whose unit files to put back (C(current) or C(previous)), or empty for none.
      type: str
    sources_target:
      description: The C(llmops.inference.source_patch) options (O(state=restored)) that return the sources -
        C(known_good_snapshot), C(target_state_id) or C(backup_id); empty to leave them.
      type: dict
    sources_label:
      description: Where the sources go, in words.
      type: str
    action:
      description: C(restart) (the gated chain), C(restart_if_changed) (when something was put back or the host
        does not serve), or C(stop) (no known-good state to return to).
      type: str
msg:
  description: What was read or written.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.deploy_record import (  # noqa: E402
    DEFAULT_ROOT,
    REQUEST_ERRORS,
    WAYS_BACK,
    handle,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import (  # noqa: E402
    DEFAULT_ROOT as DEFAULT_BACKUP_ROOT,
)

ARGUMENT_SPEC = dict(
    state=dict(type="str", default="read", choices=["read", "written"]),
    name=dict(type="str", required=True),
    root=dict(type="path", default=DEFAULT_ROOT),
    unit_path=dict(type="path", required=True),
    env_path=dict(type="path", required=True),
    known_good_root=dict(type="path", required=True),
    backup_root=dict(type="path", default=DEFAULT_BACKUP_ROOT),
    fingerprint=dict(type="str", no_log=False),
    serving=dict(type="bool", default=False),
    snapshot=dict(type="str", default="current", choices=["current", "previous"]),
    require_snapshot=dict(type="bool", default=False),
    way_back=dict(type="str", choices=list(WAYS_BACK)),
    backup_id=dict(type="str", default=""),
    before=dict(type="dict", default={}),
    patch_state=dict(type="str"),
    sglang_version=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = handle(module.params, module.check_mode)
    except REQUEST_ERRORS as exc:
        module.fail_json(msg=str(exc), changed=False)
    diff = result.pop("diff", None)
    if module._diff and diff is not None:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
