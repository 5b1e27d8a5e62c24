"""Log lines formatted as SGLang's: "[2025-01-01 12:00:00 TP0] message", to stderr (the journal under systemd)."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("sglang_sim")


def configure(level: str = "info", prefix: str = "") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"[%(asctime)s{prefix}] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


def uvicorn_line(message: str, level: str = "INFO") -> None:
    """Uvicorn's own lines ("INFO:     Started server process [PID]"): the level, a colon, padded to 10."""
    print(f"{level + ':':<10}{message}", file=sys.stderr, flush=True)
