"""The shared secret: where it is read from, and token files it refuses."""

import os
from pathlib import Path

import pytest

from pcp_core.wire import auth


def token(tmp_path: Path, mode: int, text: str = "s3cret\n") -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_token_file_is_read(tmp_path: Path, mode: int) -> None:
    assert auth.load_secret(token(tmp_path, mode)) == b"s3cret"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o777])
def test_token_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = token(tmp_path, mode)
    with pytest.raises(auth.AuthError) as refused:
        auth.load_secret(path)
    message = str(refused.value)
    assert f"token file {path} has mode {mode:04o}" in message
    assert message.endswith(f"run `chmod 600 {path}`") and "\n" not in message


def test_missing_empty_and_binary_token_files(tmp_path: Path) -> None:
    with pytest.raises(auth.AuthError, match=r"cannot read token file .*: No such file"):
        auth.load_secret(tmp_path / "missing")
    with pytest.raises(auth.AuthError, match="is empty"):
        auth.load_secret(token(tmp_path, 0o600, " \n"))
    path = tmp_path / "binary"
    path.write_bytes(b"\xff\xfe")
    path.chmod(0o600)
    with pytest.raises(auth.AuthError, match="is not UTF-8 text"):
        auth.load_secret(path)


def test_environment_variable_when_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.TOKEN_ENV, " from-env \n")
    assert auth.load_secret(None) == b"from-env"
    monkeypatch.delenv(auth.TOKEN_ENV)
    assert auth.load_secret(None) is None


def test_readme_recipe_makes_a_private_token(tmp_path: Path) -> None:
    """The README's command writes a token file that load_secret accepts, whatever the umask."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    recipe = next(line for line in readme.splitlines() if "/dev/urandom" in line)
    command = recipe.split("#")[0].strip()
    old = os.umask(0o022)
    try:
        assert os.system(f"cd '{tmp_path}' && {command}") == 0
    finally:
        os.umask(old)
    assert auth.load_secret(tmp_path / "token")
