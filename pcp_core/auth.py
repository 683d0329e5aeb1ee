"""The shared secret and the HMAC challenge–response of the join handshake.

Both sides prove they know the secret without sending it: the shepherd sends a
nonce, the worker answers HMAC(secret, "worker" + shepherd nonce + worker nonce) and
its own nonce, the shepherd answers HMAC(secret, "shepherd" + worker nonce + shepherd
nonce). A peer without the secret gets no program, no parameters, and cannot send results.
"""

import hashlib
import hmac
import ipaddress
import os
import secrets
from pathlib import Path

TOKEN_ENV = "PCP_TOKEN"
NONCE_BYTES = 32


class AuthError(PermissionError):
    """Missing, unreadable or wrong shared secret."""


def load_secret(token_file: Path | None) -> bytes | None:
    """The secret from `--token-file`, else from $PCP_TOKEN, else None."""
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise AuthError(f"cannot read token file {token_file}: {error.strerror}") from None
        if not text:
            raise AuthError(f"token file {token_file} is empty")
        return text.encode()
    value = os.environ.get(TOKEN_ENV, "").strip()
    return value.encode() if value else None


def generate_secret() -> bytes:
    return secrets.token_hex(32).encode()


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def worker_proof(secret: bytes, shepherd_nonce: bytes, worker_nonce: bytes) -> bytes:
    return hmac.new(secret, b"worker" + shepherd_nonce + worker_nonce, hashlib.sha256).digest()


def shepherd_proof(secret: bytes, shepherd_nonce: bytes, worker_nonce: bytes) -> bytes:
    return hmac.new(secret, b"shepherd" + worker_nonce + shepherd_nonce, hashlib.sha256).digest()


def matches(expected: bytes, received: bytes) -> bool:
    return hmac.compare_digest(expected, received)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
