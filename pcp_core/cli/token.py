"""`pcp token`: issue, revoke and list per-worker credentials (`pcp_core.wire.credentials`).

Light to import: the credentials module needs `cryptography` only when a secret is
derived, inside the command.
"""

from pathlib import Path

import typer

from pcp_core.cli.common import fail

token_app = typer.Typer(
    help="Credentials of one worker each, under the shepherd's issuer key (`pcp shepherd "
    "--issuer-key FILE`): issue one per machine, revoke one while the run goes on.",
    no_args_is_help=True,
)

ISSUER_HELP = "The issuer key (made, mode 0600, by the first `issue`); keep it on the shepherd."


@token_app.command("issue")
def issue(
    name: str = typer.Argument(..., help="The worker's name, as logs and /status show it."),
    issuer_key: Path = typer.Option(Path("issuer.key"), "--issuer-key", help=ISSUER_HELP),
    output: Path = typer.Option(
        None, "--output", "-o", help="Where to write the credential (default: NAME.credential)."
    ),
) -> None:
    """Issue a credential for worker NAME; copy it to that machine only
    (`pcp worker --credential FILE`)."""
    from pcp_core.wire.auth import AuthError, write_private
    from pcp_core.wire.credentials import Issuer

    target = output or Path(f"{name}.credential")
    if target.exists():
        fail(f"{target} exists; remove it or pass another --output")
    try:
        credential = Issuer(issuer_key).issue(name)
    except AuthError as error:
        fail(str(error))
    write_private(target, credential.to_json().encode())
    typer.echo(f"issued {name} (serial {credential.serial}) to {target}, mode 0600")


@token_app.command("revoke")
def revoke(
    name: str = typer.Argument(..., help="The worker whose credentials to revoke."),
    issuer_key: Path = typer.Option(Path("issuer.key"), "--issuer-key", help=ISSUER_HELP),
) -> None:
    """Revoke every credential issued to NAME: a running shepherd disconnects it within a
    second and refuses it from then on; `issue NAME` again gives it a new one."""
    from pcp_core.wire.auth import AuthError
    from pcp_core.wire.credentials import Issuer

    try:
        serials = Issuer(issuer_key).revoke(name)
    except AuthError as error:
        fail(str(error))
    if not serials:
        fail(f"no credential of {name!r} to revoke (see `pcp token list`)")
    typer.echo(f"revoked {name}: serial {', '.join(serials)}")


@token_app.command("list")
def list_credentials(
    issuer_key: Path = typer.Option(Path("issuer.key"), "--issuer-key", help=ISSUER_HELP),
) -> None:
    """Every credential issued under the key, and whether it is revoked."""
    from pcp_core.wire.auth import AuthError
    from pcp_core.wire.credentials import Issuer

    try:
        issued = Issuer(issuer_key).issued()
    except AuthError as error:
        fail(str(error))
    if not issued:
        typer.echo(f"no credential issued under {issuer_key}")
    for entry in issued:
        state = "revoked" if entry["revoked"] else "valid"
        typer.echo(f"{entry['name']:<24} {entry['serial']}  {state:<7}  {entry.get('at', '')}")
