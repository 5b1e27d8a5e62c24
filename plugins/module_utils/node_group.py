# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One SGLang engine across several hosts: each member's place in the group, judged before anything changes.

Private to the llmops.inference collection; not a public API (the ``node_group`` check of the sglang_info module).

A multi-node engine runs ``--nnodes N --node-rank R --dist-init-addr HOST0:PORT`` on every member; SGLang 0.5.23
asserts that tp_size divides by the number of nodes (srt/arg_groups/validation_hook.py ``check_server_args``) and
each node runs tp_size / N of the TP ranks on its own GPUs (srt/entrypoints/engine.py ``_calculate_rank_ranges``).
Every scheduler meets the others at the rank-0 address (torch's TCPStore), and a member that never comes keeps
the others waiting until the distributed timeout. So a group whose members disagree is refused here, each
problem on a line naming the member, the variable and what is accepted:

- this host not in its own group, a host named twice, a member that is not in the play;
- members whose group lists differ (every member must list the same hosts in the same order);
- ranks (the position in the list, or a member's explicit ``node_rank``) out of range, given twice, or missing;
- tp_size not the same on every member, or not divisible by the number of nodes;
- a member whose GPU list does not hold tp_size / nnodes GPUs;
- members that would load different models, or name different rank-0 addresses.

``check_rank0_address`` runs on each member: the rank-0 address must resolve there and answer (a refused
connection answers: nothing listens before the engine starts).
"""

from __future__ import annotations

import errno
import re
import socket
from dataclasses import dataclass, field

ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/]+):([0-9]{1,5})$")
# Answers that prove the address is reachable (something answered, even with a refusal).
_REACHED = (errno.ECONNREFUSED,)
CONNECT_TIMEOUT_S = 3.0


class NodeGroupError(ValueError):
    """The group cannot work; ``problems`` holds one line per problem."""

    def __init__(self, problems: list):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass
class GroupPlan:
    """This member's place in the group, as the unit renders it."""

    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str = ""
    gpus_per_node: int = 0
    ranks: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "dist_init_addr": self.dist_init_addr,
            "gpus_per_node": self.gpus_per_node,
            "ranks": dict(self.ranks),
        }


def format_address(host: str, port) -> str:
    host = str(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{int(port)}"


def split_address(address: str) -> tuple:
    """(host, port) of HOST:PORT or [V6]:PORT; ValueError otherwise."""
    match = ADDRESS.match(str(address))
    if not match or not 1 <= int(match.group(2)) <= 65535:
        raise ValueError(address)
    return match.group(1).strip("[]"), int(match.group(2))


def _int(value):
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


class _Judge:
    def __init__(self, host: str, group: list, views: dict, label: str):
        self.host = host
        self.group = [str(member) for member in group]
        self.views = views
        self.label = label
        self.problems: list = []

    def var(self, name: str) -> str:
        return f"{self.label}_{name}"

    def refuse(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def run(self) -> GroupPlan:
        group, label = self.group, self.var("node_group")
        if self.host not in group:
            self.refuse(f"{label} of {self.host} is {group}, which does not list {self.host} itself")
        twice = sorted({member for member in group if group.count(member) > 1})
        for member in twice:
            self.refuse(f"{label} names {member} {group.count(member)} times; list each host of the engine once")
        missing = [member for member in dict.fromkeys(group) if not self.views.get(member)]
        for member in missing:
            self.refuse(
                f"{label} names {member}, which is not in this play (not in the inventory, left out by --limit, "
                "or failed earlier): the hosts of a multi-node engine are configured together, all or none"
            )
        if self.problems:
            raise NodeGroupError(self.problems)
        members = list(dict.fromkeys(group))
        for member in members:
            theirs = [str(other) for other in self.views[member].get("node_group") or []]
            if theirs != group:
                self.refuse(
                    f"{label} of {member} is {theirs}, but {self.host}'s is {group}: every host of the engine must "
                    "list the same hosts in the same order"
                )
        ranks = self._ranks(members)
        tp_size = self._same_int(members, "tp_size")
        self._same(members, "model_path")
        nnodes = len(members)
        gpus_per_node = 0
        if tp_size is not None:
            if tp_size % nnodes:
                self.refuse(
                    f"{self.var('tp_size')} {tp_size} does not divide by the {nnodes} hosts of {label} (SGLang "
                    f"asserts that tp_size is divisible by the number of nodes): accepted is a multiple of {nnodes}"
                )
            else:
                gpus_per_node = tp_size // nnodes
                self._gpus(members, tp_size, gpus_per_node)
        address = self._address(members, ranks)
        if self.problems:
            raise NodeGroupError(self.problems)
        return GroupPlan(
            nnodes=nnodes,
            node_rank=ranks[self.host],
            dist_init_addr=address,
            gpus_per_node=gpus_per_node,
            ranks=ranks,
        )

    def _ranks(self, members: list) -> dict:
        nnodes, label = len(members), self.var("node_rank")
        ranks = {}
        for position, member in enumerate(members):
            given = self.views[member].get("node_rank")
            if given is None or given == "":
                ranks[member] = position
                continue
            rank = _int(given)
            if rank is None or not 0 <= rank < nnodes:
                self.refuse(
                    f"{label} of {member} is {given!r}: accepted is null (its position in the group) or an integer "
                    f"from 0 to {nnodes - 1} ({nnodes} hosts)"
                )
                continue
            ranks[member] = rank
        holders: dict = {}
        for member, rank in ranks.items():
            holders.setdefault(rank, []).append(member)
        for rank, names in sorted(holders.items()):
            if len(names) > 1:
                self.refuse(f"{label} {rank} is given to {' and '.join(names)}: each rank belongs to one host")
        if len(ranks) == nnodes:
            for rank in range(nnodes):
                if rank not in holders:
                    self.refuse(f"no host of the group has {label} {rank}: ranks 0 to {nnodes - 1} must each be given")
        return ranks

    def _same(self, members: list, name: str):
        values = {member: self.views[member].get(name) for member in members}
        if len({repr(value) for value in values.values()}) > 1:
            shown = ", ".join(f"{member}: {value!r}" for member, value in values.items())
            self.refuse(
                f"{self.var(name)} differs between the hosts of one engine ({shown}): set it once for the group"
            )
            return None
        return values[members[0]]

    def _same_int(self, members: list, name: str):
        value = self._same(members, name)
        number = _int(value)
        if value is not None and (number is None or number < 1):
            self.refuse(f"{self.var(name)} is {value!r}: accepted is an integer >= 1")
            return None
        return number

    def _gpus(self, members: list, tp_size: int, per_node: int) -> None:
        nnodes = len(members)
        for member in members:
            gpus = self.views[member].get("gpus") or []
            if gpus and len(gpus) != per_node:
                self.refuse(
                    f"{self.var('gpus')} of {member} lists {len(gpus)} GPUs {list(gpus)}, but tp_size {tp_size} over "
                    f"{nnodes} hosts runs {per_node} ranks on each: list {per_node} GPUs, or none (0 .. {per_node - 1})"
                )

    def _address(self, members: list, ranks: dict) -> str:
        label = self.var("dist_init_addr")
        given = self._same(members, "dist_init_addr")
        if given:
            try:
                split_address(given)
            except ValueError:
                self.refuse(
                    f"{label} is {given!r}: accepted is empty (rank 0's address) or HOST:PORT of the rank-0 host"
                )
                return ""
            return str(given)
        port = _int(self._same(members, "dist_init_port"))
        if port is None or not 1 <= port <= 65535:
            self.refuse(f"{self.var('dist_init_port')} must be an integer from 1 to 65535")
            return ""
        rank0 = next((member for member, rank in ranks.items() if rank == 0), None)
        if rank0 is None:
            return ""
        return format_address(self.views[rank0].get("address") or rank0, port)


def plan_group(host: str, group: list, views: dict, label: str = "sglang_service") -> GroupPlan:
    """This host's place in ``group`` (inventory names in rank order), from each member's own ``views``.

    ``views`` maps a member to its variables (``node_group``, ``node_rank``, ``tp_size``, ``gpus``, ``model_path``,
    ``dist_init_addr``, ``dist_init_port``, ``address``), or to None or {} when the member is not in the play or did
    not publish its variables (it failed before). An empty group is one node. Raises NodeGroupError naming every
    problem.
    """
    if not group:
        return GroupPlan()
    return _Judge(host, list(group), views, label).run()


def check_rank0_address(address: str, host: str, label: str, resolve=socket.getaddrinfo, connect=None):
    """None when this host resolves and reaches rank 0's ``address``; else the problem, naming it."""
    try:
        name, port = split_address(address)
    except ValueError:
        return f"{label} {address!r} is not HOST:PORT"
    try:
        infos = resolve(name, port, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return f"{host} cannot resolve {name}, the rank-0 host of {label} {address}: {exc}"
    connect = connect or _connect
    reasons = []
    for family, kind, proto, _canon, sockaddr in infos:
        reason = connect(family, kind, proto, sockaddr)
        if reason is None:
            return None
        reasons.append(f"{sockaddr[0]}: {reason}")
    return (
        f"{host} cannot reach {label} {address} (the rank-0 host, where every rank meets): {'; '.join(reasons)}; "
        "the members of a multi-node engine must reach each other"
    )


def _connect(family, kind, proto, sockaddr):
    """None when the address answered (a connection, or a refusal: the engine is not running yet)."""
    sock = socket.socket(family, kind, proto)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(sockaddr)
        return None
    except socket.timeout:
        return f"no answer within {CONNECT_TIMEOUT_S:g} s"
    except OSError as exc:
        if exc.errno in _REACHED:
            return None
        return exc.strerror or str(exc)
    finally:
        sock.close()
