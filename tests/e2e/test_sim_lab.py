"""The simulated SGLang engine on a lab host under real systemd, as SGLang 0.5.23 behaves there.

The sim runs as a systemd unit with /opt/sglang/venv/bin/python -m sglang_sim.launch_server, next to the
real sglang 0.5.23 sources, real nvidia-ml-py and the simulated libnvidia-ml / nvidia-smi.
Run (4 GPUs for the placement test): LLMOPS_LAB_NAME=sim LLMOPS_LAB_HOSTS=1 LLMOPS_LAB_GPUS=4 \
    .venv/bin/python -m pytest tests/e2e/test_sim_lab.py -m lab
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest

pytestmark = pytest.mark.lab

VENV_PYTHON = "/opt/sglang/venv/bin/python"
SITE_PACKAGES = "/opt/sglang/venv/lib/python3.11/site-packages"
PATCH_TARGET = f"{SITE_PACKAGES}/sglang/srt/utils/common.py"
PORT = 30000
# SGLang's JIT kernels run a bare `ninja` from the venv's bin/: a unit must put it on PATH.
VENV_PATH = "Environment=PATH=/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin\n"
BASE_FLAGS = (
    "--model-path org/sim-model --host 0.0.0.0 --port 30000 --sim-load-time 2 --sim-warmup-time 0.5 "
    "--sim-token-latency-ms 1"
)

HOST_HTTP = textwrap.dedent(f"""
    import json, sys, time, urllib.error, urllib.request

    def call(path, body=None, timeout=10.0):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request("http://127.0.0.1:{PORT}" + path, data=data,
                                         method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def wait_healthy(deadline_s):
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                if call("/health", timeout=2)[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False
""")

GPU_VIEW = textwrap.dedent("""
    import json, pynvml
    pynvml.nvmlInit()
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        reserved = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).reserved
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        gpus.append({"index": index, "used_mib": memory.used // 2**20, "reserved_mib": reserved // 2**20,
                     "processes": {str(p.pid): p.usedGpuMemory // 2**20 for p in procs}})
    pynvml.nvmlShutdown()
    print(json.dumps(gpus))
""")


def run_python(lab, host: str, code: str, python: str = "/usr/bin/python3", timeout: float = 180) -> str:
    """Run a Python program on the host; return its stdout (fails the test on a non-zero exit)."""
    proc = lab.exec(host, f"{python} - <<'PY'\n{code}\nPY", timeout=timeout)
    assert proc.returncode == 0, f"host python failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def sh(lab, host: str, command: str, timeout: float = 120) -> str:
    proc = lab.exec(host, command, timeout=timeout)
    assert proc.returncode == 0, f"{command!r} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def install_unit(
    lab, host: str, name: str, flags: str, service: str = "", start: bool = True, path: str = VENV_PATH
) -> None:
    unit = (
        textwrap.dedent(f"""\
        [Unit]
        Description=sglang_sim lab acceptance ({name})

        [Service]
        ExecStart={VENV_PYTHON} -m sglang_sim.launch_server {BASE_FLAGS} {flags}
        """)
        + path
        + textwrap.dedent(service)
    )
    command = f"cat > /etc/systemd/system/{name} <<'UNIT'\n{unit}UNIT\nsystemctl daemon-reload"
    if start:
        command += f" && systemctl start {name}"
    sh(lab, host, command)


def wait_healthy(lab, host: str, deadline_s: float = 90) -> None:
    out = run_python(lab, host, HOST_HTTP + f"\nprint(wait_healthy({deadline_s}))")
    assert out.strip() == "True", "the sim never answered /health with 200"


def http(lab, host: str, path: str, body=None, timeout: float = 10.0) -> tuple[int, str]:
    out = run_python(lab, host, HOST_HTTP + f"\nprint(json.dumps(call({path!r}, {body!r}, {timeout})))")
    status, text = json.loads(out)
    return status, text


def gpus_via_pynvml(lab, host: str) -> list[dict]:
    return json.loads(run_python(lab, host, GPU_VIEW, python=VENV_PYTHON))


def compute_apps(lab, host: str) -> dict[int, int]:
    out = sh(lab, host, "nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits")
    apps = {}
    for line in out.splitlines():
        if line.strip():
            pid, _gpu_uuid, used = (field.strip() for field in line.split(","))
            apps[int(pid)] = int(used)
    return apps


def scheduler_pids(lab, host: str) -> dict[int, str]:
    out = lab.exec(host, "pgrep -a -f '^sglang::scheduler'").stdout
    return {int(line.split()[0]): line.split()[1] for line in out.splitlines() if line.strip()}


def journal(lab, host: str, unit: str) -> str:
    return sh(lab, host, f"journalctl -u {unit} --no-pager -o cat")


def unit_show(lab, host: str, unit: str) -> dict[str, str]:
    out = sh(lab, host, f"systemctl show -p ActiveState,SubState,Result,MainPID,NRestarts {unit}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_tp2_unit_holds_gpu_memory_and_generates(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    install_unit(lab, host, "t-sim.service", "--tp-size 2 --enable-metrics")
    wait_healthy(lab, host)
    schedulers = scheduler_pids(lab, host)
    assert sorted(schedulers.values()) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    for pid in schedulers:
        assert "t-sim.service" in sh(lab, host, f"cat /proc/{pid}/cgroup")
    assert "sglang::detokenizer" in sh(lab, host, "pgrep -a -f '^sglang::detokenizer'")

    gpus = gpus_via_pynvml(lab, host)
    assert len(gpus) >= 2
    held = {int(pid): mib for gpu in gpus for pid, mib in gpu["processes"].items()}
    assert set(held) == set(schedulers)
    assert all(mib > 60000 for mib in held.values()) and all(gpu["used_mib"] > 60000 for gpu in gpus[:2])
    assert compute_apps(lab, host) == held

    # 32 requests at once run as one batch: the scheduler publishes a running batch of more than one request (every
    # 40 decode steps, so each request is long enough to be seen running), whatever the machine's speed.
    batched = json.loads(
        run_python(
            lab,
            host,
            HOST_HTTP
            + textwrap.dedent("""
        import re, threading
        from concurrent.futures import ThreadPoolExecutor
        body = {"text": "Benchmark prompt.", "sampling_params": {"max_new_tokens": 400, "temperature": 0}}
        seen, done = [0.0], threading.Event()
        def watch():
            while not done.is_set():
                found = re.search(r"^sglang:num_running_reqs(?:{[^}]*})? (\\S+)$", call("/metrics")[1], re.M)
                seen.append(float(found.group(1)) if found else 0.0)
                time.sleep(0.005)
        watcher = threading.Thread(target=watch)
        watcher.start()
        with ThreadPoolExecutor(32) as pool:
            statuses = list(pool.map(lambda _: call("/generate", body, timeout=120)[0], range(32)))
        done.set()
        watcher.join()
        print(json.dumps({"largest_running_batch": max(seen), "statuses": sorted(set(statuses))}))
    """),
        )
    )
    print(f"\nsim on a lab host, 32 requests at once: {batched}")
    assert batched["statuses"] == [200]
    assert batched["largest_running_batch"] > 1, batched

    install_unit(
        lab,
        host,
        "t-sim.service",
        "--tp-size 2 --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1",
        start=False,
    )
    sh(lab, host, "systemctl restart t-sim.service")
    wait_healthy(lab, host)
    status, text = http(
        lab, host, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
    )
    out = json.loads(text)
    assert status == 200 and len(out["text"].split()) == 32
    meta = out["meta_info"]
    for field in (
        "prompt_tokens",
        "completion_tokens",
        "e2e_latency",
        "spec_accept_length",
        "spec_accept_rate",
        "spec_verify_ct",
    ):
        assert field in meta, field
    info = json.loads(http(lab, host, "/server_info")[1])
    assert info["speculative_num_draft_tokens"] == 4 and "avg_spec_accept_length" in info["internal_states"][0]


def test_orphaned_schedulers_cause_an_oom_restart_loop(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    install_unit(
        lab,
        host,
        "t-sim-orphan.service",
        "--tp-size 2",
        service="""\
        Environment=SGLANG_SIM_FAULTS=orphan-schedulers,slow-drain
        KillMode=process
        TimeoutStopSec=5
        Restart=on-failure
        RestartSec=1
        """,
    )
    wait_healthy(lab, host)
    before = scheduler_pids(lab, host)
    sh(lab, host, "systemctl stop t-sim-orphan.service", timeout=60)
    assert unit_show(lab, host, "t-sim-orphan.service")["Result"] == "timeout"
    assert scheduler_pids(lab, host) == before
    apps = compute_apps(lab, host)
    assert set(before) <= set(apps) and all(apps[pid] > 60000 for pid in before)

    sh(lab, host, "systemctl start t-sim-orphan.service")
    main_pids = set()
    deadline = time.monotonic() + 90
    state = {}
    while time.monotonic() < deadline:
        state = unit_show(lab, host, "t-sim-orphan.service")
        if state["MainPID"] != "0":
            main_pids.add(state["MainPID"])
        if int(state["NRestarts"]) >= 2 and len(main_pids) >= 2:
            break
        time.sleep(0.2)
    assert int(state["NRestarts"]) >= 2 and len(main_pids) >= 2, (state, main_pids)
    logs = journal(lab, host, "t-sim-orphan.service")
    assert "torch.OutOfMemoryError: CUDA out of memory" in logs
    assert scheduler_pids(lab, host).keys() >= before.keys()


def test_a_never_loaded_model_looks_active(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    install_unit(lab, host, "t-sim-noload.service", "--tp-size 2", service="Environment=SGLANG_SIM_FAULTS=never-load\n")
    out = run_python(
        lab,
        host,
        HOST_HTTP
        + textwrap.dedent("""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if call("/v1/models", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        # A generation never finishes (the model never loaded), so neither does the warm-up: /health stays 503.
        try:
            generated = call("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}, timeout=3)[0]
        except OSError:  # the read timed out
            generated = "no answer"
        print(json.dumps([call("/v1/models")[0], generated, call("/health", timeout=5)[0]]))
    """),
    )
    assert json.loads(out) == [200, "no answer", 503]
    assert sh(lab, host, "systemctl is-active t-sim-noload.service").strip() == "active"
    # NVML's v1 used holds the driver's reservation; beyond it, an idle board's 1 MiB (nvidia-smi's "1MiB").
    assert [gpu["used_mib"] - gpu["reserved_mib"] for gpu in gpus_via_pynvml(lab, host)][:2] == [1, 1]
    assert compute_apps(lab, host) == {}
    out = run_python(
        lab,
        host,
        HOST_HTTP
        + textwrap.dedent("""
        try:
            call("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 8}}, timeout=3)
            print("completed")
        except OSError:
            print("timed out")
    """),
    )
    assert out.strip() == "timed out"


def test_installed_sources_decide_algorithms_and_compile(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    install_unit(lab, host, "t-sim-algo.service", "--speculative-algorithm SPARKLE --speculative-num-steps 3")
    wait_failed(lab, host, "t-sim-algo.service")
    assert "ValueError: Unknown speculative algorithm name: SPARKLE" in journal(lab, host, "t-sim-algo.service")

    sh(lab, host, f"cp -p {PATCH_TARGET} {PATCH_TARGET}.simlab-backup")
    try:
        sh(lab, host, f"printf '\\ndef broken(:\\n    pass\\n' >> {PATCH_TARGET}")
        install_unit(lab, host, "t-sim-syntax.service", "--tp-size 1")
        wait_failed(lab, host, "t-sim-syntax.service")
        logs = journal(lab, host, "t-sim-syntax.service")
        assert "Traceback (most recent call last)" in logs and "SyntaxError" in logs and PATCH_TARGET in logs
    finally:
        sh(lab, host, f"mv -f {PATCH_TARGET}.simlab-backup {PATCH_TARGET}")
    assert "broken" not in sh(lab, host, f"tail -n 3 {PATCH_TARGET}")


def wait_failed(lab, host: str, unit: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    state = {}
    while time.monotonic() < deadline:
        state = unit_show(lab, host, unit)
        if state["ActiveState"] == "failed":
            return
        time.sleep(0.2)
    raise AssertionError(f"{unit} did not fail: {state}")


STREAM = textwrap.dedent(f"""
    import http.client, json, sys, threading, time
    results = {{}}

    def stream(key, tokens):
        conn = http.client.HTTPConnection("127.0.0.1", {PORT}, timeout=120)
        try:
            body = json.dumps({{"text": "Lab", "stream": True, "sampling_params": {{"max_new_tokens": tokens}}}})
            conn.request("POST", "/generate", body, {{"content-type": "application/json"}})
            response = conn.getresponse()
            last, done = 0, False
            for raw in response:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    last = json.loads(line[6:])["meta_info"]["completion_tokens"]
                    results.setdefault(key + ":started", True)
            results[key] = [response.status, last, done]
        except Exception as exc:
            results[key] = repr(exc)
        finally:
            conn.close()
""")


def stop_during_streams(lab, host: str, stop_command: str, count: int, tokens: int) -> dict:
    """Start `count` streamed generations, run `stop_command` once all stream, wait for the streams to end."""
    code = STREAM + textwrap.dedent(f"""
        import subprocess
        workers = [threading.Thread(target=stream, args=(f"r{{i}}", {tokens})) for i in range({count})]
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(f"r{{i}}:started" in results for i in range({count})):
            time.sleep(0.01)
        subprocess.run({stop_command!r}, shell=True, check=False)
        for worker in workers:
            worker.join(120)
        print(json.dumps({{k: v for k, v in results.items() if not k.endswith(":started")}}))
    """)
    return json.loads(run_python(lab, host, code, timeout=240))


def wait_released(lab, host: str, deadline_s: float = 20) -> None:
    """Poll until every GPU shows only the driver's 1 MiB (each poll also lets the driver see holders gone)."""
    deadline = time.monotonic() + deadline_s
    query = "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits"
    while set(sh(lab, host, query).split()) != {"1"}:
        assert time.monotonic() < deadline, sh(lab, host, query)
        time.sleep(0.1)


def unit_exit(lab, host: str, unit: str) -> dict[str, str]:
    out = sh(lab, host, f"systemctl show -p ExecMainCode,ExecMainStatus,Result,ActiveState {unit}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_a_control_group_stop_drops_every_request_in_flight(clean_lab):
    """KillMode=control-group sends SIGTERM to every process: the children die, the watchdog kills the tree."""
    lab, host = clean_lab, clean_lab.hosts[0]
    install_unit(lab, host, "t-sim-stop.service", "--tp-size 2 --sim-token-latency-ms 10")
    wait_healthy(lab, host)
    results = stop_during_streams(lab, host, "systemctl stop t-sim-stop.service", count=4, tokens=600)
    assert all(not isinstance(r, list) or not r[2] for r in results.values()), results  # every stream was cut
    status = unit_exit(lab, host, "t-sim-stop.service")
    assert (status["ExecMainCode"], status["ExecMainStatus"]) == ("2", "9"), status  # killed by SIGKILL
    logs = journal(lab, host, "t-sim-stop.service")
    assert "crashed with exit code -15. Triggering SIGQUIT for cleanup..." in logs


def test_sigterm_to_the_main_process_alone_drains_every_request(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    install_unit(lab, host, "t-sim-drain.service", "--tp-size 2 --sim-token-latency-ms 10")
    wait_healthy(lab, host)
    stop = "systemctl kill --kill-whom=main --signal=SIGTERM t-sim-drain.service"
    results = stop_during_streams(lab, host, stop, count=4, tokens=600)
    assert results == {f"r{i}": [200, 600, True] for i in range(4)}, results
    deadline = time.monotonic() + 30
    while unit_show(lab, host, "t-sim-drain.service")["ActiveState"] not in ("inactive", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert unit_exit(lab, host, "t-sim-drain.service")["Result"] == "success"
    logs = journal(lab, host, "t-sim-drain.service")
    assert "Gracefully exiting... Remaining number of requests 4." in logs and "Finished server process" in logs
    assert compute_apps(lab, host) == {}


def test_two_engines_on_their_own_gpus_of_four(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    if len(gpus_via_pynvml(lab, host)) < 4:
        pytest.skip("needs a lab with 4 GPUs per host (LLMOPS_LAB_GPUS=4)")
    install_unit(lab, host, "t-sim-a.service", "--tp-size 2", service="Environment=CUDA_VISIBLE_DEVICES=0,1\n")
    install_unit(
        lab,
        host,
        "t-sim-b.service",
        "--tp-size 2 --port 30001",
        service="Environment=CUDA_VISIBLE_DEVICES=2,3\n",
    )
    wait_healthy(lab, host)
    run_python(lab, host, HOST_HTTP.replace(str(PORT), "30001") + "\nassert wait_healthy(90)")
    gpus = gpus_via_pynvml(lab, host)
    units = {pid: unit_of(lab, host, pid) for gpu in gpus for pid in map(int, gpu["processes"])}
    on = {index: {units[int(pid)] for pid in gpu["processes"]} for index, gpu in enumerate(gpus)}
    assert on == {0: {"t-sim-a.service"}, 1: {"t-sim-a.service"}, 2: {"t-sim-b.service"}, 3: {"t-sim-b.service"}}
    b_before = {pid for pid, unit in units.items() if unit == "t-sim-b.service"}
    sh(lab, host, "systemctl stop t-sim-a.service", timeout=60)
    gpus = gpus_via_pynvml(lab, host)
    assert {int(pid) for gpu in gpus for pid in gpu["processes"]} == b_before


def unit_of(lab, host: str, pid: int) -> str:
    paths = [line.split(":", 2)[2] for line in sh(lab, host, f"cat /proc/{pid}/cgroup").splitlines()]
    return next(part for path in paths for part in path.split("/") if part.endswith(".service"))


def test_a_mig_device_is_listed_and_used_like_a_gpu(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    gpu = len(gpus_via_pynvml(lab, host)) - 1
    sh(lab, host, f"simgpu-claim --mig {gpu}:2")
    try:
        listing = sh(lab, host, "nvidia-smi -L").splitlines()
        mig_lines = [line for line in listing if line.startswith("  MIG 3g.40gb     Device ")]
        assert len(mig_lines) == 2
        mig_uuid = mig_lines[1].split("(UUID: ")[1].rstrip(")")
        install_unit(lab, host, "t-sim-mig.service", "", service=f"Environment=CUDA_VISIBLE_DEVICES={mig_uuid}\n")
        wait_healthy(lab, host)
        view = json.loads(
            run_python(
                lab,
                host,
                textwrap.dedent(f"""
            import json, pynvml as n
            n.nvmlInit()
            mig = n.nvmlDeviceGetHandleByUUID({mig_uuid!r})
            parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            procs = n.nvmlDeviceGetComputeRunningProcesses(mig)
            print(json.dumps({{"is_mig": n.nvmlDeviceIsMigDeviceHandle(mig).value,
                              "parent": n.nvmlDeviceGetIndex(parent), "mode": n.nvmlDeviceGetMigMode(parent),
                              "total": n.nvmlDeviceGetMemoryInfo(mig).total >> 20,
                              "procs": [[p.pid, p.gpuInstanceId] for p in procs]}}))
        """),
                python=VENV_PYTHON,
            )
        )
        scheduler = next(iter(scheduler_pids(lab, host)))
        assert view == {"is_mig": 1, "parent": gpu, "mode": [1, 1], "total": 40320, "procs": [[scheduler, 2]]}
    finally:
        sh(lab, host, "systemctl stop t-sim-mig.service; systemctl kill -s KILL t-sim-mig.service; true")
        sh(lab, host, f"for i in $(seq 50); do simgpu-claim --mig-off {gpu} && exit 0; sleep 0.1; done; exit 1")


def test_the_jit_build_needs_the_venvs_ninja_and_a_writable_cache(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    sh(lab, host, "rm -rf /root/.cache/sglang")
    install_unit(lab, host, "t-sim-nopath.service", "", path="")
    wait_failed(lab, host, "t-sim-nopath.service")
    logs = journal(lab, host, "t-sim-nopath.service")
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'" in logs
    # A service user whose home is not writable (nobody: /nonexistent) cannot create ~/.cache/sglang.
    install_unit(lab, host, "t-sim-nobody.service", "", service="User=nobody\n")
    wait_failed(lab, host, "t-sim-nobody.service")
    assert "PermissionError: [Errno 13] Permission denied: '/nonexistent'" in journal(lab, host, "t-sim-nobody.service")
    # With ninja on PATH the cache fills; later starts hit it without ninja.
    install_unit(lab, host, "t-sim-path.service", "")
    wait_healthy(lab, host)
    sh(lab, host, "systemctl stop t-sim-path.service", timeout=60)
    wait_released(lab, host)
    install_unit(lab, host, "t-sim-warm.service", "", path="")
    wait_healthy(lab, host)


def test_gpu_memory_outlives_its_holders_as_on_a_real_driver(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    code = textwrap.dedent("""
        import json, os, signal, subprocess, time, pynvml as n
        os.environ["SIMGPU_RELEASE_LAG_MS"] = "5000"  # far longer than a view takes: the lag is seen, however slow
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        def view():
            procs = n.nvmlDeviceGetComputeRunningProcesses(h)
            return [n.nvmlDeviceGetMemoryInfo(h).used >> 20, sorted(p.pid for p in procs)]
        claim = ["simgpu-claim", "--hold", "--gpu", "0", "--mib", "1000"]
        idle = view()  # the driver's reservation is in `used` (v1), as on a real board
        holder = subprocess.Popen(claim, stdout=subprocess.PIPE)
        holder.stdout.readline()
        held = view()
        holder.kill(); holder.wait()
        lagging = view()
        deadline = time.monotonic() + 30
        while (released := view())[0] == lagging[0] and time.monotonic() < deadline:  # until the lag ends
            time.sleep(0.1)
        print(json.dumps({"pid": holder.pid, "idle": idle, "held": held, "lagging": lagging, "released": released}))
    """)
    out = json.loads(run_python(lab, host, code, python=VENV_PYTHON))
    idle_mib = out["idle"][0]
    assert out["held"] == [idle_mib + 1000, [out["pid"]]] and out["lagging"] == [idle_mib + 1000, []]
    assert out["released"] == [idle_mib, []]
    # A zombie whose parent is another unit's process: listed, counted, not killable, not resettable.
    sh(lab, host, "systemd-run --unit t-zombie-parent simgpu-claim --zombie --gpu 1 --mib 5000")
    deadline = time.monotonic() + 20
    apps = {}
    while time.monotonic() < deadline and not apps:
        apps = compute_apps(lab, host)
        time.sleep(0.1)
    ((zombie, mib),) = list(apps.items())
    assert mib == 5000 and sh(lab, host, f"ps -o stat= -p {zombie}").strip().startswith("Z")
    sh(lab, host, f"kill -9 {zombie}")
    assert compute_apps(lab, host) == {zombie: 5000}
    assert lab.exec(host, "simgpu-claim --reset-gpu 1").returncode == 1
    sh(lab, host, "systemctl stop t-zombie-parent")
    # Memory held by a PID that no longer exists: counted, no process listed, until a GPU reset.
    out = sh(
        lab,
        host,
        # Without a release lag, memory left by a gone holder would be free at once: what stays is stuck.
        "simgpu-claim --stuck --gpu 1 --mib 700 && "
        "SIMGPU_RELEASE_LAG_MS=0 nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 1",
    )
    assert out.splitlines()[-1] == "701" and compute_apps(lab, host) == {}
    sh(lab, host, "simgpu-claim --reset-gpu 1")
    assert sh(lab, host, "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 1").strip() == "1"


def test_an_api_key_from_a_0600_config_file_stays_out_of_ps(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    sh(lab, host, "install -m 0600 /dev/null /run/t-sim.yaml && echo 'api-key: sk-lab-secret' > /run/t-sim.yaml")
    install_unit(lab, host, "t-sim-key.service", "--config /run/t-sim.yaml")
    wait_healthy(lab, host)
    assert "sk-lab-secret" not in sh(lab, host, "ps -eo args")
    status, _text = http(lab, host, "/v1/models")
    assert status == 401
    assert "'api_key': 'sk-lab-secret'" in journal(lab, host, "t-sim-key.service")


def test_ansible_modules_run_from_cached_code_and_the_engine_python_is_untouched(clean_lab):
    """Test labs cache the compiled code of Ansible's modules for the system Python only (tests/lab/README.md)."""
    host = clean_lab.hosts[0]
    pinged = clean_lab.module(host, "ansible.builtin.ping", {"data": "pong"})
    assert pinged["ping"] == "pong", pinged
    show = "import zipimport; print(zipimport._compile_source.__name__)"
    system = clean_lab.exec(host, f"python3 -c '{show}'; ls /var/cache/llmops-lab-module-code | wc -l")
    assert system.stdout.split()[0] == "_cached_compile_source" and int(system.stdout.split()[1]) > 0, system
    engine = clean_lab.exec(host, f"{VENV_PYTHON} -c '{show}'")
    assert engine.stdout.strip() == "_compile_source", engine


def test_a_test_labs_units_get_its_engine_defaults_and_their_own_environment_wins(clean_lab):
    """`lab up --sim-env` (test labs: the drain's 1 s tick) is systemd's default environment for every unit."""
    host = clean_lab.hosts[0]
    printenv = "systemd-run --wait --pipe --quiet {} printenv SGLANG_SIM_SIGTERM_POLL"
    assert clean_lab.exec(host, printenv.format("")).stdout.strip() == "1"
    own = clean_lab.exec(host, printenv.format("-p Environment=SGLANG_SIM_SIGTERM_POLL=5"))
    assert own.stdout.strip() == "5", own


def test_a_reset_brings_changed_added_and_deleted_sglang_sources_back_to_the_wheels(clean_lab):
    """What a test that failed before restoring its patch leaves: the next reset restores it from the wheel."""
    host = clean_lab.hosts[0]
    package = f"{SITE_PACKAGES}/sglang"
    deleted = f"{package}/srt/speculative/spec_registry.py"
    sh(clean_lab, host, f"echo '# patched' >> {PATCH_TARGET}; rm {deleted}; mkdir {package}/srt/llmops_added")
    sh(
        clean_lab,
        host,
        f"echo 'x = 1' > {package}/srt/llmops_added/note.py; {VENV_PYTHON} -m compileall -q {package}/srt/llmops_added",
    )
    clean_lab.reset([host])
    left = sh(
        clean_lab,
        host,
        f"{VENV_PYTHON} -c 'from sglang_sim import sources as s; print(s.modified_sources(s.locate()))'",
    )
    assert left.strip() == "[]", left
    assert sorted(sh(clean_lab, host, f"ls {deleted} {package}/srt/llmops_added 2>&1; true").splitlines()) == [
        deleted,
        f"ls: cannot access '{package}/srt/llmops_added': No such file or directory",
    ]
    assert "# patched" not in sh(clean_lab, host, f"tail -n 1 {PATCH_TARGET}")
