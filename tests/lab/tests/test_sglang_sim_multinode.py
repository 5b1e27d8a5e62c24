"""sglang_sim as a multi-node engine (--nnodes, --node-rank, --dist-init-addr, --dist-timeout).

The pieces directly (rank ranges, SGLang's assertions, the rendezvous over loopback), then two simulated nodes as
processes on this machine, each with a simgpu state of its own, meeting at a loopback dist-init address.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
from sim_support import FAST, LAB_DIR, SIMGPU_DIR, Sim, free_port, make_lab_env

sys.path.insert(0, str(LAB_DIR))
sys.path.insert(0, str(SIMGPU_DIR))
from sglang_sim import args, launch_server, rendezvous


# -- the pieces ------------------------------------------------------------------------------------------------------
def test_each_node_runs_its_own_range_of_tp_ranks():
    assert launch_server.node_ranks(4, 1, 1, 0) == [0, 1, 2, 3]
    assert launch_server.node_ranks(2, 2, 1, 0) == [0, 1, 2, 3]  # one node: every replica's ranks
    assert launch_server.node_ranks(4, 1, 2, 0) == [0, 1]
    assert launch_server.node_ranks(4, 1, 2, 1) == [2, 3]
    assert launch_server.node_ranks(8, 1, 4, 3) == [6, 7]


def test_sglang_asserts_tp_divisible_by_nodes_and_no_multi_node_dp():
    ns, _ignored = args.parse(["--model-path", "m", "--tp-size", "3", "--nnodes", "2", "--node-rank", "1"], {})
    with pytest.raises(AssertionError, match=r"^tp_size must be divisible by number of nodes$"):
        launch_server.check_server_args(ns)
    ns, _ignored = args.parse(["--model-path", "m", "--tp-size", "2", "--dp-size", "2", "--nnodes", "2"], {})
    with pytest.raises(AssertionError, match="multi-node data-parallel replicas are not supported"):
        launch_server.check_server_args(ns)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nnodes", "2", "--node-rank", "2"], "argument --node-rank: must be in 0..1 (--nnodes 2), got 2"),
        (["--nnodes", "0"], "argument --nnodes: must be >= 1, got 0"),
        (["--nnodes", "2", "--dist-init-addr", "host0"], "argument --dist-init-addr: expected HOST:PORT"),
    ],
)
def test_bad_multi_node_flags_exit_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        args.parse(["--model-path", "m", "--tp-size", "2", *argv], {})
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_addr_takes_host_port_and_bracketed_v6():
    assert rendezvous.parse_addr("10.0.0.2:20000") == ("10.0.0.2", 20000)
    assert rendezvous.parse_addr("[fd00::2]:20000") == ("fd00::2", 20000)
    with pytest.raises(ValueError):
        rendezvous.parse_addr("10.0.0.2:0")


def _plan(port: int, rank: int, world: int = 2, timeout: float = 5.0) -> rendezvous.GroupPlan:
    return rendezvous.GroupPlan(host="127.0.0.1", port=port, world_size=world, rank=rank, timeout_s=timeout)


def test_rendezvous_forms_only_when_every_rank_joined_and_a_dead_peer_closes_every_link():
    port = free_port()
    store = rendezvous.Store(_plan(port, 0))
    links = {}
    joiner = threading.Thread(target=lambda: links.setdefault(0, rendezvous.join(_plan(port, 0), store)))
    joiner.start()
    deadline = time.monotonic() + 5
    while not store.links and time.monotonic() < deadline:  # rank 0 registered with its own store
        time.sleep(0.01)
    assert store.links and joiner.is_alive() and not store.formed.is_set()  # rank 0 waits for rank 1
    links[1] = rendezvous.join(_plan(port, 1))
    joiner.join(timeout=5)
    assert store.formed.is_set()
    links[1].close()  # rank 1 dies
    links[0].settimeout(5)
    assert links[0].recv(64) == b""  # rank 0's link closes too: its next broadcast fails
    links[0].close()


def test_rendezvous_timeouts_read_as_torch_s():
    port = free_port()
    store = rendezvous.Store(_plan(port, 0, timeout=1))
    with pytest.raises(rendezvous.DistStoreError, match=r"^Timed out after 2 seconds waiting for clients\. 1/2 "):
        rendezvous.join(_plan(port, 0, timeout=1), store)
    with pytest.raises(rendezvous.DistNetworkError, match=r"timed out after 1000ms while trying to connect to"):
        rendezvous.join(_plan(free_port(), 1, timeout=1))


def test_shutdown_reaches_every_link():
    port = free_port()
    store = rendezvous.Store(_plan(port, 0))
    links = {}
    joiner = threading.Thread(target=lambda: links.setdefault(0, rendezvous.join(_plan(port, 0), store)))
    joiner.start()
    links[1] = rendezvous.join(_plan(port, 1))
    joiner.join(timeout=5)
    store.shutdown()
    for link in links.values():
        link.settimeout(5)
        assert link.recv(64) == rendezvous.SHUTDOWN
        link.close()


# -- two nodes as processes ------------------------------------------------------------------------------------------
@pytest.fixture
def nodes(tmp_path):
    """launch(rank, *argv): one node of a TP=2, two-node engine whose dist-init address is on loopback."""
    dist = f"127.0.0.1:{free_port()}"
    sims = []

    def launch(rank: int, *argv: str) -> Sim:
        env = make_lab_env(tmp_path / f"node{rank}")
        sim = Sim(
            env, ["--tp-size", "2", "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", dist, *FAST, *argv]
        )
        sims.append(sim)
        return sim

    yield launch
    for sim in sims:
        sim.kill()


def _titles(sim: Sim) -> list[str]:
    return sorted(cmd.split("\0")[0] for cmd in sim.children().values())


def test_rank0_serves_only_after_rank1_joined_and_rank1_serves_health_only(nodes):
    rank0 = nodes(0, "--dist-timeout", "60")
    time.sleep(2.0)
    assert rank0.proc.poll() is None
    with pytest.raises(OSError):
        rank0.get("/health", timeout=1)  # still in the rendezvous: no HTTP
    assert "Load weight begin" not in rank0.log  # the rendezvous comes before the weights
    rank1 = nodes(1, "--dist-timeout", "60")
    rank0.wait_healthy()
    assert rank0.get("/v1/models")[0] == 200
    assert _titles(rank0) == ["sglang::detokenizer", "sglang::scheduler_TP0"]
    rank1.wait_listening()
    assert _titles(rank1) == ["sglang::scheduler_TP1"]  # no detokenizer, no tokenizer manager
    assert rank1.get("/health")[0] == 200 and rank1.get("/ping")[0] == 200
    assert rank1.get("/v1/models") == (404, b'{"detail":"Not Found"}')
    assert rank1.post("/generate", {"text": "hi"})[0] == 404
    assert "Dummy health check server started in background thread at 127.0.0.1:" in rank1.log

    # rank 1 ignores SIGTERM to its main process; rank 0's ShutdownReq ends both.
    os.kill(rank1.proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert rank1.proc.poll() is None and "SIGTERM received on node_rank 1" in rank1.log
    os.kill(rank0.proc.pid, signal.SIGTERM)
    assert rank0.finish()[0] == 0
    code, log = rank1.finish()
    assert code == 0 and "terminated with 0" in log


def test_a_missing_rank_fails_rank0_after_the_dist_timeout(nodes):
    rank0 = nodes(0, "--dist-timeout", "2")
    code, log = rank0.finish(timeout=30)
    assert code == -signal.SIGKILL
    assert "torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. 1/2 clients joined." in log


def test_a_rank_that_dies_takes_the_other_down(nodes):
    rank0 = nodes(0, "--dist-timeout", "60")
    rank1 = nodes(1, "--dist-timeout", "60")
    rank0.wait_healthy()
    rank1.wait_listening()
    rank1.kill()
    code, log = rank0.finish(timeout=30)
    assert code == -signal.SIGKILL
    assert "Connection closed by peer" in log and "Scheduler hit an exception" in log


def test_rank1_serves_its_schedulers_metrics_only_with_enable_metrics(nodes):
    rank0 = nodes(0, "--dist-timeout", "60", "--enable-metrics")
    rank1 = nodes(1, "--dist-timeout", "60", "--enable-metrics")
    rank0.wait_healthy()
    rank1.wait_listening()
    status, body = rank1.get("/metrics")
    text = body.decode()
    assert status == 200, text
    assert 'sglang:num_running_reqs{model_name="org/sim-model",engine_type="unified",tp_rank="1"' in text
    assert "sglang:http_requests_active" not in text  # only the API server initialises the HTTP metrics
    assert "sglang:http_requests_active" in rank0.get("/metrics")[1].decode()
    os.kill(rank0.proc.pid, signal.SIGTERM)
    assert rank0.finish()[0] == 0
    assert rank1.finish()[0] == 0


def test_rank1_has_no_metrics_without_enable_metrics(nodes):
    rank0 = nodes(0, "--dist-timeout", "60")
    rank1 = nodes(1, "--dist-timeout", "60")
    rank0.wait_healthy()
    rank1.wait_listening()
    assert rank1.get("/metrics")[0] == 404
