"""A launch module for e2e tests: runs the lab's simulated engine with one misbehaviour the lab does not offer.

Installed into the lab venv's site-packages and launched as ``python -m llmops_test_engine <SGLang flags>``
through ``sglang_service_launch_module``. Chosen by environment variables (a unit's EnvironmentFile):

- ``LLMOPS_TEST_EXIT_AFTER_READY=S``: runs the engine as its child, and S seconds after ``/health`` first
  answered 200 exits with status 0 (an engine that dies right after it became ready). SIGTERM is passed on.
- ``LLMOPS_TEST_NEVER_LOAD_ONCE=PATH``: the first launch (PATH does not exist yet; it is created) gets the
  ``never-load`` fault, later launches load normally (a model that failed to load once).
- ``LLMOPS_TEST_CONFIG_TO_ARGS=1``: reads the ``api-key`` of a ``--config`` file and gives the engine
  ``--api-key`` instead, so that it logs the key in ``server_args=ServerArgs(...)`` as SGLang 0.5.23 does with
  the options it merged from its config file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

SIM = "sglang_sim.launch_server"


def _port(argv: list) -> int:
    return int(argv[argv.index("--port") + 1]) if "--port" in argv else 30000


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _exit_after_ready(seconds: float, argv: list) -> int:
    child = subprocess.Popen([sys.executable, "-m", SIM, *argv])
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
    port = _port(argv)
    while child.poll() is None and not _healthy(port):
        time.sleep(0.05)
    if child.poll() is not None:
        return child.returncode
    print(f"llmops_test_engine: /health answered 200; exiting with status 0 in {seconds:g} s", flush=True)
    time.sleep(seconds)
    return 0


def _config_to_args(argv: list) -> list:
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    with open(argv[index + 1], encoding="utf-8") as handle:
        key = next(json.loads(line.split(":", 1)[1]) for line in handle if line.startswith("api-key:"))
    return [*argv[:index], "--api-key", key, *argv[index + 2 :]]


def main() -> int:
    argv = sys.argv[1:]
    if os.environ.get("LLMOPS_TEST_CONFIG_TO_ARGS"):
        argv = _config_to_args(argv)
    exit_after = os.environ.get("LLMOPS_TEST_EXIT_AFTER_READY")
    if exit_after:
        return _exit_after_ready(float(exit_after), argv)
    marker = os.environ.get("LLMOPS_TEST_NEVER_LOAD_ONCE")
    if marker and not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write("the first launch got the never-load fault\n")
        os.environ["SGLANG_SIM_FAULTS"] = ",".join(filter(None, [os.environ.get("SGLANG_SIM_FAULTS"), "never-load"]))
    os.execv(sys.executable, [sys.executable, "-m", SIM, *argv])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
