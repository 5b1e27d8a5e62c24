"""The unit's stop lets SGLang finish its own drain: no request is cut and no stop ends as a crash.

SGLang 0.5.23 publishes its running/queued gauges only every decode_log_interval decode steps, without the batch
just admitted, so a request that reaches an idle engine just before a stop reads "0 running, 0 queued"; and its
schedulers die on the SIGTERM systemd sends to the whole group, which its watchdog turns into a SIGQUIT and a
SIGKILL of the tree (status=9/KILL). On one lab host (the lab's engine follows both, tests/lab/README.md): 16
streams sent within 0.5 s before a restart of an idle engine, and 16 in flight on a busy one, through a plain
``systemctl restart`` and through the role's restart chain; then steady load through the real gateway (smg) on the
same host while the chain takes the engine out of it, restarts it and adds it back. Every request completes in
full, and the journal shows each stop ending in "Deactivated successfully", with no SIGQUIT, no "crashed" and no
status=9.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gateway_lab import ENGINE_UNIT_TEXT, GATEWAY_PORT, MODEL, apply_gateway_role
from labutil import install_unit, run_play, sh, wait_healthy

pytestmark = pytest.mark.lab

KEY = "lab-stop-drain-key-3a7d"
NAME = "sglang-svc"
UNIT = f"{NAME}.service"
LOCK = f"/run/lock/llmops-{NAME}.lock"
ENGINE = "http://127.0.0.1:30000"
GATEWAY = f"http://127.0.0.1:{GATEWAY_PORT}"
LOADGEN = Path(__file__).with_name("loadgen.py")
# The other worker behind the gateway (the chain never removes the last healthy one), a plain unit on GPU 1.
OTHER_PORT = 30001
OTHER_UNIT = "t-engine.service"
# 10 ms per decode step: a burst of 300-token streams lasts several seconds, longer than the stop takes to begin.
# The engine takes GPU 0 and leaves GPU 1 to the other worker. Its drain looks every 5 s, as SGLang's does (the
# test labs run 1 s, TEST_LAB_OPTIONS in tests/lab/labctl/cli.py): a stop that does not wait for SGLang's own drain
# shows only then.
SERVICE = {
    "sglang_service_tp_size": 1,
    "sglang_service_gpus": [0],
    "sglang_service_api_key": KEY,
    "sglang_service_environment": {"SGLANG_SIM_TOKEN_LATENCY_MS": "10", "SGLANG_SIM_SIGTERM_POLL": "5"},
    "sglang_service_drain_timeout": 60,
    "sglang_service_gpu_free_wait_sec": 30,
}
BEHIND_GATEWAY = {
    **SERVICE,
    "sglang_service_gateways": [GATEWAY],
    "sglang_service_gateway_api_key": KEY,
    "sglang_service_gateway_worker_url": ENGINE,
}

# CLIENTS streams, the i-th sent SPREAD * i / CLIENTS seconds after the first; SENT_FILE is written once all were
# sent (the test restarts the unit then), OUT once all ended. Each records the wall time it was sent and what came.
BURST = """
import json, os, sys, threading, time, urllib.request
tokens, out, sent_file, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
CLIENTS, SPREAD = 16, 0.15
results = [None] * CLIENTS
sent = [None] * CLIENTS
start = time.monotonic()

