"""The main process once its schedulers have loaded: HTTP, warm-up, signals, the SIGTERM drain, the exits.

Who owns SIGTERM follows the real process:

- until TokenizerManager.auto_create_handle_loop runs (the first request that reaches it: the warm-up's
  /generate, a /health that generates, /server_info, ...), uvicorn's `capture_signals` handler: uvicorn shuts
  down ("Shutting down", waits for open requests, lifespan shutdown) and then re-raises SIGTERM with the default
  action, so the process ends killed by SIGTERM and its children by their parent-death SIGKILL
  (uvicorn/server.py);
- from then on SignalHandler.sigterm_handler (tokenizer_manager.py): it only sets `gracefully_exit`; the
  `sigterm_watchdog` coroutine, which checks that flag every 5 s from when the handle loop started, then logs
  "Gracefully exiting... Remaining number of requests N. ..." every 5 s for as long as any request remains
  (no upper bound; requests keep being admitted), unless the last health check failed (UnHealthy: "Force
  exiting") or SGL_FORCE_SHUTDOWN is set; then it stops the subprocess watchdog, sends ShutdownReq, waits up
  to 15 s for the schedulers (_SCHEDULER_EXIT_TIMEOUT_SECS), names the stragglers, kill_process_tree's the
  children, and stops uvicorn; launch_server's `finally` kills the tree once more and the process exits 0.

SIGQUIT (a child's failure, or the subprocess watchdog) kills the whole tree, this process included (exit 137
as systemd sees it): launch_phase_sigquit_handler before the handle loop exists (engine.py), then
running_phase_sigquit_handler.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from . import faults, logs
from .engine import ClientGone, new_request, parse_sampling
from .http_api import SimHTTPServer
from .state import STARTING, UNHEALTHY, UP, ServerState
from .supervisor import Supervisor

logger = logging.getLogger("sglang_sim")

SCHEDULER_EXIT_TIMEOUT_S = 15.0  # _SCHEDULER_EXIT_TIMEOUT_SECS
UVICORN_TICK_S = 0.1  # uvicorn's main loop checks should_exit every 0.1 s
WARMUP_PROMPT = "The capital city of France is"
DEFAULT_WARMUP_TIMEOUT_S = 600.0  # SGLANG_WARMUP_TIMEOUT <= 0: requests.post(timeout=600)
SLOW_DRAIN_RID = "slow-drain"
TRUE_VALUES = ("true", "1")  # get_bool_env_var


class Lifecycle:
    def __init__(self, ns, state: ServerState, supervisor: Supervisor, httpd: SimHTTPServer):
        self.ns = ns
        self.state = state
        self.supervisor = supervisor
        self.httpd = httpd
        self.uvicorn_exit = threading.Event()
        self.captured: list[int] = []
        self.warmup_thread: threading.Thread | None = None
        self.slow_drain_until: float | None = None

    # -- signals ----------------------------------------------------------------------------------------------
    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGQUIT, self._on_sigquit)

    def _tm_owns_sigterm(self) -> bool:
        return self.state.first_request.is_set()

    def _on_sigterm(self, signum, frame) -> None:
        if self._tm_owns_sigterm():
            # loop.add_signal_handler calls the handler without arguments.
            logger.warning("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
            self.state.gracefully_exit = True
            return
        self.captured.append(signum)
        self.uvicorn_exit.set()

    def _on_sigint(self, signum, frame) -> None:
        # SignalHandler takes SIGTERM only; SIGINT stays uvicorn's.
        self.captured.append(signum)
        self.uvicorn_exit.set()

    def _on_sigquit(self, signum, frame) -> None:
        if self._tm_owns_sigterm():
            logger.error("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
            self.supervisor.stop_watchdog()
        else:
            logger.error("Received sigquit from a child process. It usually means the child failed.")
        self.supervisor.kill_process_tree(include_parent=True)

    # -- serving ----------------------------------------------------------------------------------------------
    def serve(self) -> int:
        """Answer HTTP until a signal ends the process; returns the exit status of a clean end."""
        self.httpd.server_activate()
        threading.Thread(target=self.httpd.serve_forever, args=(UVICORN_TICK_S,), name="http", daemon=True).start()
        logs.uvicorn_line(f"Uvicorn running on http://{self.ns.host}:{self.ns.port} (Press CTRL+C to quit)")
        while True:
            if self.uvicorn_exit.wait(UVICORN_TICK_S):
                return self._uvicorn_shutdown(reraise=True)
            if self._tm_owns_sigterm():
                break
        return self._sigterm_watchdog()

    def start_warmup(self) -> None:
        self.warmup_thread = threading.Thread(target=self._warmup, name="warmup", daemon=True)
        self.warmup_thread.start()

    def _warmup(self) -> None:
        """_wait_and_warmup / _execute_server_warmup: wait for /model_info, then one 8-token /generate."""
        if self.ns.skip_server_warmup:
            self.state.set_status(UP)
            logger.info("The server is fired up and ready to roll!")
            return
        time.sleep(self.ns.sim_warmup_time)
        timeout = self.ns.warmup_timeout if self.ns.warmup_timeout > 0 else DEFAULT_WARMUP_TIMEOUT_S
        deadline = time.monotonic() + timeout
        sampling = parse_sampling({"max_new_tokens": 8, "temperature": 0.0})
        request = new_request(WARMUP_PROMPT, None, sampling, False, warmup=True)
        try:
            self.state.generate(request, client_gone=lambda: time.monotonic() >= deadline)
        except ClientGone:
            logger.error(
                "Initialization failed. warmup error: Traceback (most recent call last):\n"
                "requests.exceptions.ReadTimeout: HTTPConnectionPool(host='%s', port=%s): Read timed out. "
                "(read timeout=%g)",
                self.ns.host,
                self.ns.port,
                timeout,
            )
            self.supervisor.kill_process_tree(include_parent=True)
            return
        if self.state.status == STARTING:
            self.state.set_status(UP)
        logger.info("The server is fired up and ready to roll!")

    # -- the two SIGTERM paths --------------------------------------------------------------------------------
    def _uvicorn_shutdown(self, reraise: bool) -> int:
        logs.uvicorn_line("Shutting down")
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.httpd.active_requests():
            logs.uvicorn_line("Waiting for connections to close. (CTRL+C to force quit)")
            self.httpd.wait_idle()
        logs.uvicorn_line("Waiting for application shutdown.")
        if self.warmup_thread is not None:
            self.warmup_thread.join()
        logs.uvicorn_line("Application shutdown complete.")
        logs.uvicorn_line(f"Finished server process [{os.getpid()}]")
        if reraise and self.captured:
            logging.shutdown()
            signum = self.captured[-1]
            if signum == signal.SIGINT:
                self.supervisor.kill_process_tree(include_parent=False)
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        return 0

    def _drain_remaining(self) -> list[str]:
        remaining = self.state.remaining()
        if self.slow_drain_until is not None and time.monotonic() < self.slow_drain_until:
            remaining.append(SLOW_DRAIN_RID)
        return remaining

    def _sigterm_watchdog(self) -> int:
        while not self.state.gracefully_exit:
            if self._sleep_to_next_tick() and self.uvicorn_exit.is_set():
                return self._uvicorn_shutdown(reraise=True)
        if faults.SLOW_DRAIN in self.ns.faults:
            self.slow_drain_until = time.monotonic() + self.ns.sim_drain_time
        while True:
            remaining = self._drain_remaining()
            if self.state.status == UNHEALTHY:
                logger.error("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if os.environ.get("SGL_FORCE_SHUTDOWN", "false").lower() in TRUE_VALUES:
                logger.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            logger.info(
                "Gracefully exiting... Remaining number of requests %d. Remaining requests remaining_rids=%r.",
                len(remaining),
                remaining,
            )
            if not remaining:
                break
            time.sleep(self.ns.sim_sigterm_poll)
        return self._shutdown()

    def _sleep_to_next_tick(self) -> bool:
        """Sleep to the watchdog's next tick (every 5 s in SGLang: sigterm_watchdog's asyncio.sleep(5); the
        sigterm-poll knob); True when uvicorn was asked to exit meanwhile (SIGINT)."""
        poll = self.ns.sim_sigterm_poll
        elapsed = time.monotonic() - self.state.handle_loop_started
        delay = poll - (elapsed % poll)
        return self.uvicorn_exit.wait(delay)

    def _shutdown(self) -> int:
        self.supervisor.stop_watchdog()
        if not self.state.engine.stuck:  # a scheduler stuck in a forward pass never reads its ShutdownReq
            self.supervisor.send_shutdown()
        deadline = time.monotonic() + SCHEDULER_EXIT_TIMEOUT_S
        while time.monotonic() < deadline and self.supervisor.live_schedulers():
            time.sleep(0.1)
        stragglers = [c.pid for c in self.supervisor.live_schedulers()]
        if stragglers:
            logger.warning(
                "Schedulers still alive %ss after ShutdownReq, killing them before they released: %s",
                int(SCHEDULER_EXIT_TIMEOUT_S),
                stragglers,
            )
        self.supervisor.kill_process_tree(include_parent=False)
        self.state.engine.stop()
        self._uvicorn_shutdown(reraise=False)
        return 0
