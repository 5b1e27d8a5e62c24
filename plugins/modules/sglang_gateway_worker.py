#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gateway_worker
short_description: Membership of one SGLang worker on every replica of an SGLang gateway
version_added: 0.1.0
description:
  - Makes one worker (an SGLang engine's base URL) present on, or absent from, every gateway in O(gateways). Gateway
    replicas do not share their worker registry, so each one is told.
  - Every gateway is read first. When one cannot be used (unreachable, no answer within O(timeout), a refused API
    key, not a gateway), or when O(min_healthy) refuses a removal, the task fails naming each gateway and why, and
    nothing is changed on any gateway. With O(unreachable=warn) a gateway that cannot be reached (no connection, no
    answer within O(timeout)) is left aside instead, with a warning naming it, and the others are changed.
  - A gateway that stops answering after it accepted the removal routes nothing to the worker any more; it is left
    aside with a warning (O(state=absent) is not failed for it).
  - O(state=present) adds the worker to each gateway that does not list it (one that still lists it as draining,
    from a removal a moment before, first drops that entry) and, with O(wait), waits until every gateway lists it
    as healthy. O(state=absent) removes it from each gateway that lists it and, with O(wait), waits
    until it is gone from every one. A gateway still not there after O(wait_timeout) is named with what it reports.
  - The API of each gateway is detected from its answers, once per gateway. The SGLang Model Gateway (C(smg)) and
    C(sglang-router) from 0.2 list workers at C(GET /workers), queue an add with C(POST /workers) (the worker shows
    up once it passed the gateway's health check) and a removal with C(DELETE /workers/{id}) (smg drains the worker
    for 5 s first). C(sglang-router) before 0.2 lists at C(GET /list_workers) and adds and removes with C(POST
    /add_worker?url=) and C(POST /remove_worker?url=).
author:
  - llmops.inference contributors (@llmops)
attributes:
  check_mode:
    support: full
    description: Reads every gateway, applies the O(min_healthy) rule, and reports what would change; changes nothing.
  diff_mode:
    support: full
    description: The worker URLs of each gateway before and after.
  idempotent:
    support: full
    description: C(changed) only when an add or a removal was requested from at least one gateway.
options:
  gateways:
    description:
      - Base URLs of the gateway replicas (C(http://host:port)), each listed once.
    type: list
    elements: str
    required: true
  worker_url:
    description:
      - The worker's base URL as the gateways should reach it (C(http://host:port)), for example
        C(http://10.0.0.5:30000). Compared with what the gateways list without a trailing slash and with the
        scheme and host in lower case.
    type: str
    required: true
    aliases: [worker]
  state:
    description:
      - V(present) to add the worker where it is missing, V(absent) to remove it where it is listed.
    type: str
    choices: [present, absent]
    default: present
  min_healthy:
    description:
      - With O(state=absent), refuse (on every gateway, before removing anything) when removing the worker would leave
        a gateway with fewer than this many other healthy workers serving the worker's model.
      - Only a worker the gateway reports healthy and ready counts, on both sides of the rule; removing a worker the
        gateway already reports unhealthy or draining takes nothing away and is not refused. The older
        C(sglang-router) reports no health or model; every worker it lists counts as a healthy worker of one model.
      - C(0) switches the rule off.
    type: int
    default: 1
  api_key:
    description:
      - "The gateway's C(--api-key), sent to every gateway as C(Authorization: Bearer <key>)."
    type: str
  worker_api_key:
    description:
      - The worker's own API key (its C(--api-key)), handed to smg with the add so that the gateway can
        health-check the worker and read its model. smg sends it to the worker on the gateway's own requests and on
        proxied requests that carry no C(Authorization) header; a client's own header is passed through unchanged,
        so behind a gateway with an API key the workers must use that same key (a warning says so when the two
        differ). The older C(sglang-router) uses its own C(--api-key) toward workers and ignores this (with a
        warning).
    type: str
  validate_certs:
    description:
      - Verify the TLS certificate of an C(https) gateway.
    type: bool
    default: true
  timeout:
    description:
      - Seconds each HTTP request to a gateway may take.
    type: float
    default: 10
  wait:
    description:
      - Wait until every gateway reports the worker healthy (O(state=present)) or no longer lists it
        (O(state=absent)). Without it the requests are made and the gateways' current state is returned.
      - The older C(sglang-router) answers an add only once the worker is healthy, so an add there always waits.
    type: bool
    default: true
  wait_timeout:
    description:
      - Seconds to wait, from the first change, for every gateway to agree.
    type: float
    default: 120
  poll_interval:
    description:
      - Seconds between two readings of the gateways while waiting.
    type: float
    default: 0.5
  unreachable:
    description:
      - What a gateway that cannot be reached does to the task. V(fail) fails it (before any change when the first
        reading finds it). V(warn) leaves that gateway aside with a warning naming it, and changes the others; its
        entry in RV(gateways) has C(action=unreachable) and the reason in C(problem).
      - A gateway that answers but cannot be used (a refused API key, not a gateway) fails the task either way.
    type: str
    choices: [fail, warn]
    default: fail
notes:
  - The module talks HTTP only; run it on any host that reaches the gateways (often C(delegate_to) a gateway host
    or the controller, with C(run_once)).
  - The O(min_healthy) rule reads each gateway once before acting. Remove the workers of one model one task at a
    time (C(serial), C(throttle)), or two removals running at once can each see the other worker as healthy.
  - A gateway restart forgets the workers added through its API (only C(--worker-urls) come back); add them again
    after restarting a gateway.
seealso:
  - name: SGLang Model Gateway
    description: The gateway, its worker API and its options.
    link: https://docs.sglang.ai/advanced_features/sgl_model_gateway.html
  - ref: llmops.inference.sglang_gateway role
    description: The role that installs and runs the gateway replicas this module manages.
"""

EXAMPLES = r"""
- name: Take the engine out of both gateway replicas before restarting it
  llmops.inference.sglang_gateway_worker:
    gateways:
      - http://gw-a.example:30080
      - http://gw-b.example:30080
    worker_url: "http://{{ ansible_host }}:30000"
    state: absent
    min_healthy: 1
    api_key: "{{ vault_gateway_api_key }}"
  delegate_to: localhost

- name: Put it back and wait until both replicas route to it
  llmops.inference.sglang_gateway_worker:
    gateways: "{{ sglang_gateways }}"
    worker_url: "http://{{ ansible_host }}:30000"
    api_key: "{{ vault_gateway_api_key }}"
    worker_api_key: "{{ vault_gateway_api_key }}"
    wait_timeout: 300
  delegate_to: localhost

- name: What would change (check mode with diff)
  llmops.inference.sglang_gateway_worker:
    gateways: "{{ sglang_gateways }}"
    worker_url: http://10.0.0.5:30000
    state: absent
  check_mode: true
  diff: true
  delegate_to: localhost
"""

RETURN = r"""
msg:
  description: One line saying what was done, or why it failed.
  returned: always
  type: str
  sample: "http://10.0.0.5:30000 added to 2 of 2 gateway(s)"
worker_url:
  description: The worker's URL as the gateways were told it.
  returned: when the options were valid
  type: str
  sample: http://10.0.0.5:30000
state:
  description: The requested state.
  returned: when the options were valid
  type: str
  sample: absent
gateways:
  description: Each gateway, in the order given, after the operation (predicted in check mode).
  returned: when every gateway could be read
  type: list
  elements: dict
  contains:
    url:
      description: The gateway's URL.
      type: str
      sample: http://gw-a.example:30080
    api:
      description: The API the gateway answered, C(smg) (C(/workers)) or C(legacy) (C(/add_worker), C(/list_workers)).
      type: str
      sample: smg
    action:
      description: C(added), C(removed), C(add pending) (an add already queued there was waited for), C(removal
        pending) (already draining), C(would add), C(would remove) (check mode), C(unreachable) (left aside with
        O(unreachable=warn)) or C(none).
      type: str
      sample: added
    changed:
      description: Whether an add or a removal was requested from this gateway.
      type: bool
      sample: true
    present:
      description: Whether the gateway lists the worker.
      type: bool
      sample: true
    healthy:
      description: Whether the gateway reports the worker healthy and ready; null when it does not list it.
      type: bool
      sample: true
    status:
      description: The gateway's status of the worker (smg - C(ready), C(not_ready), C(failed), C(draining); the older
        router - C(listed)); null when it does not list it.
      type: str
      sample: ready
    model:
      description: The model the gateway says the worker serves.
      type: str
      sample: Qwen/Qwen3-8B
    worker_id:
      description: The gateway's id of the worker (smg - a UUID; the older router - the URL).
      type: str
      sample: 01a23329-dc7d-7258-902b-95a4d305de32
    waiting_for:
      description: What the gateway still reported when the wait ended unfinished, else null.
      type: str
      sample: "listed but not healthy (status not_ready)"
    problem:
      description: Why the gateway was left aside (C(action) is C(unreachable)), else null.
      type: str
      sample: "gateway http://gw-b.example:30080: cannot reach it (GET /workers: [Errno 111] Connection refused)"
    workers:
      description: Every worker the gateway lists, with C(url), C(id), C(model), C(healthy) and C(status).
      type: list
      elements: dict
      sample: [{"url": "http://10.0.0.6:30000", "id": "01a2...", "model": "Qwen/Qwen3-8B", "healthy": true,
                "status": "ready"}]
refused:
  description: With O(min_healthy), one line per gateway where the removal was refused.
  returned: when the removal was refused
  type: list
  elements: str
  sample: ["gateway http://gw-b.example:30080: it would leave 0 healthy worker(s) of model Qwen/Qwen3-8B (needs 1;
            healthy others: none)"]
unavailable:
  description: One line per gateway that could not be used.
  returned: when a gateway could not be used
  type: list
  elements: str
  sample: ["gateway http://gw-b.example:30080: cannot reach it (GET /workers: [Errno 111] Connection refused)"]
option:
  description: The option that was refused.
  returned: when an option is invalid
  type: str
  sample: worker_url
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.gateway import (  # noqa: E402
    ChangeMode,
    GatewayAccess,
    GatewaySet,
    Polling,
)
from ansible_collections.llmops.inference.plugins.module_utils.gateway_client import normalize_url  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.gateway_result import (  # noqa: E402
    GatewaysUnavailable,
    MembershipIncomplete,
    RemovalRefused,
)
from ansible_collections.llmops.inference.plugins.module_utils.module_support import (  # noqa: E402
    OptionError,
    fail_refused_option,
    refused_as,
)

ARGUMENT_SPEC = dict(
    gateways=dict(type="list", elements="str", required=True),
    worker_url=dict(type="str", required=True, aliases=["worker"]),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    min_healthy=dict(type="int", default=1),
    api_key=dict(type="str", no_log=True),
    worker_api_key=dict(type="str", no_log=True),
    validate_certs=dict(type="bool", default=True),
    timeout=dict(type="float", default=10),
    wait=dict(type="bool", default=True),
    wait_timeout=dict(type="float", default=120),
    poll_interval=dict(type="float", default=0.5),
    unreachable=dict(type="str", choices=["fail", "warn"], default="fail"),
)


def build_gateway_set(params: dict) -> GatewaySet:
    """The GatewaySet the options describe; refused options raise OptionError naming themselves."""
    with refused_as("worker_url"):
        normalize_url(params["worker_url"], "worker_url")
    with refused_as("min_healthy"):
        if params["min_healthy"] < 0:
            raise ValueError(f"min_healthy must be an integer >= 0, got {params['min_healthy']}")
    for option in ("timeout", "poll_interval"):
        with refused_as(option):
            if params[option] <= 0:
                raise ValueError(f"{option} must be greater than 0, got {params[option]:g}")
    with refused_as("wait_timeout"):
        if params["wait_timeout"] < 0:
            raise ValueError(f"wait_timeout must be 0 or more, got {params['wait_timeout']:g}")
    with refused_as("gateways"):
        return GatewaySet(
            params["gateways"],
            GatewayAccess(params["api_key"], params["timeout"], params["validate_certs"], params["worker_api_key"]),
            Polling(params["wait_timeout"], params["poll_interval"]),
        )


def summary(result) -> str:
    aside = [view.url for view in result.skipped]
    text = _summary(result)
    return f"{text}; left aside (cannot be reached): {', '.join(aside)}" if aside else text


def _summary(result) -> str:
    changed = [view for view in result.views if view.changed]
    total = len(result.views)
    if result.check_mode:
        verb = "would be added to" if result.state == "present" else "would be removed from"
        return f"{result.worker_url} {verb} {len(changed)} of {total} gateway(s)"
    if not changed:
        where = "on" if result.state == "present" else "absent from"
        return f"{result.worker_url} already {where} all {total} gateway(s)"
    verb = "added to" if result.state == "present" else "removed from"
    return f"{result.worker_url} {verb} {len(changed)} of {total} gateway(s)"


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        gateways = build_gateway_set(params)
    except OptionError as exc:
        fail_refused_option(module, exc)

    worker_url = normalize_url(params["worker_url"], "worker_url")
    base = dict(worker_url=worker_url, state=params["state"])
    mode = ChangeMode(wait=params["wait"], check_mode=module.check_mode, unreachable=params["unreachable"])
    try:
        if params["state"] == "present":
            result = gateways.add(worker_url, mode)
        else:
            result = gateways.remove(worker_url, mode, min_healthy=params["min_healthy"])
    except GatewaysUnavailable as exc:
        module.fail_json(msg=str(exc), changed=False, unavailable=[str(error) for error in exc.errors], **base)
    except RemovalRefused as exc:
        module.fail_json(msg=str(exc), changed=False, refused=exc.refusals, **base)
    except MembershipIncomplete as exc:
        for warning in exc.result.warnings:
            module.warn(warning)
        module.fail_json(msg=str(exc), **exc.result.to_dict())

    for warning in result.warnings:
        module.warn(warning)
    for view in result.skipped:
        module.warn(f"{worker_url} left aside on a gateway that cannot be reached: {view.error}")
    output = dict(result.to_dict(), msg=summary(result))
    if module._diff:
        output["diff"] = result.diff
    module.exit_json(**output)


if __name__ == "__main__":
    main()