def client(index):
    time.sleep(max(0.0, start + SPREAD * index / CLIENTS - time.monotonic()))
    body = json.dumps({"text": f"Stop drain prompt {index}", "stream": True,
                       "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    request = urllib.request.Request("http://127.0.0.1:30000/generate", body, headers)
    seen = {"sent": time.time(), "done": False, "completion_tokens": None, "error": None}
    sent[index] = seen["sent"]
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            for raw in answer:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    seen["done"] = True
                    break
                if line.startswith("data:"):
                    meta = json.loads(line[5:]).get("meta_info") or {}
                    seen["completion_tokens"] = meta.get("completion_tokens", seen["completion_tokens"])
    except Exception as exc:
        seen["error"] = repr(exc)
    results[index] = seen

threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
for thread in threads:
    thread.start()
while None in sent:
    time.sleep(0.005)
with open(sent_file, "w") as handle:
    handle.write(repr(max(sent)))
for thread in threads:
    thread.join()
with open(out + ".tmp", "w") as handle:
    json.dump(results, handle)
os.replace(out + ".tmp", out)
"""

RUNNING = """
import re, sys, time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    request = urllib.request.Request("http://127.0.0.1:30000/metrics", headers={"Authorization": "Bearer %s"})
    text = urllib.request.urlopen(request, timeout=5).read().decode()
    found = re.search(r"^sglang:num_running_reqs(?:{[^}]*})? ([0-9.]+)", text, re.M)
    if found and float(found.group(1)) >= 16:
        sys.exit(0)
    time.sleep(0.1)
sys.exit("the engine's gauges never showed 16 running requests")
"""


@pytest.fixture(scope="module")
def host(lab, tmp_path_factory):
    lab.reset()
    name = lab.hosts[0]
    sh(lab, name, f"cat > /run/stop_burst.py <<'PYEOF'\n{BURST}PYEOF")
    sh(lab, name, f"cat > /run/loadgen.py <<'PYEOF'\n{LOADGEN.read_text()}PYEOF")
    sh(lab, name, f"umask 077; printf %s {KEY} > /run/stop_drain.key")
    up = run_play(lab, tmp_path_factory.mktemp("stop"), name, "service_role", SERVICE, "up")
    assert up.ok, up.output
    environ = sh(lab, name, f"tr '\\0' '\\n' < /proc/$(systemctl show -P MainPID {UNIT})/environ")
    assert "SGLANG_SIM_SIGTERM_POLL=5" in environ.splitlines(), environ
    yield name
    lab.reset()


def since_now(lab, host: str) -> str:
    """The host's next whole second, once its clock reached it: what the journal logs from then on is this test's
    alone (``journalctl --since`` counts whole seconds, and the test before may have logged in the current one)."""
    return sh(
        lab,
        host,
        'now=$(date +%s); until [ "$(date +%s)" -gt "$now" ]; do sleep 0.05; done; date \'+%Y-%m-%d %H:%M:%S\'',
    ).strip()


def journal_since(lab, host: str, since: str) -> str:
    return sh(lab, host, f"journalctl -u {UNIT} --no-pager -o cat --since '{since}'")


def assert_clean_stops(journal: str, stops: int) -> None:
    """Every stop since the mark ended inactive with Result=success, none as a crash."""
    for bad in ("SIGQUIT", "crashed", "status=9", "Failed with result", "code=killed"):
        assert bad not in journal, f"{bad!r} in the journal:\n{journal}"
    assert journal.count("Deactivated successfully") >= stops, journal


def burst(lab, host: str, tokens: int, tag: str, restart: str) -> tuple:
    """Send 16 streams, run ``restart`` once all were sent; return (their records, send times, when it began)."""
    out, sent = f"/run/stop_{tag}.json", f"/run/stop_{tag}.sent"
    sh(lab, host, f"rm -f {out} {sent}")
    launch = f"(python3 /run/stop_burst.py {tokens} {out} {sent} {KEY}) </dev/null >/dev/null 2>&1 &"
    began = sh(
        lab,
        host,
        f"{launch} until [ -s {sent} ]; do sleep 0.01; done; date +%s.%N; {restart} >/dev/null",
        timeout=600,
    )
    records = json.loads(sh(lab, host, f"until [ -s {out} ]; do sleep 0.2; done; cat {out}", timeout=600))
    last_sent = float(sh(lab, host, f"cat {sent}"))
    return records, last_sent, float(began.split()[0])


def assert_all_complete(records: list, tokens: int) -> None:
    cut = [record for record in records if not (record["done"] and record["completion_tokens"] == tokens)]
    assert not cut, cut


def start_busy(lab, host: str, tokens: int, tag: str) -> str:
    """16 long streams, running on the engine (its gauges show them) when this returns; their result file."""
    out, sent = f"/run/stop_{tag}.json", f"/run/stop_{tag}.sent"
    sh(lab, host, f"rm -f {out} {sent}")
    sh(lab, host, f"(python3 /run/stop_burst.py {tokens} {out} {sent} {KEY}) </dev/null >/dev/null 2>&1 &")
    sh(lab, host, f"python3 - <<'EOF'\n{RUNNING % KEY}\nEOF", timeout=90)
    return out


def busy_results(lab, host: str, out: str) -> list:
    return json.loads(sh(lab, host, f"until [ -s {out} ]; do sleep 0.2; done; cat {out}", timeout=600))


def stop_began(lab, host: str, since: str) -> float:
    """When systemd began the last stop of the unit since ``since`` (its "Stopping" line), as a Unix time."""
    lines = sh(lab, host, f"journalctl -u {UNIT} --no-pager -o short-unix --since '{since}' | grep 'Stopping'")
    return float(lines.splitlines()[-1].split()[0])


@pytest.mark.parametrize("how", ["systemctl", "chain"])
def test_requests_sent_just_before_a_restart_of_an_idle_engine_and_of_a_busy_one_all_complete(lab, host, tmp_path, how):
    tokens = 300
    mark = since_now(lab, host)
    if how == "systemctl":
        restart = f"systemctl restart {UNIT}"
        idle, last_sent, began = burst(lab, host, tokens, "idle", restart)
        # Each stream was sent within 0.5 s before the restart, to an idle engine whose gauges still read 0.
        assert began >= last_sent
        assert all(began - record["sent"] < 0.5 for record in idle), (began, idle)
        out = start_busy(lab, host, tokens, "busy")
        sh(lab, host, restart, timeout=600)
    else:
        # The chain stops the unit a moment after it takes the host lock: the streams go out when the lock file
        # changes, so they reach the idle engine just before (or as) the chain stops it.
        out, sent = "/run/stop_idle_chain.json", "/run/stop_idle_chain.sent"
        sh(lab, host, f"rm -f {out} {sent}")
        watcher = (
            f"before=$(md5sum < {LOCK} 2>/dev/null); "
            f'until [ "$(md5sum < {LOCK} 2>/dev/null)" != "$before" ]; do sleep 0.01; done; '
            f"python3 /run/stop_burst.py {tokens} {out} {sent} {KEY}"
        )
        sh(lab, host, f"(timeout 300 sh -c '{watcher}') </dev/null >/dev/null 2>&1 &")
        mark_idle = since_now(lab, host)
        run = run_play(lab, tmp_path, host, "service_restart", SERVICE, "idle")
        assert run.ok, run.output
        assert run.gate()["healthy"] is True
        idle = busy_results(lab, host, out)
        began = stop_began(lab, host, mark_idle)
        # The chain's own steps between the lock and the stop take a moment on a busy machine: a looser bound.
        assert all(abs(began - record["sent"]) < 2 for record in idle), (began, idle)
        out = start_busy(lab, host, tokens, "busy_chain")
        run = run_play(lab, tmp_path, host, "service_restart", SERVICE, "busy")
        assert run.ok, run.output
        assert run.gate()["healthy"] is True
    busy = busy_results(lab, host, out)
    assert len(idle) == 16 and len(busy) == 16
    assert_all_complete(idle, tokens)
    assert_all_complete(busy, tokens)
    assert_clean_stops(journal_since(lab, host, mark), 2)


def test_a_request_the_gauges_do_not_show_yet_is_not_cut(lab, host):
    """One stream sent to an idle engine 0.1 s before a restart: its prefill reported the empty batch and the next
    report comes 40 decode steps (at least 0.4 s) later, so the gauges read 0 running, 0 queued while it runs."""
    out = "/run/stop_single.json"
    script = (
        "import json, time, urllib.request\n"
        "body = json.dumps({'text': 'One request', 'stream': True, 'sampling_params': {'max_new_tokens': 300}})\n"
        f"headers = {{'Content-Type': 'application/json', 'Authorization': 'Bearer {KEY}'}}\n"
        "request = urllib.request.Request('http://127.0.0.1:30000/generate', body.encode(), headers)\n"
        "seen = {'done': False, 'tokens': None}\n"
        "try:\n"
        "    with urllib.request.urlopen(request, timeout=300) as answer:\n"
        "        for raw in answer:\n"
        "            line = raw.decode().strip()\n"
        "            if line == 'data: [DONE]':\n"
        "                seen['done'] = True\n"
        "            elif line.startswith('data:'):\n"
        "                seen['tokens'] = json.loads(line[5:])['meta_info']['completion_tokens']\n"
        "except Exception as exc:\n"
        "    seen['error'] = repr(exc)\n"
        f"open('{out}.tmp', 'w').write(json.dumps(seen))\n"
        "import os\n"
        f"os.replace('{out}.tmp', '{out}')\n"
    )
    sh(lab, host, f"rm -f {out}; cat > /run/stop_single.py <<'PYEOF'\n{script}PYEOF")
    mark = since_now(lab, host)
    sh(lab, host, f"(python3 /run/stop_single.py) </dev/null >/dev/null 2>&1 & sleep 0.1; systemctl restart {UNIT}")
    seen = json.loads(sh(lab, host, f"until [ -s {out} ]; do sleep 0.2; done; cat {out}", timeout=300))
    assert seen == {"done": True, "tokens": 300}, seen
    assert_clean_stops(journal_since(lab, host, mark), 1)


def test_a_plain_stop_leaves_the_unit_inactive_with_result_success(lab, host):
    mark = since_now(lab, host)
    out = start_busy(lab, host, 200, "stop")
    sh(lab, host, f"systemctl stop {UNIT}", timeout=600)
    state = sh(lab, host, f"systemctl show {UNIT} -p ActiveState,Result,ExecMainCode,ExecMainStatus")
    # ExecMainCode 1 is CLD_EXITED: the main process exited (status 0) rather than being killed.
    assert dict(line.split("=", 1) for line in state.split()) == {
        "ActiveState": "inactive",
        "Result": "success",
        "ExecMainCode": "1",
        "ExecMainStatus": "0",
    }, state
    assert_all_complete(busy_results(lab, host, out), 200)
    sh(lab, host, f"systemctl start {UNIT}", timeout=600)
    assert_clean_stops(journal_since(lab, host, mark), 1)


def test_a_gateway_drained_restart_under_steady_load_loses_nothing(lab, host, tmp_path):
    role = apply_gateway_role(lab, host, {"sglang_gateway_api_key": KEY})
    assert role.returncode == 0, role.stdout[-4000:] + role.stderr[-2000:]
    other = ENGINE_UNIT_TEXT.format(model=MODEL, port=OTHER_PORT, api_key=KEY).replace(
        "[Service]\n", "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n"
    )
    install_unit(lab, host, OTHER_UNIT, other)
    sh(lab, host, f"systemctl restart {OTHER_UNIT}")
    wait_healthy(lab, host, OTHER_PORT, timeout=60)
    added = lab.module(
        host,
        "llmops.inference.sglang_gateway_worker",
        {"gateways": [GATEWAY], "worker_url": f"http://127.0.0.1:{OTHER_PORT}", "api_key": KEY, "worker_api_key": KEY},
    )
    assert added.get("_rc") == 0 and not added.get("failed"), added
    # The first chain run with the gateway adds the engine to it.
    join = run_play(lab, tmp_path, host, "service_restart", BEHIND_GATEWAY, "join")
    assert join.ok, join.output
    assert join.gate()["gateway"]["in_gateways"] is True
    mark = since_now(lab, host)
    out, stop = "/run/stop_gateway_load.json", "/run/stop_gateway_load.stop"
    # The load sends until the stop file exists (at most 180 s): both restarts run under it, then it ends.
    sh(
        lab,
        host,
        f"rm -f {out} {stop}; (python3 /run/loadgen.py --url {GATEWAY} --concurrency 16 --duration 180 "
        f"--max-new-tokens 60 --api-key-file /run/stop_drain.key --timeout 120 --out {out} --stop-file {stop}) "
        "</dev/null >/dev/null 2>&1 &",
    )
    # Two restarts under the load, each through the gateway drain.
    for attempt in (1, 2):
        sh(lab, host, f"python3 - <<'EOF'\n{RUNNING.replace('>= 16', '>= 1') % KEY}\nEOF", timeout=90)
        run = run_play(lab, tmp_path, host, "service_restart", BEHIND_GATEWAY, f"restart{attempt}")
        assert run.ok, run.output
        gate = run.gate()
        assert gate["healthy"] is True and gate["gateway"]["in_gateways"] is True, gate
    # Both restarts ran under the load: it was still sending when the second ended.
    assert lab.exec(host, "pgrep -f '^python3 /run/loadgen.py'").returncode == 0
    sh(lab, host, f"touch {stop}")
    # Only the summary: the records of every request would make a long answer.
    read = f'python3 -c \'import json; print(json.dumps(json.load(open("{out}"))["summary"]))\''
    # The load writes its file as it ends: read it once the process is gone, never half-written.
    done = "while pgrep -f '^python3 /run/loadgen.py' >/dev/null; do sleep 0.5; done"
    summary = json.loads(sh(lab, host, f"{done}; {read}", timeout=300))
    assert summary["requests"] > 16, summary
    assert summary["failed"] == 0 and summary["truncated"] == 0, summary
    assert_clean_stops(journal_since(lab, host, mark), 2)


def test_a_stream_that_outlives_the_drain_budget_is_aborted_not_cut_and_the_stop_stays_clean(lab, host, tmp_path):
    """A 20 s drain budget and a stream of about 60 s, through a plain ``systemctl restart``: at the end of the budget
    the stop aborts it (POST /abort_request with the key), the client gets its answer with an abort finish reason
    instead of a cut connection, and SGLang's own shutdown ends the unit: Result=success, exit 0, no SIGQUIT, no
    "crashed", and the GPU free again for the start that follows."""
    short = {**SERVICE, "sglang_service_drain_timeout": 20}
    up = run_play(lab, tmp_path, host, "service_role", short, "short_budget")
    assert up.ok, up.output
    out = "/run/stop_long.json"
    script = (
        "import json, os, urllib.request\n"
        "body = json.dumps({'text': 'A long one', 'stream': True, 'sampling_params': {'max_new_tokens': 6000}})\n"
        f"headers = {{'Content-Type': 'application/json', 'Authorization': 'Bearer {KEY}'}}\n"
        "request = urllib.request.Request('http://127.0.0.1:30000/generate', body.encode(), headers)\n"
        "seen = {'done': False, 'finish_reason': None, 'tokens': None, 'error': None}\n"
        "try:\n"
        "    with urllib.request.urlopen(request, timeout=600) as answer:\n"
        "        for raw in answer:\n"
        "            line = raw.decode().strip()\n"
        "            if line == 'data: [DONE]':\n"
        "                seen['done'] = True\n"
        "            elif line.startswith('data:'):\n"
        "                meta = json.loads(line[5:])['meta_info']\n"
        "                seen['finish_reason'], seen['tokens'] = meta['finish_reason'], meta['completion_tokens']\n"
        "except Exception as exc:\n"
        "    seen['error'] = repr(exc)\n"
        f"open('{out}.tmp', 'w').write(json.dumps(seen))\n"
        f"os.replace('{out}.tmp', '{out}')\n"
    )
    sh(lab, host, f"rm -f {out}; cat > /run/stop_long.py <<'PYEOF'\n{script}PYEOF")
    mark = since_now(lab, host)
    sh(lab, host, "(python3 /run/stop_long.py) </dev/null >/dev/null 2>&1 &")
    sh(lab, host, f"python3 - <<'EOF'\n{RUNNING.replace('>= 16', '>= 1') % KEY}\nEOF", timeout=90)
    sh(lab, host, f"systemctl restart {UNIT}", timeout=600)
    seen = json.loads(sh(lab, host, f"until [ -s {out} ]; do sleep 0.2; done; cat {out}", timeout=300))
    assert seen["error"] is None and seen["done"] is True, seen
    assert seen["finish_reason"]["type"] == "abort", seen
    assert 0 < seen["tokens"] < 6000, seen
    journal = journal_since(lab, host, mark)
    assert_clean_stops(journal, 1)
    assert "aborted every request (POST /abort_request abort_all)" in journal, journal
    assert "its requests aborted at the end of the drain budget" in journal, journal
    # The stop ended as SGLang's own shutdown does, and the start after it found the GPU free (its gate passed).
    assert "exited, status=0/SUCCESS" in journal or "Deactivated successfully" in journal, journal
    assert sh(lab, host, f"systemctl is-active {UNIT}").strip() == "active"
    assert sh(lab, host, f"systemctl show -P NRestarts {UNIT}").strip() == "0"
