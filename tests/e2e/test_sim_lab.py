"""Lab acceptance of the simulated SGLang engine (issue 3) on a lab host under real systemd.

The sim runs as a systemd unit with /opt/sglang/venv/bin/python -m sglang_sim.launch_server, next to the
real sglang 0.5.23 sources, real nvidia-ml-py and the simulated libnvidia-ml / nvidia-smi.
Run: LLMOPS_LAB_NAME=sim LLMOPS_LAB_HOSTS=1 .venv/bin/python -m pytest tests/e2e/test_sim_lab.py -s
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
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        gpus.append({"index": index, "used_mib": memory.used // 2**20,
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


def install_unit(lab, host: str, name: str, flags: str, service: str = "", start: bool = True) -> None:
    unit = textwrap.dedent(f"""\
        [Unit]
        Description=sglang_sim lab acceptance ({name})

        [Service]
        ExecStart={VENV_PYTHON} -m sglang_sim.launch_server {BASE_FLAGS} {flags}
        """) + textwrap.dedent(service)
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
    install_unit(lab, host, "t-sim.service", "--tp-size 2")
    wait_healthy(lab, host)
    schedulers = scheduler_pids(lab, host)
    assert sorted(schedulers.values()) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    for pid in schedulers:
        assert "t-sim.service" in sh(lab, host, f"cat /proc/{pid}/cgroup")
    assert "sglang::detokenizer" in sh(lab, host, "pgrep -a -f '^sglang::detokenizer'")

    gpus = gpus_via_pynvml(lab, host)
    assert len(gpus) == 2
    held = {int(pid): mib for gpu in gpus for pid, mib in gpu["processes"].items()}
    assert set(held) == set(schedulers)
    assert all(mib > 60000 for mib in held.values()) and all(gpu["used_mib"] > 60000 for gpu in gpus)
    assert compute_apps(lab, host) == held

    timings = json.loads(
        run_python(
            lab,
            host,
            HOST_HTTP
            + textwrap.dedent("""
        from concurrent.futures import ThreadPoolExecutor
        body = {"text": "Benchmark prompt.", "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
        call("/generate", body)
        singles = []
        for _ in range(5):
            started = time.monotonic(); call("/generate", body); singles.append(time.monotonic() - started)
        started = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            statuses = list(pool.map(lambda _: call("/generate", body)[0], range(32)))
        print(json.dumps({"single_64_tokens_s": sorted(singles)[2], "concurrent_32_s": time.monotonic() - started,
                          "statuses": sorted(set(statuses))}))
    """),
        )
    )
    print(f"\nsim on a lab host, 1 ms/token: {timings}")
    assert timings["statuses"] == [200]
    assert timings["single_64_tokens_s"] < 0.150
    assert timings["concurrent_32_s"] < 8 * timings["single_64_tokens_s"] + 0.2

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


def test_failure_1_orphaned_schedulers_cause_an_oom_restart_loop(clean_lab):
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


def test_failure_2_never_loaded_model_looks_active(clean_lab):
    lab, host = clean_lab, clean_lab.hosts[0]
    install_unit(lab, host, "t-sim-noload.service", "--tp-size 2", service="Environment=SGLANG_SIM_FAULTS=never-load\n")
    wait_healthy(lab, host)
    assert sh(lab, host, "systemctl is-active t-sim-noload.service").strip() == "active"
    status, text = http(lab, host, "/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == "org/sim-model"
    assert [gpu["used_mib"] for gpu in gpus_via_pynvml(lab, host)] == [1, 1]
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
