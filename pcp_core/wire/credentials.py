"""Per-worker credentials: an identity for each worker, which its operator can revoke.

A shared secret cannot tell one holder from another, nor shut one machine out. Here the
shepherd's operator keeps one *issuer key* (a file, mode 0600) and issues each worker a
credential of its own with `pcp token issue NAME`: the worker's name, a serial, and a
secret derived from the issuer key, the name and the serial by HKDF-SHA256
(`cryptography`). The worker proves its secret in the same challenge–response the
shared secret uses (`pcp_core.wire.auth`), so the name it joins under is proven, and
the shepherd, holding only the issuer key, derives any worker's secret when it joins:
there is no list of secrets to leak or keep in sync.

Beside the key, two files the shepherd reads and `pcp token` writes, one JSON object a
line: `KEY.issued` (every credential issued) and `KEY.revoked` (every one revoked). A
running shepherd re-reads the revocation list when it changes: a revoked worker is
disconnected at once, its result is left out of the round in flight, and it is refused
when it tries to join again. Re-issuing a name gives a new serial, so a revoked machine's
old credential stays revoked.
"""

import json
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcp_core.wire.auth import AuthError, read_private, write_private

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}")
SERIAL_BYTES = 8
KEY_BYTES = 32
INFO_LABEL = b"pcp worker credential v1"


@dataclass(frozen=True)
class Credential:
    """What a worker holds: its name, the serial of this credential, and its secret."""

    name: str
    serial: str
    secret: bytes

    def to_json(self) -> str:
        fields = {"name": self.name, "serial": self.serial, "secret": self.secret.decode()}
        return json.dumps(fields) + "\n"


def derive(issuer_key: bytes, name: str, serial: str) -> bytes:
    """The secret of credential (`name`, `serial`) under `issuer_key`, as hex bytes."""
    from cryptography.hazmat.primitives import hashes  # here: only a shepherd needs it
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = b"\0".join((INFO_LABEL, name.encode(), serial.encode()))
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(issuer_key)
    return key.hex().encode()


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise AuthError(
            f"a worker's name is 1-64 letters, digits and _.@+- (starting with a letter or "
            f"digit), not {name[:80]!r}"
        )
    return name


def load_credential(path: Path) -> Credential:
    """A worker's credential file, as `pcp token issue` wrote it."""
    raw = read_private(path, "credential file")
    try:
        fields = json.loads(raw)
        credential = Credential(fields["name"], fields["serial"], fields["secret"].encode())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise AuthError(
            f"credential file {path} is not a credential written by `pcp token issue`"
        ) from None
    check_name(credential.name)
    return credential


def _lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a list file, one a line; a missing file is an empty list."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except ValueError:
                raise AuthError(f"{path}, line {number}: not a JSON object") from None
    return entries


class Issuer:
    """The operator's issuer key and the lists beside it (`pcp token`)."""

    def __init__(self, key_path: Path) -> None:
        self.key_path = Path(key_path)
        self.issued_path = self.key_path.with_name(self.key_path.name + ".issued")
        self.revoked_path = self.key_path.with_name(self.key_path.name + ".revoked")

    def key(self, create: bool = False) -> bytes:
        """The issuer key; made (mode 0600) where `create` and none is there yet."""
        if create and not self.key_path.exists():
            self.key_path.parent.mkdir(parents=True, exist_ok=True)
            write_private(self.key_path, secrets.token_hex(KEY_BYTES).encode() + b"\n")
        raw = read_private(self.key_path, "issuer key").strip()
        if len(raw) < KEY_BYTES:
            raise AuthError(f"issuer key {self.key_path} is too short to be one")
        return raw

    def issue(self, name: str) -> Credential:
        """A new credential for `name`, recorded in KEY.issued."""
        serial = secrets.token_hex(SERIAL_BYTES)
        credential = Credential(check_name(name), serial, derive(self.key(True), name, serial))
        self._append(self.issued_path, {"name": name, "serial": serial})
        return credential

    def revoke(self, name: str) -> list[str]:
        """Revoke every credential issued to `name` so far; the serials revoked."""
        done = {(e["name"], e["serial"]) for e in _lines(self.revoked_path)}
        serials = [
            e["serial"]
            for e in _lines(self.issued_path)
            if e["name"] == name and (name, e["serial"]) not in done
        ]
        for serial in serials:
            self._append(self.revoked_path, {"name": name, "serial": serial})
        return serials

    def issued(self) -> list[dict[str, Any]]:
        """Every credential issued, each with whether it is revoked."""
        revoked = {(e["name"], e["serial"]) for e in _lines(self.revoked_path)}
        return [
            {**entry, "revoked": (entry["name"], entry["serial"]) in revoked}
            for entry in _lines(self.issued_path)
        ]

    @staticmethod
    def _append(path: Path, entry: dict[str, Any]) -> None:
        line = json.dumps({**entry, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        with path.open("a") as file:
            file.write(line + "\n")


class IssuedKeys:
    """The shepherd's side: each joining worker's secret, and the revocation list,
    re-read whenever its file changes (`revoked_now`)."""

    def __init__(self, key_path: Path) -> None:
        self.issuer = Issuer(key_path)
        self._key = self.issuer.key()
        self._lock = threading.Lock()
        self._seen: tuple[float, int] | None = None
        self._revoked: set[tuple[str, str]] = set()
        self.revoked_now()

    def secret_for(self, name: str, serial: str) -> bytes:
        if not serial:
            raise AuthError(
                "this shepherd admits workers by their own credential (`pcp token issue`, "
                "then `pcp worker --credential FILE`), not by a shared secret"
            )
        check_name(name)
        return derive(self._key, name, serial)

    def refusal(self, name: str, serial: str) -> str | None:
        """Why a worker that proved (`name`, `serial`) may not join, or None."""
        if (name, serial) in self.revoked_now():
            return f"the credential of {name} (serial {serial}) is revoked"
        return None

    def revoked_now(self) -> set[tuple[str, str]]:
        """The revoked (name, serial) pairs, re-read if the file changed."""
        path = self.issuer.revoked_path
        try:
            status = path.stat()
            seen = (status.st_mtime, status.st_size)
        except FileNotFoundError:
            seen = (0.0, 0)
        with self._lock:
            if seen != self._seen:
                self._revoked = {(e["name"], e["serial"]) for e in _lines(path)}
                self._seen = seen
            return set(self._revoked)
