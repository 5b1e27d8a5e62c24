"""Small helpers for tests that drive lab hosts: shell commands, units, waiting for the engine."""

from __future__ import annotations

# The sglang_service role on a lab host: what differs from a real host is which module the unit launches, and
# quicker timings.
SERVICE_LAB_VARS = {
    "sglang_service_name": "sglang-svc",
    "sglang_service_python": "/opt/sglang/venv/bin/python",
    "sglang_service_launch_module": "sglang_sim.launch_server",
    "sglang_service_model_path": "Qwen/Qwen3-8B",
    "sglang_service_tp_size": 2,
    "sglang_service_extra_args": ["--sim-load-time", "1"],
    "sglang_service_restart_sec": 1,
    "sglang_service_drain_timeout": 5,
    "sglang_service_scheduler_exit_sec": 2,
    "sglang_service_stop_margin_sec": 3,
    "sglang_service_gpu_free_wait_sec": 1,
    "sglang_service_probe_wait_timeout": 15,
}

# What a unit that runs the lab's engine needs in its environment: SGLang's JIT kernel build runs a bare `ninja`,
# which the venv's bin/ holds (systemd's default PATH for services lacks it); root's ~/.cache/sglang is writable.
SERVICE_PATH = "PATH=/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"

# Polls GET PATH until it answers 200. Each request may take what is left of the wait: SGLang 0.5.23's /health runs
# a one-token generation and answers after a second or more.
ANSWER_WAIT = """
import sys, time, urllib.request
deadline = time.monotonic() + {timeout}
while time.monotonic() < deadline:
    left = max(deadline - time.monotonic(), 0.1)
    try:
        with urllib.request.urlopen("http://127.0.0.1:{port}{path}", timeout=left) as answer:
            if answer.status == 200:
                print(repr(time.time()))
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.01)
sys.exit(1)
"""


def sh(lab, host: str, command: str, timeout: float = 180) -> str:
    """Run a shell command inside a lab host; fail the test with its output if it fails."""
    proc = lab.exec(host, command, timeout=timeout)
    assert proc.returncode == 0, f"{command!r} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def install_unit(lab, host: str, name: str, text: str) -> None:
    sh(lab, host, f"cat > /etc/systemd/system/{name} <<'EOF'\n{text}EOF\nsystemctl daemon-reload")


def wait_answers(lab, host: str, path: str, port: int = 30000, timeout: float = 120) -> float:
    """Wait until GET ``path`` answers 200 on the host; return the host's wall-clock time when it did."""
    script = ANSWER_WAIT.format(port=port, path=path, timeout=timeout)
    return float(sh(lab, host, f"python3 - <<'EOF'\n{script}\nEOF", timeout=timeout + 30))


def wait_healthy(lab, host: str, port: int = 30000, timeout: float = 120) -> float:
    """Wait until /health (a generation in SGLang 0.5.23) answers 200; return the host's wall-clock time then."""
    return wait_answers(lab, host, "/health", port, timeout)


def wait_ready(lab, host: str, port: int = 30000, timeout: float = 120) -> float:
    """Wait until /ready answers 200 (warm-up done, not draining); return the host's wall-clock time then."""
    return wait_answers(lab, host, "/ready", port, timeout)


def start_ready_watch(
    lab, host: str, out_path: str, port: int = 30000, timeout: float = 120, path: str = "/health"
) -> None:
    """In the background on the host, write the wall-clock time at which GET ``path`` first answers 200."""
    script = ANSWER_WAIT.format(port=port, path=path, timeout=timeout)
    sh(
        lab,
        host,
        f"cat > /run/ready_watch.py <<'EOF'\n{script}\nEOF\nrm -f {out_path}\n"
        # The whole background list gets its own stdio, or lab.exec would wait for it to finish.
        f"(python3 /run/ready_watch.py > {out_path}.tmp && mv {out_path}.tmp {out_path}) </dev/null >/dev/null 2>&1 &",
    )


def read_ready_time(lab, host: str, out_path: str) -> float:
    return float(sh(lab, host, f"until [ -s {out_path} ]; do sleep 0.05; done; cat {out_path}", timeout=150))
