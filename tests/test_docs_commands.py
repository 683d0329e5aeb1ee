"""Every `pcp` command in README.md, docs/ and the plugins' READMEs parses against the
CLI as written: each command exists and takes each option given, with a value of its
type and among its choices, so the docs cannot drift from the CLI. (Parsed, not run:
many of them need GPUs, clusters or hours; `pcp` never runs a command's body here.)"""

import importlib
import re
import shlex
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer

from pcp_core import plugins
from pcp_core.cli.app import hoisted, with_plugins

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCUMENTS += sorted((ROOT / "plugins").glob("*/README.md"))
BLOCK = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)
SEPARATORS = {"&&", "||", ";", "|", "&"}
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def commands() -> list[tuple[str, list[str]]]:
    """(where, arguments after `pcp`) of every pcp command in the documents' shell blocks."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for block in BLOCK.finditer(text):
            line_number = text[: block.start()].count("\n") + 2
            for offset, line in enumerate(block.group(1).replace("\\\n", " ").splitlines()):
                where = f"{document.relative_to(ROOT)}:{line_number + offset}"
                found += [(where, args) for args in pcp_commands(line)]
    return found


def pcp_commands(line: str) -> list[list[str]]:
    """The `pcp ARGS` of one shell line (after `VAR=value` assignments, between `&&`, `;`
    and pipes); none where the line holds shell syntax this cannot read."""
    if "$" in line or "<<" in line or "`" in line:
        return []
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    segments, current = [], []
    for word in [*words, ";"]:
        if word in SEPARATORS:
            segments.append(current)
            current = []
        else:
            current.append(word)
    found = []
    for segment in segments:
        while segment and ASSIGNMENT.match(segment[0]):
            segment = segment[1:]
        if segment and Path(segment[0]).name == "pcp" and "..." not in " ".join(segment):
            found.append(segment[1:])
    return found


def errors_of(command: Any) -> ModuleType:
    """The exceptions of the click `command` is built on: click's, or those of the copy
    newer typers carry."""
    base = next(c for c in type(command).__mro__ if c.__name__ == "Command")
    return importlib.import_module(base.__module__.rsplit(".", 1)[0] + ".exceptions")


def parse(command: Any, name: str, args: list[str], parent: Any = None) -> None:
    """Parse `args` as click would for `command` (and its subcommands), running nothing."""
    context = command.make_context(name, list(args), parent=parent)
    if hasattr(command, "resolve_command"):
        # the subcommand and what follows it (click 8.2 keeps them in `_protected_args`)
        protected = getattr(context, "_protected_args", None) or context.protected_args or []
        rest = [*protected, *context.args]
        if rest:
            sub_name, sub, remaining = command.resolve_command(context, rest)
            assert sub is not None, f"no command {rest[0]!r}"
            parse(sub, sub_name, remaining, context)


DOCUMENTED = commands()


def test_the_documents_hold_pcp_commands() -> None:
    assert len(DOCUMENTED) > 80
    assert {args[0] for _, args in DOCUMENTED if args} >= {"train", "worker", "export", "data"}


@pytest.fixture(scope="module")
def command() -> Any:
    return typer.main.get_command(with_plugins(plugins.host()))


@pytest.mark.parametrize(("where", "args"), DOCUMENTED, ids=[w for w, _ in DOCUMENTED])
def test_a_documented_command_parses(command: Any, where: str, args: list[str]) -> None:
    errors = errors_of(command)
    try:
        parse(command, "pcp", hoisted(args))
    except (getattr(errors, "Exit", typer.Exit), typer.Exit):  # --help: eager, and fine
        pass
    except errors.UsageError as error:
        pytest.fail(f"{where}: pcp {shlex.join(args)}: {error.format_message()}")


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--no-such-flag"],
        ["train", "--steps", "many"],
        ["train", "--lr-schedule"],
        ["no-such-command"],
        ["data", "prepare"],  # its input is required
    ],
)
def test_a_command_that_drifted_from_the_cli_fails(command: Any, args: list[str]) -> None:
    with pytest.raises(errors_of(command).UsageError):
        parse(command, "pcp", args)
