"""Logging setup shared by every service process: one line per event, service name included."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)-5s [{service}] %(name)s: %(message)s"


def configure_logging(service: str, level: str = "INFO", log_file: Path | None = None) -> None:
    """Log to stderr (and ``log_file`` when given) at ``level``; quiet noisy libraries."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=FORMAT.format(service=service),
        handlers=handlers,
        force=True,
    )
    logging.getLogger("grpc").setLevel(logging.WARNING)
    logging.getLogger("asyncio").setLevel(logging.WARNING)
