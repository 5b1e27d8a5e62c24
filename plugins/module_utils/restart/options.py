# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options of sglang_restart.

ARGUMENT_SPEC is the one place each option and its default is written; the module passes it to AnsibleModule, and
:func:`parse_chain_options` builds ChainOptions from the parameters AnsibleModule validated against it (every option
present, defaults applied), with the checks an argument spec cannot make.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ansible_collections.llmops.inference.plugins.module_utils.gateway import (
    GATEWAY_SCHEMES,
    UNREACHABLE_CHOICES,
    UNREACHABLE_FAIL,
    normalize_url,
)
from ansible_collections.llmops.inference.plugins.module_utils.module_support import OptionError
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import (
    ProbeInputError,
    ProbeSettings,
    gate_probe_spec,
)
from ansible_collections.llmops.inference.plugins.module_utils.reference_settings import (
    REFERENCE_SPEC,
    ReferenceInputError,
    parse_reference_options,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang import server_argument_spec, validate_url
from ansible_collections.llmops.inference.plugins.module_utils.systemd import normalize_unit_name

# How often the chain reads the unit while it waits: one `systemctl show` (a few ms) per poll.
POLL_S = 0.1
# The steps of a group restart, in the order the members run them (``all``: the whole chain, one host on its own).
PHASE_ALL = "all"
PHASE_STOP = "stop"
PHASE_START = "start"
PHASE_GATE = "gate"
PHASES = (PHASE_ALL, PHASE_STOP, PHASE_START, PHASE_GATE)

ARGUMENT_SPEC = dict(
    server_argument_spec(),
    unit=dict(type="str", required=True),
    gpus=dict(type="list", elements="str", default=[]),
    ready_timeout=dict(type="float", default=1260),
    ready_when_active=dict(type="bool", default=False),
    stability_window=dict(type="float", default=5),
    soak=dict(type="int", default=3),
    max_starts=dict(type="int"),
    reap=dict(
        type="dict",
        default={},
        options=dict(
            grace=dict(type="float", default=10),
            timeout=dict(type="float", default=60),
            threshold_mib=dict(type="int", default=1024),
        ),
    ),
    probe=dict(type="dict", default={}, options=gate_probe_spec()),
    lock=dict(
        type="dict",
        default={},
        options=dict(
            path=dict(type="path"),
            token=dict(type="str", no_log=False),
            owner=dict(type="dict", default={}),
            timeout=dict(type="float", default=600),
            renew_period=dict(type="float", default=30),
            renew_margin=dict(type="float", default=60),
            retake=dict(type="bool", default=False),
        ),
    ),
    known_good=dict(
        type="dict",
        default={},
        options=dict(
            root=dict(type="path"),
            files=dict(type="dict", default={}),
            dropin_dir=dict(type="path"),
            patch_state_id=dict(type="str", default="unknown"),
            python=dict(type="path"),
        ),
    ),
    journal_lines=dict(type="int", default=30),
    gateways=dict(type="list", elements="str", default=[]),
    gateway_api_key=dict(type="str", no_log=True),
    gateway_worker_url=dict(type="str"),
    gateway_min_healthy=dict(type="int", default=1),
    gateway_wait_timeout=dict(type="float", default=120),
    gateway_unreachable=dict(type="str", choices=list(UNREACHABLE_CHOICES), default=UNREACHABLE_FAIL),
    drain_timeout=dict(type="float", default=120),
    redact=dict(type="list", elements="str", default=[], no_log=True),
    fail_on_unhealthy=dict(type="bool", default=True),
    phase=dict(type="str", choices=list(PHASES), default=PHASE_ALL),
    node_rank=dict(type="int", default=0),
    reference=dict(type="dict", default={}, options=REFERENCE_SPEC),
)


class ChainInputError(OptionError):
    """An option is wrong; nothing on the host was touched."""


@dataclass
class LockOptions:
    path: str | None
    token: str | None
    owner: dict
    timeout: float
    renew_period: float
    renew_margin: float
    retake: bool


@dataclass
class KnownGoodOptions:
    root: str | None
    files: dict
    dropin_dir: str | None
    patch_state_id: str
    python: str | None


@dataclass
class GatewayOptions:
    urls: tuple
    api_key: str | None
    worker_url: str | None
    min_healthy: int
    wait_timeout: float
    unreachable: str
    drain_timeout: float


@dataclass
class ChainOptions:
    """What one run of the chain works with; built by :func:`parse_chain_options`, never with defaults of its own."""

    unit: str
    url: str
    api_key: str | None
    validate_certs: bool
    gpus: tuple
    ready_timeout: float
    ready_when_active: bool
    stability_window: float
    soak: int
    max_starts: int | None
    reap: dict
    probe: dict
    lock: LockOptions
    known_good: KnownGoodOptions
    gateway: GatewayOptions
    journal_lines: int
    secrets: tuple
    phase: str
    node_rank: int
    reference: dict


def parse_chain_options(params: dict) -> ChainOptions:
    """The module's validated parameters as ChainOptions; raise ChainInputError naming a wrong option."""
    unit = (params["unit"] or "").strip()
    if not unit:
        raise ChainInputError("unit", "unit must name the systemd unit that runs the server")
    try:
        url = validate_url(params["url"])
    except ValueError as exc:
        raise ChainInputError("url", str(exc)) from None
    options = ChainOptions(
        unit=normalize_unit_name(unit),
        url=url,
        api_key=params["api_key"] or None,
        validate_certs=params["validate_certs"] is not False,
        gpus=tuple(str(gpu).strip() for gpu in params["gpus"] or ()),
        ready_timeout=_number(params, "ready_timeout"),
        ready_when_active=bool(params["ready_when_active"]),
        stability_window=_number(params, "stability_window"),
        soak=_number(params, "soak"),
        max_starts=_number(params, "max_starts", 1),
        reap=_reap_options(params["reap"]),
        probe=dict(params["probe"]),
        lock=_lock_options(params["lock"]),
        known_good=_known_good_options(params["known_good"]),
        gateway=_gateway_options(params, url),
        journal_lines=_number(params, "journal_lines", 1),
        secrets=tuple(params["redact"] or ()),
        phase=_phase(params["phase"]),
        node_rank=_node_rank(params["node_rank"]),
        reference=_reference(params.get("reference")),
    )
    if options.node_rank and options.gateway.urls:
        raise ChainInputError(
            "gateways",
            f"gateways must be empty on node_rank {options.node_rank}: a rank >= 1 of a multi-node engine serves no "
            "API (only a health check); give the gateways to rank 0, which serves the engine",
        )
    _check_probe(options)
    return options


def _reference(given) -> dict:
    try:
        return parse_reference_options(given)
    except ReferenceInputError as exc:
        raise ChainInputError(exc.option, str(exc)) from None


def _phase(phase) -> str:
    if phase not in PHASES:
        raise ChainInputError("phase", f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    return phase


def _node_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ChainInputError(
            "node_rank", f"node_rank must be an integer >= 0 (0: rank 0 or a single host), got {rank!r}"
        )
    return rank


def _number(params: dict, option: str, minimum: float = 0.0, above: bool = False):
    value = params[option.rsplit(".", 1)[-1]]
    if value is not None and (value < minimum or (above and value == minimum)):
        relation = "greater than" if above else "at least"
        raise ChainInputError(option, f"{option} must be {relation} {minimum:g}, got {value}")
    return value


def _absolute(option: str, path) -> str | None:
    if not path:
        return None
    if not os.path.isabs(path):
        raise ChainInputError(option, f"{option} must be an absolute path, got {path!r}")
    return path


def _reap_options(reap: dict) -> dict:
    return {
        "grace": _number(reap, "reap.grace"),
        "timeout": _number(reap, "reap.timeout", above=True),
        "threshold_mib": _number(reap, "reap.threshold_mib"),
    }


def _lock_options(lock: dict) -> LockOptions:
    options = LockOptions(
        path=_absolute("lock.path", lock["path"]),
        token=lock["token"] or None,
        owner=dict(lock["owner"] or {}),
        timeout=_number(lock, "lock.timeout"),
        renew_period=_number(lock, "lock.renew_period", above=True),
        renew_margin=_number(lock, "lock.renew_margin"),
        retake=bool(lock.get("retake")),
    )
    if options.token and not options.path:
        raise ChainInputError("lock.token", "lock.token needs lock.path, the lock it was taken on")
    return options


def _known_good_options(known_good: dict) -> KnownGoodOptions:
    files = known_good["files"] or {}
    options = KnownGoodOptions(
        root=_absolute("known_good.root", known_good["root"]),
        files={name: _absolute(f"known_good.files.{name}", path) for name, path in files.items()},
        dropin_dir=_absolute("known_good.dropin_dir", known_good["dropin_dir"]),
        patch_state_id=known_good["patch_state_id"],
        python=_absolute("known_good.python", known_good["python"]),
    )
    if options.root and not options.files:
        raise ChainInputError("known_good.files", "known_good.files must name the files to snapshot (unit, ...)")
    return options


def _gateway_options(params: dict, url: str) -> GatewayOptions:
    """The gateways and the worker's URL as they tell it, normalized; raise ChainInputError naming a wrong one."""
    urls = _gateway_urls(params["gateways"] or [])
    min_healthy = _number(params, "gateway_min_healthy")
    if isinstance(min_healthy, bool) or int(min_healthy) != min_healthy:
        raise ChainInputError("gateway_min_healthy", "gateway_min_healthy must be an integer >= 0")
    unreachable = params["gateway_unreachable"]
    if unreachable not in UNREACHABLE_CHOICES:
        raise ChainInputError(
            "gateway_unreachable",
            f"gateway_unreachable must be {' or '.join(UNREACHABLE_CHOICES)}, got {unreachable!r}",
        )
    return GatewayOptions(
        urls=urls,
        api_key=params["gateway_api_key"] or None,
        worker_url=_worker_url(params["gateway_worker_url"] or url) if urls else None,
        min_healthy=int(min_healthy),
        wait_timeout=_number(params, "gateway_wait_timeout"),
        unreachable=unreachable,
        drain_timeout=_number(params, "drain_timeout"),
    )


def _gateway_urls(gateways) -> tuple:
    if isinstance(gateways, str):
        raise ChainInputError("gateways", f"gateways must be a list of gateway URLs, got the string {gateways!r}")
    try:
        urls = tuple(normalize_url(url, "gateways", GATEWAY_SCHEMES) for url in gateways)
    except ValueError as exc:
        raise ChainInputError("gateways", str(exc)) from None
    duplicates = sorted({url for url in urls if urls.count(url) > 1})
    if duplicates:
        raise ChainInputError("gateways", f"gateways lists {', '.join(duplicates)} more than once")
    return urls


def _worker_url(worker: str) -> str:
    try:
        return normalize_url(worker, "gateway_worker_url")
    except ValueError as exc:
        raise ChainInputError("gateway_worker_url", str(exc)) from None


def probe_settings(options: ChainOptions, wait_timeout: float, soak: int = 0) -> dict:
    """ProbeSettings arguments for the gate: the unit's GPUs, no window of its own (the chain holds it)."""
    settings = {
        **options.probe,
        "url": options.url,
        "unit": options.unit,
        "expected_gpus": list(options.gpus) or None,
        "stability_window": 0.0,
        "wait_timeout": wait_timeout,
        "poll_interval": POLL_S,
    }
    if soak:
        settings["soak_requests"] = soak
    return settings


def _check_probe(options: ChainOptions) -> None:
    try:
        ProbeSettings(**probe_settings(options, wait_timeout=0.0)).validate()
    except ProbeInputError as exc:
        raise ChainInputError(f"probe.{exc.option}", f"probe.{exc}") from None
