"""Bearer tokens (services/tokens.py): what is accepted, what is refused and why."""

from __future__ import annotations

import base64
import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from services import errors, tokens

NOW = 1_800_000_000.0


def _keys():
    return {
        "ed25519": ed25519.Ed25519PrivateKey.generate(),
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "p256": ec.generate_private_key(ec.SECP256R1()),
    }


KEYS = _keys()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _public_pem(key) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_token_issued_with_each_kind_of_key_verifies_to_its_subject(kind):
    key = KEYS[kind]
    token = tokens.issue(key, "alice", lifetime_s=600, now=NOW, issuer="idp", audience="tributary")
    verified = tokens.verify(
        token, tokens.load_public_key(_public_pem(key)), now=NOW + 1, issuer="idp", audience="tributary"
    )
    assert verified.principal == "User:alice"
    assert verified.expires_at == NOW + 600


def _refusal(token: str, key=KEYS["ed25519"], **checks) -> str:
    with pytest.raises(errors.SaslAuthenticationFailedError) as refused:
        tokens.verify(token, key.public_key(), **{"now": NOW, **checks})
    assert refused.value.reason == "SASL_AUTHENTICATION_FAILED"
    return str(refused.value)


def test_expired_not_yet_valid_wrong_issuer_and_wrong_audience_are_refused():
    key = KEYS["ed25519"]
    assert "expired" in _refusal(tokens.issue(key, "a", lifetime_s=10, now=NOW - 100))
    early = _forge({"alg": "EdDSA"}, {"sub": "a", "exp": NOW + 999, "nbf": NOW + 500}, key)
    assert "not valid before" in _refusal(early)
    assert "issuer" in _refusal(tokens.issue(key, "a", lifetime_s=60, now=NOW, issuer="x"), issuer="idp")
    wrong_audience = tokens.issue(key, "a", lifetime_s=60, now=NOW, audience="other")
    assert "audience" in _refusal(wrong_audience, audience="tributary")


def test_the_leeway_lets_a_token_just_past_its_expiry_through():
    key = KEYS["ed25519"]
    token = tokens.issue(key, "a", lifetime_s=10, now=NOW)
    assert tokens.verify(token, key.public_key(), now=NOW + 10 + tokens.LEEWAY_S).subject == "a"


def _forge(header: dict, claims: dict, key=None, signature: bytes | None = None) -> str:
    head = _b64(json.dumps(header).encode())
    body = _b64(json.dumps(claims).encode())
    if signature is None:
        signature = key.sign(f"{head}.{body}".encode()) if key is not None else b""
    return f"{head}.{body}.{_b64(signature)}"


def test_forgeries_are_refused():
    key = KEYS["ed25519"]
    claims = {"sub": "admin", "exp": NOW + 600}
    # alg none, an empty signature, another key's signature, an algorithm the key does not do.
    assert "signed JSON Web Token" in _refusal(_forge({"alg": "none"}, claims, signature=b""))
    assert "'none'" in _refusal(_forge({"alg": "none"}, claims, signature=b"x"))
    other = ed25519.Ed25519PrivateKey.generate()
    assert "signature does not match" in _refusal(_forge({"alg": "EdDSA"}, claims, other))
    assert "'RS256'" in _refusal(_forge({"alg": "RS256"}, claims, signature=b"x" * 256))
    # A valid token with its claims changed afterwards.
    head, _, signature = tokens.issue(key, "alice", lifetime_s=600, now=NOW).split(".")
    tampered = f"{head}.{_b64(json.dumps(claims).encode())}.{signature}"
    assert "signature does not match" in _refusal(tampered)


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("", "signed JSON Web Token"),
        ("a.b", "signed JSON Web Token"),
        ("a.b.c.d", "signed JSON Web Token"),
        ("!!!.###.$$$", "base64url"),
        (f"{_b64(b'[1]')}.{_b64(b'{}')}.{_b64(b'x')}", "JSON objects"),
        (f"{_b64(b'{')}.{_b64(b'{}')}.{_b64(b'x')}", "not JSON"),
        ("x" * (tokens.MAX_TOKEN_BYTES + 1), "longer than"),
    ],
)
def test_malformed_tokens_are_refused_with_a_reason(token, why):
    assert why in _refusal(token)


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"exp": NOW + 60}, "names no subject"),
        ({"sub": "", "exp": NOW + 60}, "names no subject"),
        ({"sub": 5, "exp": NOW + 60}, "names no subject"),
        ({"sub": "a\nb", "exp": NOW + 60}, "control characters"),
        ({"sub": "a"}, "no 'exp' claim"),
        ({"sub": "a", "exp": "later"}, "not a number"),
        ({"sub": "a", "exp": True}, "not a number"),
    ],
)
def test_claims_that_do_not_hold_are_refused(claims, why):
    assert why in _refusal(_forge({"alg": "EdDSA"}, claims, KEYS["ed25519"]))


def test_the_verifier_caches_checks_expires_cached_tokens_and_follows_its_key_file(tmp_path):
    clock = [NOW]
    path = tmp_path / "token.pub"
    first, second = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    path.write_bytes(_public_pem(first))
    verifier = tokens.TokenVerifier.from_file(path)
    verifier._clock = lambda: clock[0]
    token = tokens.issue(first, "alice", lifetime_s=60, now=NOW)
    assert verifier.verify(token).subject == "alice"
    assert verifier.verify(token).subject == "alice"  # from the cache
    clock[0] = NOW + 60 + tokens.LEEWAY_S + 1
    with pytest.raises(errors.SaslAuthenticationFailedError, match="expired"):
        verifier.verify(token)  # a cached token expires too
    # Rotation: the file now holds another key; tokens of the old one stop verifying.
    path.write_bytes(_public_pem(second))
    os.utime(path, ns=(1, 1))
    clock[0] += tokens.KEY_RECHECK_S + 1
    with pytest.raises(errors.SaslAuthenticationFailedError, match="signature"):
        verifier.verify(tokens.issue(first, "alice", lifetime_s=60, now=clock[0]))
    assert verifier.verify(tokens.issue(second, "bob", lifetime_s=60, now=clock[0])).subject == "bob"


def test_key_files_that_are_not_keys_are_refused(tmp_path):
    path = tmp_path / "bad.pem"
    path.write_text("not a key")
    with pytest.raises(ValueError, match="not a PEM public key"):
        tokens.TokenVerifier.from_file(path)
    with pytest.raises(ValueError, match="cannot read"):
        tokens.TokenVerifier.from_file(tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="unencrypted PEM private key"):
        tokens.load_private_key(b"nope")
