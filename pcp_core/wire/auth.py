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
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TOKEN_ENV = "PCP_TOKEN"
NONCE_BYTES = 32


class AuthError(PermissionError):
    """Missing, unreadable or wrong shared secret."""


def load_secret(token_file: Path | None) -> bytes | None:
    """The secret from `--token-file`, else from $PCP_TOKEN, else None.

    A token file that its group or others may read or write is refused, as ssh refuses
    such a private key: anyone who can read it can join the run, or impersonate it.
    """
    if token_file is not None:
        raw = read_private(token_file, "token file")
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise AuthError(f"token file {token_file} is not UTF-8 text") from None
        if not text:
            raise AuthError(f"token file {token_file} is empty")
        return text.encode()
    value = os.environ.get(TOKEN_ENV, "").strip()
    return value.encode() if value else None


def read_private(path: Path, what: str) -> bytes:
    """The bytes of a file only its owner may read or write; AuthError naming `what`
    otherwise, or where it cannot be read."""
    try:
        with Path(path).open("rb") as file:
            mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
            raw = file.read()
    except OSError as error:
        raise AuthError(f"cannot read {what} {path}: {error.strerror}") from None
    if os.name == "posix" and mode & 0o077:
        raise AuthError(
            f"{what} {path} has mode {mode:04o}, so its group or others may read or write "
            f"it; run `chmod 600 {path}`"
        )
    return raw


def generate_secret() -> bytes:
    return secrets.token_hex(32).encode()


def write_secret(path: Path) -> bytes:
    """Write a fresh secret to `path`, readable and writable by its owner only; return
    it."""
    secret = generate_secret()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, secret)
    return secret


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` with `mode` (its owner's alone), whatever the umask and
    whatever mode a file already there had; a symbolic link there is refused."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), mode)  # an existing file keeps its mode otherwise
        file.write(data)


class Keys(Protocol):
    """How a shepherd knows its workers: a secret for each joining (name, serial), and
    the credentials revoked (`pcp_core.wire.credentials` for per-worker ones)."""

    def secret_for(self, name: str, serial: str) -> bytes:
        """The secret the worker must prove; AuthError where it has none."""

    def refusal(self, name: str, serial: str) -> str | None:
        """Why a worker that proved its secret may not join (revoked), or None."""

    def revoked_now(self) -> set[tuple[str, str]]:
        """The (name, serial) pairs revoked so far."""


@dataclass(frozen=True)
class SharedSecret:
    """One secret for every worker: for a trusted cluster, where any holder may join under
    any name and none can be shut out alone."""

    secret: bytes

    def secret_for(self, name: str, serial: str) -> bytes:
        return self.secret

    def refusal(self, name: str, serial: str) -> str | None:
        return None

    def revoked_now(self) -> set[tuple[str, str]]:
        return set()


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
