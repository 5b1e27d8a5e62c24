"""GET /health and /health_generate, as sglang/srt/entrypoints/http_server.py `health_generate` answers them.

- shutting down (`gracefully_exit`): 503 at once, logged "Health check request received during shutdown.";
- still starting: 503;
- /health with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION false (sglang/srt/environ.py; default true): 200;
- otherwise a one-token generation (rid HEALTH_CHECK_<hex>, in rid_to_state while it waits) is sent, and
  every second (`await asyncio.sleep(1)` first) the handler checks whether anything arrived from the
  scheduler since it started: if so 200 (and the server is Up again); after SGLANG_HEALTH_CHECK_TIMEOUT
  seconds (default 20, read once at import: `int(os.getenv(...))`) 503, logged, and the server UnHealthy.
  A busy scheduler skips the check and answers it after its next batch ("If the server is running
  something, this request will be ignored"); a stuck one never answers.
"""

from __future__ import annotations

import logging
import time
import uuid

from .state import STARTING, UNHEALTHY, UP, ServerState

logger = logging.getLogger("sglang_sim")
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"  # sglang/srt/constants.py
CHECK_INTERVAL_S = 1.0


def health_generate(state: ServerState, path: str) -> int:
    """The HTTP status of one health request (blocks for at least a second when it generates)."""
    if state.gracefully_exit:
        logger.info("Health check request received during shutdown. Returning 503.")
        return 503
    if state.status == STARTING:
        return 503
    if not state.ns.health_generates and path == "/health":
        return 200
    rid = f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}"
    state.enter(rid)
    tic = time.monotonic()
    tic_wall = time.time()
    ack_at = state.engine.health_ack_at()
    timeout = state.ns.health_check_timeout
    try:
        while time.monotonic() < tic + timeout:
            time.sleep(CHECK_INTERVAL_S)
            if ack_at is not None and ack_at <= time.monotonic():
                state.engine.note_receive()
                state.set_status(UP)
                return 200
        logger.error(
            "Health check failed. Server couldn't get a response from detokenizer for last %s seconds. "
            "tic start time: %s. last_heartbeat time: %s",
            timeout,
            time.strftime("%H:%M:%S", time.localtime(tic_wall)),
            time.strftime("%H:%M:%S", time.localtime(state.engine.last_receive_wall)),
        )
        state.set_status(UNHEALTHY)
        return 503
    finally:
        state.leave(rid)
