"""Bearer tokens: how a client that holds no certificate proves who it is (Kafka's SASL/OAUTHBEARER).

Why signed tokens rather than SCRAM-style salted passwords in etcd: the gateway stays stateless
(it verifies a signature with a public key it was given; no credential lookup, no extra round
trip per connection, nothing secret in etcd), a token works from any language's gRPC library as
standard call credentials (``authorization: Bearer <token>``), and an organisation's identity
provider can issue the tokens (Kafka's KIP-768 validates the same JWTs). Revocation is by
expiry: tokens are short-lived, and a long-lived data connection is closed when its token
expires (Kafka's KIP-368 re-authentication), so the client reconnects with a fresh one.

Format: a JSON Web Token (RFC 7519) in compact form, ``header.payload.signature``, each part
base64url without padding. The header's ``alg`` must match the configured key: ``EdDSA``
(Ed25519), ``RS256``/``RS384``/``RS512`` (RSA, PKCS#1 v1.5) or ``ES256``/``ES384`` (ECDSA
P-256/P-384); ``none`` and any other algorithm are refused. Claims: ``sub`` (the principal's
name, required: the principal is ``User:<sub>``), ``exp`` (required, seconds since the epoch),
``nbf`` and ``iat`` (optional), ``iss`` and ``aud`` (checked when the gateway is configured with
an issuer / audience). Clocks may differ by :data:`LEEWAY_S`.

Pure apart from :meth:`TokenVerifier.from_file` (which re-reads its key file when it changes,
so a key is rotated without a restart).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from services import errors

#: Clock difference tolerated on ``exp`` and ``nbf``.
LEEWAY_S = 30
#: A token longer than this is refused before it is parsed (a JWT is a few hundred bytes).
MAX_TOKEN_BYTES = 8192
#: Longest subject (the principal's name).
MAX_SUBJECT_CHARS = 255
#: How many verified tokens are remembered (a verification costs a signature check).
CACHE_SIZE = 4096
#: A key file is looked at (stat) at most this often for changes.
KEY_RECHECK_S = 1.0

_RSA_HASHES: dict[str, Callable[[], hashes.HashAlgorithm]] = {
    "RS256": hashes.SHA256,
    "RS384": hashes.SHA384,
    "RS512": hashes.SHA512,
}
_EC_HASHES: dict[str, tuple[Callable[[], hashes.HashAlgorithm], int]] = {
    "ES256": (hashes.SHA256, 32),
    "ES384": (hashes.SHA384, 48),
}

PublicKey = ed25519.Ed25519PublicKey | rsa.RSAPublicKey | ec.EllipticCurvePublicKey
PrivateKey = ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """A token that checked out: whose it is and until when (seconds since the epoch)."""

    subject: str
    expires_at: float

    @property
    def principal(self) -> str:
        return f"User:{self.subject}"


def _refused(why: str) -> errors.SaslAuthenticationFailedError:
    return errors.SaslAuthenticationFailedError(f"the bearer token was refused: {why}")


def _b64decode(part: str) -> bytes:
    try:
        return base64.b64decode(part + "=" * (-len(part) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _refused("it is not base64url") from exc


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def algorithms_for(key: PublicKey | PrivateKey) -> tuple[str, ...]:
    """The ``alg`` values a key can verify (or sign, the first being the one it signs with)."""
    if isinstance(key, ed25519.Ed25519PublicKey | ed25519.Ed25519PrivateKey):
        return ("EdDSA",)
    if isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        return tuple(_RSA_HASHES)
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        if isinstance(key.curve, ec.SECP256R1):
            return ("ES256",)
        if isinstance(key.curve, ec.SECP384R1):
            return ("ES384",)
    raise ValueError(
        f"tokens are signed with Ed25519, RSA or ECDSA P-256/P-384 keys, not {type(key).__name__}"
    )


def load_public_key(pem: bytes) -> PublicKey:
    """A PEM public key (ValueError when it is none of the supported kinds)."""
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise ValueError(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, ed25519.Ed25519PublicKey | rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise ValueError(f"tokens are verified with Ed25519, RSA or ECDSA keys, not {type(key).__name__}")
    algorithms_for(key)
    return key


def load_private_key(pem: bytes) -> PrivateKey:
    """A PEM private key (unencrypted) to sign tokens with."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ValueError(f"tokens are signed with Ed25519, RSA or ECDSA keys, not {type(key).__name__}")
    algorithms_for(key)
    return key


def _verify_signature(key: PublicKey, alg: str, signature: bytes, signed: bytes) -> None:
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, signed)
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, signed, padding.PKCS1v15(), _RSA_HASHES[alg]())
        else:
            hash_type, size = _EC_HASHES[alg]
            if len(signature) != 2 * size:
                raise InvalidSignature
            r = int.from_bytes(signature[:size], "big")
            s = int.from_bytes(signature[size:], "big")
            key.verify(encode_dss_signature(r, s), signed, ec.ECDSA(hash_type()))
    except InvalidSignature as exc:
        raise _refused("its signature does not match the gateway's key") from exc


def _sign(key: PrivateKey, alg: str, signed: bytes) -> bytes:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(signed)
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(signed, padding.PKCS1v15(), _RSA_HASHES[alg]())
    hash_type, size = _EC_HASHES[alg]
    r, s = decode_dss_signature(key.sign(signed, ec.ECDSA(hash_type())))
    return r.to_bytes(size, "big") + s.to_bytes(size, "big")


def _number(claims: dict[str, Any], name: str, *, required: bool) -> float | None:
    value = claims.get(name)
    if value is None:
        if required:
            raise _refused(f"it has no {name!r} claim")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refused(f"its {name!r} claim is not a number")
    return float(value)


