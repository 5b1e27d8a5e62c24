"""The distributed rendezvous of a multi-node engine (--nnodes > 1), over real TCP between lab hosts.

SGLang 0.5.23 has every scheduler call torch.distributed.init_process_group with init method
tcp://DIST_INIT_ADDR (sglang/srt/distributed/bootstrap.py `_resolve_dist_init_method`, `_init_parallel_groups`;
sglang/srt/distributed/parallel_state.py `init_distributed_environment`), world size tp_size x pp_size and timeout
--dist-timeout (None: torch's default for the NCCL backend, 10 minutes). Global rank 0 hosts torch's TCPStore on
the port of that address and waits for every rank; the others connect to it, retrying until the timeout. After
that, each scheduler loop broadcasts the requests over the TP group's gloo CPU group
(managers/scheduler_components/request_receiver.py `_broadcast_reqs_across_ranks`, utils/common.py
`broadcast_pyobj`): a peer process that dies closes its sockets, and the next broadcast of every other rank fails
with gloo's "Connection closed by peer".

The lab's stand-in: the global rank 0 scheduler listens on the port (every address, as TCPStore does); every
scheduler, rank 0's own included, connects, says its rank and waits for "go"; the connection stays open as the
group's link. A link that closes without "shutdown" is a dead peer; the listener then closes every link, so every
rank fails as gloo's would. ShutdownReq on rank 0 sends "shutdown" to every link (rank 0's broadcast of it).
Messages of torch's: DistStoreError (TCPStore.cpp waitForWorkers), DistNetworkError (socket.cpp connect timeout).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger("sglang_sim.scheduler")

DEFAULT_TIMEOUT_S = 600  # torch: default_pg_nccl_timeout, 10 minutes (the NCCL backend of CUDA ranks)
CONNECT_RETRY_S = 1.0
HELLO_TIMEOUT_S = 2.0
GO = b"go\n"
SHUTDOWN = b"shutdown\n"


class DistStoreError(RuntimeError):
    """Stands for torch.distributed.DistStoreError."""


class DistNetworkError(RuntimeError):
    """Stands for torch.distributed.DistNetworkError."""


DistStoreError.__module__ = "torch.distributed"
DistNetworkError.__module__ = "torch.distributed"


def parse_addr(addr: str) -> tuple[str, int]:
    """HOST:PORT or [V6]:PORT (sglang/srt/utils/network.py NetworkAddress.parse); ValueError otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class GroupPlan:
    host: str
    port: int
    world_size: int
    rank: int  # global rank: tp_size x pp_rank + tp_rank
    timeout_s: float

    @property
    def hosts_store(self) -> bool:
        return self.rank == 0


class Store:
    """The listener global rank 0 runs: collects world_size links, then watches them."""

    def __init__(self, plan: GroupPlan):
        self.plan = plan
        self.sock = socket.socket(socket.AF_INET6 if ":" in plan.host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("", plan.port))
        except OSError as exc:
            self.sock.close()
            raise DistNetworkError(
                f"The server socket has failed to listen on any local network address. port: {plan.port}, "
                f"useIpv6: false, code: -{exc.errno}, name: {exc.strerror}"
            ) from None
        self.sock.listen(plan.world_size + 8)
        self.links: list[socket.socket] = []
        self.closing = False
        self.formed = threading.Event()
        self.failed = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="tcpstore", daemon=True).start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.plan.timeout_s
        while len(self.links) < self.plan.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                self.failed.set()
                self._close_all()
                return
            link, _peer = self.sock.accept()
            # torch counts a worker once it registered (TCPStore's worker count), not a bare connection
            link.settimeout(HELLO_TIMEOUT_S)
            try:
                hello = link.recv(64)
            except OSError:
                hello = b""
            if not hello:
                link.close()
                continue
            link.settimeout(None)
            self.links.append(link)
        self.formed.set()  # before any rank hears "go": a rank that returned from join() finds the group formed
        for link in self.links:
            link.sendall(GO)
        self._watch()

    def _watch(self) -> None:
        while True:
            readable = select.select(self.links, [], [])[0]
            for link in readable:
                try:
                    data = link.recv(64)
                except OSError:
                    data = b""
                if not data:
                    with self._lock:
                        if not self.closing:
                            self._close_all()
                    return

    def timeout_error(self) -> DistStoreError:
        return DistStoreError(
            f"Timed out after {int(self.plan.timeout_s) + 1} seconds waiting for clients. "
            f"{len(self.links)}/{self.plan.world_size} clients joined."
        )

    def shutdown(self) -> None:
        """Rank 0's ShutdownReq reaches every rank."""
        with self._lock:
            self.closing = True
            for link in self.links:
                try:
                    link.sendall(SHUTDOWN)
                except OSError:
                    pass

    def _close_all(self) -> None:
        for link in self.links:
            try:
                link.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            link.close()
        self.sock.close()


def join(plan: GroupPlan, store: Store | None = None) -> socket.socket:
    """Connect this rank to the group and wait until every rank joined; the returned link is the group."""
    deadline = time.monotonic() + plan.timeout_s
    link = None
    while link is None:
        try:
            link = socket.create_connection((plan.host, plan.port), timeout=CONNECT_RETRY_S)
        except OSError:
            if time.monotonic() >= deadline:
                raise DistNetworkError(
                    f"The client socket has timed out after {int(plan.timeout_s * 1000)}ms while trying to connect "
                    f"to ({plan.host}, {plan.port})."
                ) from None
            time.sleep(CONNECT_RETRY_S)
    link.settimeout(None)
    link.sendall(f"{plan.rank}\n".encode())
    ready = select.select([link], [], [], max(deadline - time.monotonic(), 0) + 1.0)[0]
    data = link.recv(len(GO)) if ready else b""
    if data != GO:
        link.close()
        if store is not None and store.failed.is_set():
            raise store.timeout_error()
        raise DistNetworkError(
            f"Failed to recv, got 0 bytes. Connection was likely closed by ({plan.host}, {plan.port})."
        )
    return link


def connection_closed(plan: GroupPlan) -> RuntimeError:
    """What a gloo broadcast raises once a peer of the group is gone."""
    return RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        f"Connection closed by peer [{plan.host}]:{plan.port}"
    )
