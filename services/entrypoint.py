"""What every service's ``main`` does, once: flags from the config dataclass, config loading,
logging, running the asyncio service, and turning failures into one stderr line and an exit code.

Exit codes: 0 clean stop, 1 a service error (the taxonomy's), 2 bad configuration (also a
telemetry exporter that cannot load), 130 interrupted, plus any service-specific ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from services.config import ConfigError, ServiceConfig, add_config_arguments, config_from_args
from services.log_setup import configure_logging

C = TypeVar("C", bound=ServiceConfig)


def build_service_parser(
    prog: str, description: str, config_cls: type, env_prefix: str
) -> argparse.ArgumentParser:
    """A parser with ``--config FILE`` and one flag per field of ``config_cls``.

    ``allow_abbrev`` is off: ``--node`` must not silently mean ``--node-id``.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"{description} Settings: flags > {env_prefix}_* environment > --config file.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config", type=Path, help="TOML or JSON file of settings (Kafka-style names allowed)"
    )
    add_config_arguments(parser, config_cls)
    return parser


def run_service(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    config_cls: type[C],
    env_prefix: str,
    *,
    log_name: Callable[[C], str],
    run: Callable[[C], Coroutine[Any, Any, None]],
    check: Callable[[C], str | None] = lambda config: None,
    exit_codes: Mapping[type[BaseException], int] = {},
) -> int:
    """Parse, load the config, set up logging, run ``run(config)`` until it returns.

    ``check`` returns a problem with a valid-looking config (exit 2); ``exit_codes`` maps a
    service's own startup errors to their codes.
    """
    from services.errors import TributaryError

    prog = parser.prog
    args = parser.parse_args(argv)
    try:
        config = config_from_args(config_cls, args, env_prefix=env_prefix)
    except ConfigError as exc:
        return _fail(prog, exc, 2)
    problem = check(config)
    if problem:
        return _fail(prog, problem, 2)
    configure_logging(log_name(config), config.log_level, config.log_file)
    _log_codec(prog)
    try:
        asyncio.run(run(config))
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:  # e.g. an unknown telemetry exporter, a missing optional package
        return _fail(prog, exc, 2)
    except tuple(exit_codes) as exc:
        return _fail(prog, exc, exit_codes[next(c for c in exit_codes if isinstance(exc, c))])
    except TributaryError as exc:
        return _fail(prog, exc, 1)
    return 0


def write_ready_file(path: Path | None, info: Mapping[str, object]) -> None:
    """Announce a started service: ``info`` as JSON at ``path`` (nothing when None), replaced
    atomically so a launcher polling for it never reads half a file (``launcher/processes.py``)."""
    if path is None:
        return
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(dict(info)))
    tmp.replace(path)


def _log_codec(prog: str) -> None:
    """Say once which record codec runs: pip hides the build warning when the C accelerator
    could not be compiled, so the service log is where an operator sees it."""
    import logging

    from services.records import speedups_enabled

    if speedups_enabled():
        logging.getLogger(prog).info("record codec: C accelerator (services.records._speedups)")
    else:
        logging.getLogger(prog).warning(
            "record codec: pure Python (the C accelerator was not built or TRIBUTARY_NO_EXTENSIONS is set); "
            "per-record work is several times slower"
        )


def _fail(prog: str, problem: object, code: int) -> int:
    print(f"{prog}: {problem}", file=sys.stderr)
    return code
