"""Per-worker credentials: issued under the shepherd's issuer key, proven at join, named
in every line, revoked while a run goes on (pcp_core.wire.credentials, `pcp token`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcp_core.wire.auth import AuthError, SharedSecret
from pcp_core.wire.credentials import IssuedKeys, Issuer, derive, load_credential


def pcp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pcp_core", "token", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_credential_proves_the_name_it_was_issued_for(tmp_path: Path) -> None:
    issuer = Issuer(tmp_path / "issuer.key")
    alice = issuer.issue("alice")
    assert (tmp_path / "issuer.key").stat().st_mode & 0o777 == 0o600
    keys = IssuedKeys(tmp_path / "issuer.key")
    assert keys.secret_for("alice", alice.serial) == alice.secret
    assert keys.secret_for("mallory", alice.serial) != alice.secret  # the name is bound
    assert keys.secret_for("alice", "0" * 16) != alice.secret  # and the serial
    assert issuer.issue("alice").serial != alice.serial  # a new one each time


def test_a_shared_secret_does_not_pass_for_a_credential(tmp_path: Path) -> None:
    Issuer(tmp_path / "issuer.key").issue("alice")
    with pytest.raises(AuthError, match="own credential"):
        IssuedKeys(tmp_path / "issuer.key").secret_for("alice", "")


def test_revocation_is_read_by_a_running_shepherd(tmp_path: Path) -> None:
    issuer = Issuer(tmp_path / "issuer.key")
    alice, bob = issuer.issue("alice"), issuer.issue("bob")
    keys = IssuedKeys(tmp_path / "issuer.key")
    assert keys.refusal("bob", bob.serial) is None
    assert issuer.revoke("bob") == [bob.serial]
    assert "revoked" in (keys.refusal("bob", bob.serial) or "")
    assert keys.refusal("alice", alice.serial) is None
    assert keys.revoked_now() == {("bob", bob.serial)}
    again = issuer.issue("bob")
    assert keys.refusal("bob", again.serial) is None  # re-issued: a new serial, valid
    assert issuer.revoke("bob") == [again.serial]  # the old one is not revoked twice
    states = {(e["name"], e["serial"]): e["revoked"] for e in issuer.issued()}
    assert states == {("alice", alice.serial): False, ("bob", bob.serial): True,
                      ("bob", again.serial): True}  # fmt: skip


def test_files_others_may_read_are_refused(tmp_path: Path) -> None:
    issuer = Issuer(tmp_path / "issuer.key")
    credential = issuer.issue("alice")
    path = tmp_path / "alice.credential"
    path.write_text(credential.to_json())
    path.chmod(0o644)
    with pytest.raises(AuthError, match="chmod 600"):
        load_credential(path)
    path.chmod(0o600)
    assert load_credential(path) == credential
    (tmp_path / "issuer.key").chmod(0o640)
    with pytest.raises(AuthError, match="chmod 600"):
        IssuedKeys(tmp_path / "issuer.key")


def test_bad_names_and_files_are_one_line_errors(tmp_path: Path) -> None:
    issuer = Issuer(tmp_path / "issuer.key")
    for name in ("", "has space", "-dash", "x" * 65, "a/b"):
        with pytest.raises(AuthError, match="letters, digits"):
            issuer.issue(name)
    broken = tmp_path / "broken.credential"
    broken.write_text("{not json")
    broken.chmod(0o600)
    with pytest.raises(AuthError, match="not a credential"):
        load_credential(broken)
    short = tmp_path / "short.key"
    short.write_text("abc")
    short.chmod(0o600)
    with pytest.raises(AuthError, match="too short"):
        IssuedKeys(short)


def test_the_derivation_is_hkdf_sha256() -> None:
    """Pinned: a shepherd of another version derives the same secrets."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = b"pcp worker credential v1\0alice\0abcd"
    expected = HKDF(hashes.SHA256(), 32, None, info).derive(b"k" * 64).hex().encode()
    assert derive(b"k" * 64, "alice", "abcd") == expected


def test_shared_secret_keys() -> None:
    keys = SharedSecret(b"s")
    assert keys.secret_for("any", "") == b"s" and keys.refusal("any", "") is None


def test_pcp_token_commands(tmp_path: Path) -> None:
    issued = pcp("issue", "gpu-1", cwd=tmp_path)
    assert issued.returncode == 0, issued.stderr
    credential = json.loads((tmp_path / "gpu-1.credential").read_text())
    assert credential["name"] == "gpu-1"
    assert os.stat(tmp_path / "gpu-1.credential").st_mode & 0o777 == 0o600
    again = pcp("issue", "gpu-1", cwd=tmp_path)
    assert again.returncode != 0 and "exists" in again.stderr
    listed = pcp("list", cwd=tmp_path)
    assert "gpu-1" in listed.stdout and "valid" in listed.stdout
    revoked = pcp("revoke", "gpu-1", cwd=tmp_path)
    assert revoked.returncode == 0 and credential["serial"] in revoked.stdout
    assert "revoked" in pcp("list", cwd=tmp_path).stdout
    unknown = pcp("revoke", "nobody", cwd=tmp_path)
    assert unknown.returncode != 0 and "no credential" in unknown.stderr
