#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: host_lock
short_description: Take, release or break the per-host lock that keeps two runs from interleaving
version_added: 0.2.0
description:
  - The lock is an C(flock) on O(path), held by a small detached process that records who holds it (the O(owner)
    given, its pid, since when and until when). The kernel drops an flock when its holder exits, however it exits,
    so nothing stays locked after a crash of the holder, and C(/run) is empty after a reboot.
  - O(state=present) waits up to O(timeout) seconds for the lock and returns its RV(token); another run that holds
    it makes the task fail naming that holder.
  - The lock lives as long as the run that took it, and no longer. Its holder keeps it while the run renews it
    (every O(renew_period) seconds) and lets go O(renew_period) + O(renew_margin) seconds after the last renewal.
    The run's liveness is the controller's; this module's action plugin starts a keeper process on the controller,
    beside the C(ansible-playbook) (or C(ansible)) process of the run, that renews the lock over the host's
    connection every O(renew_period) seconds while that process lives, lets the lock go at once when it is gone
    (killed, crashed, ended without releasing), and stops when the lock is released or lost. A run killed with
    C(kill -9), a controller that dies, or a host the controller no longer reaches therefore blocks others for at
    most O(renew_period) + O(renew_margin) seconds; a run whose restart takes hours keeps its lock for hours.
  - O(state=present) with O(token) renews the lock held with that token, and fails when the run no longer holds it
    (released, broken, or let go after missed renewals).
  - O(state=absent) with O(token) releases the lock this run holds (a lock held with another token is left alone);
    with O(force=true) it breaks the lock, whoever holds it. Either is done when the holder process has exited (at
    most 10 s after it is told to let go); a run waiting for the lock takes it at that moment, which is the normal
    case and not a failure of the release.
author:
  - llmops.inference contributors (@llmops)
requirements:
  - Linux.
attributes:
  check_mode:
    support: full
    description: Reports whether the lock is free and what would be done; takes, releases and breaks nothing.
  diff_mode:
    support: none
    description: The lock has no content worth a diff.
  idempotent:
    support: full
    description:
      - Taking and releasing change nothing that outlasts the run, so they report C(changed=false); breaking a
        held lock reports C(changed=true).
options:
  path:
    description: The lock file, such as C(/run/lock/llmops-NAME.lock); its directory is created.
    type: path
    required: true
  state:
    description: C(present) takes the lock, C(absent) releases (O(token)) or breaks (O(force)) it.
    type: str
    choices: [present, absent]
    default: present
  owner:
    description: Who takes the lock (controller, user, play, ...), recorded and shown to a run that has to wait.
    type: dict
    default: {}
  timeout:
    description: Seconds to wait for another holder to let go.
    type: float
    default: 600
  renew_period:
    description: How often the run renews the lock, in seconds.
    type: float
    default: 30
  renew_margin:
    description:
      - Seconds, beyond O(renew_period), that the lock outlives its last renewal; they cover a slow controller or
        connection. A killed run blocks others at most O(renew_period) + O(renew_margin) seconds.
    type: float
    default: 60
  keep:
    description:
      - With O(state=present), whether the run keeps the lock renewed for as long as it lives (see the description).
      - V(false) takes a lock that nobody renews, so that it ends O(renew_period) + O(renew_margin) seconds after it
        is taken, or when it is released or broken; for fencing a host by hand for a while with ad-hoc C(ansible),
        whose run ends as soon as the lock is taken.
    type: bool
    default: true
  token:
    description:
      - With O(state=absent), the RV(token) the lock was taken with, to release it.
      - With O(state=present), renew the lock held with this token (see the description).
    type: str
  force:
    description: With O(state=absent) and no O(token), break the lock whoever holds it.
    type: bool
    default: false
seealso:
  - module: llmops.inference.sglang_restart
    description: Takes this lock itself, or checks the one a caller holds (given as its C(lock.token)).
"""

EXAMPLES = r"""
- name: Take the host lock across configuration and restart
  llmops.inference.host_lock:
    path: /run/lock/llmops-sglang-qwen.lock
    owner: {play: "{{ ansible_play_name }}", user: "{{ lookup('ansible.builtin.env', 'USER') }}"}
    timeout: 600
  register: lock

- name: Renew it (the action plugin's keeper does this while the run lives)
  llmops.inference.host_lock:
    path: /run/lock/llmops-sglang-qwen.lock
    token: "{{ lock.token }}"

- name: Release it
  llmops.inference.host_lock:
    path: /run/lock/llmops-sglang-qwen.lock
    state: absent
    token: "{{ lock.token }}"

- name: Fence a host by hand for an hour (ad-hoc ansible ends at once, so nobody renews this lock)
  llmops.inference.host_lock:
    path: /run/lock/llmops-sglang-qwen.lock
    owner: {user: alice, why: maintenance}
    keep: false
    renew_margin: 3600

- name: Break a lock left by a run that was killed
  llmops.inference.host_lock:
    path: /run/lock/llmops-sglang-qwen.lock
    state: absent
    force: true
"""

RETURN = r"""
msg:
  description: What was done.
  returned: always
  type: str
  sample: acquired /run/lock/llmops-sglang-qwen.lock after 0.0 s
token:
  description: The token to release the lock with (empty in check mode).
  returned: with O(state=present)
  type: str
  sample: 3f2a9c0e4b7d4e1fa1c2b3d4e5f60718
pid:
  description: The holder process.
  returned: with O(state=present), outside check mode
  type: int
pid_start:
  description: When the holder process started (clock ticks after boot), so that a release never signals another
    process that reused its pid.
  returned: with O(state=present), outside check mode
  type: str
acquired_at:
  description: When the lock was taken (UTC).
  returned: with O(state=present), outside check mode
  type: str
  sample: "2025-01-01T10:00:00Z"
renew_period:
  description: How often the run renews the lock (seconds).
  returned: with O(state=present), outside check mode, when the lock is taken
  type: float
renew_margin:
  description: Seconds the lock outlives its last renewal, beyond the period.
  returned: with O(state=present), outside check mode, when the lock is taken
  type: float
keeper:
  description: The pid of the controller process that renews the lock while the run lives.
  returned: with O(state=present), outside check mode, when the lock is taken
  type: int
waited_s:
  description: Seconds waited for the lock.
  returned: with O(state=present), outside check mode
  type: float
held:
  description: Whether the lock is held (by this run, or in check mode by anyone).
  returned: with O(state=present)
  type: bool
holder:
  description: What the lock file says about the holder that made the task fail, or the current one in check mode.
  returned: when another run holds the lock
  type: dict
released:
  description: Whether this run let go of the lock.
  returned: with O(state=absent)
  type: bool
broken:
  description: The holder whose lock was broken.
  returned: with O(force=true), when a lock was broken
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.host_lock import (  # noqa: E402
    LockBusy,
    LockError,
    LockRequest,
    manage,
)

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    owner=dict(type="dict", default={}),
    timeout=dict(type="float", default=600),
    renew_period=dict(type="float", default=30),
    renew_margin=dict(type="float", default=60),
    keep=dict(type="bool", default=True),
    token=dict(type="str", no_log=False),
    force=dict(type="bool", default=False),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        request = LockRequest(
            period=params["renew_period"],
            margin=params["renew_margin"],
            **{name: params[name] for name in ("state", "owner", "timeout", "token", "force")},
        )
        result = manage(params["path"], request, module.check_mode)
    except LockBusy as exc:
        module.fail_json(msg=str(exc), holder=exc.holder, changed=False)
    except (LockError, OSError, ValueError) as exc:
        module.fail_json(msg=str(exc), changed=False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
