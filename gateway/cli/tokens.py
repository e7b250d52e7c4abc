"""``tributary tokens issue``: mint a bearer token for a gateway that authenticates by token.

A token is a JWT signed with the private key whose public half the gateways were given
(``--token-public-key-file``, see ``services/tokens.py``); an organisation's identity provider
may issue the same tokens instead. The token is printed on stdout, for a file that
``--token-file`` (or ``$TRIBUTARY_TOKEN_FILE``) then names.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gateway.cli.connect import CliError
from services import tokens

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_lifetime(text: str) -> int:
    """``90``, ``90s``, ``10m``, ``12h``, ``7d`` -> seconds (at least 1)."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a lifetime like 90s, 10m, 12h or 7d")
    seconds = int(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds < 1:
        raise argparse.ArgumentTypeError("the lifetime must be at least 1 s")
    return seconds


def issue(args) -> int:
    try:
        key = tokens.load_private_key(Path(args.private_key).read_bytes())
    except OSError as exc:
        raise CliError(f"cannot read {args.private_key}: {exc.strerror}", 2) from None
    except ValueError as exc:
        raise CliError(f"{args.private_key}: {exc}", 2) from None
    print(
        tokens.issue(key, args.subject, lifetime_s=args.lifetime, issuer=args.issuer, audience=args.audience)
    )
    return 0


def add_parser(commands) -> None:
    """Register ``tokens`` on the CLI's subcommands."""
    parser = commands.add_parser("tokens", help="issue bearer tokens (gateways with --token-public-key-file)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    issuing = actions.add_parser("issue", help="print a signed token for a principal")
    issuing.add_argument(
        "--private-key", required=True, metavar="PEM", help="the signing key (unencrypted PEM)"
    )
    issuing.add_argument("--subject", required=True, help="the principal's name: the token is User:<subject>")
    issuing.add_argument(
        "--lifetime", type=parse_lifetime, default=3600, metavar="DURATION", help="e.g. 10m, 12h (default 1h)"
    )
    issuing.add_argument("--issuer", help="the iss claim (gateways with --token-issuer check it)")
    issuing.add_argument("--audience", help="the aud claim (gateways with --token-audience check it)")
    issuing.set_defaults(func=issue)