def check_claims(
    claims: dict[str, Any], *, now: float, issuer: str | None = None, audience: str | None = None
) -> VerifiedToken:
    """The token's subject and expiry once its claims hold at ``now``; else refused."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise _refused("it names no subject ('sub')")
    if len(subject) > MAX_SUBJECT_CHARS or any(ord(c) < 0x20 or c == "\x7f" for c in subject):
        raise _refused("its subject is too long or holds control characters")
    expires_at = _number(claims, "exp", required=True)
    assert expires_at is not None
    if now > expires_at + LEEWAY_S:
        raise _refused(f"it expired at {expires_at:.0f} (now {now:.0f})")
    not_before = _number(claims, "nbf", required=False)
    if not_before is not None and now + LEEWAY_S < not_before:
        raise _refused(f"it is not valid before {not_before:.0f} (now {now:.0f})")
    if issuer is not None and claims.get("iss") != issuer:
        raise _refused(f"its issuer is {claims.get('iss')!r}, the gateway expects {issuer!r}")
    if audience is not None:
        given = claims.get("aud")
        audiences = given if isinstance(given, list) else [given]
        if audience not in audiences:
            raise _refused(f"its audience {given!r} does not include {audience!r}")
    return VerifiedToken(subject, expires_at)


def verify(
    token: str,
    key: PublicKey,
    *,
    now: float,
    issuer: str | None = None,
    audience: str | None = None,
) -> VerifiedToken:
    """Check a compact JWT against ``key`` at ``now``: SaslAuthenticationFailedError if it fails."""
    if len(token) > MAX_TOKEN_BYTES:
        raise _refused(f"it is longer than {MAX_TOKEN_BYTES} bytes")
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        raise _refused("it is not a signed JSON Web Token (header.payload.signature)")
    try:
        header = json.loads(_b64decode(parts[0]))
        claims = json.loads(_b64decode(parts[1]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _refused("its header or claims are not JSON") from exc
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise _refused("its header or claims are not JSON objects")
    alg = header.get("alg")
    if alg not in algorithms_for(key):
        raise _refused(
            f"it is signed with {alg!r}; the gateway's key verifies {'/'.join(algorithms_for(key))}"
        )
    if "crit" in header:
        raise _refused("it names critical header extensions the gateway does not know")
    _verify_signature(key, alg, _b64decode(parts[2]), f"{parts[0]}.{parts[1]}".encode())
    return check_claims(claims, now=now, issuer=issuer, audience=audience)


def issue(
    key: PrivateKey,
    subject: str,
    *,
    lifetime_s: float,
    now: float | None = None,
    issuer: str | None = None,
    audience: str | None = None,
) -> str:
    """A token for ``subject`` valid ``lifetime_s`` seconds (for operators and tests; an identity
    provider issuing the same JWTs works as well)."""
    if not subject or lifetime_s <= 0:
        raise ValueError("a token needs a subject and a positive lifetime")
    issued = time.time() if now is None else now
    alg = algorithms_for(key)[0]
    claims: dict[str, Any] = {"sub": subject, "iat": int(issued), "exp": int(issued + lifetime_s)}
    if issuer is not None:
        claims["iss"] = issuer
    if audience is not None:
        claims["aud"] = audience
    head = _b64encode(json.dumps({"alg": alg, "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64encode(json.dumps(claims, separators=(",", ":")).encode())
    signature = _sign(key, alg, f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64encode(signature)}"


class TokenVerifier:
    """The gateway's token check: a public key (re-read when its file changes), the expected
    issuer and audience, and a bounded cache of tokens already verified. Thread-safe."""

    def __init__(
        self,
        key: PublicKey,
        *,
        issuer: str | None = None,
        audience: str | None = None,
        clock: Callable[[], float] = time.time,
        key_file: Path | None = None,
    ) -> None:
        self._key = key
        self.issuer = issuer
        self.audience = audience
        self._clock = clock
        self._key_file = key_file
        self._key_stamp = _stamp(key_file) if key_file is not None else None
        self._next_key_check = 0.0
        self._cache: OrderedDict[str, VerifiedToken] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_file(
        cls, path: Path, *, issuer: str | None = None, audience: str | None = None
    ) -> TokenVerifier:
        """ValueError when the file is missing or holds no supported public key."""
        try:
            pem = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read the token public key {path}: {exc.strerror}") from exc
        return cls(load_public_key(pem), issuer=issuer, audience=audience, key_file=path)

    def verify(self, token: str) -> VerifiedToken:
        """The token's subject and expiry, or SaslAuthenticationFailedError."""
        now = self._clock()
        with self._lock:
            self._maybe_reload(now)
            known = self._cache.get(token)
            if known is not None:
                self._cache.move_to_end(token)
        if known is not None:
            if now > known.expires_at + LEEWAY_S:
                raise _refused(f"it expired at {known.expires_at:.0f} (now {now:.0f})")
            return known
        verified = verify(token, self._key, now=now, issuer=self.issuer, audience=self.audience)
        with self._lock:
            self._cache[token] = verified
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return verified

    def _maybe_reload(self, now: float) -> None:
        if self._key_file is None or now < self._next_key_check:
            return
        self._next_key_check = now + KEY_RECHECK_S
        stamp = _stamp(self._key_file)
        if stamp == self._key_stamp:
            return
        try:
            key = load_public_key(self._key_file.read_bytes())
        except (OSError, ValueError):
            return  # mid-rotation (half-written file): keep the old key, look again soon
        self._key, self._key_stamp = key, stamp
        self._cache.clear()  # tokens of the old key are checked again


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size
