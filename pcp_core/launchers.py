"""Launchers: how a whole run, shepherd and workers, starts on a cluster's own engine.

A launcher plugin registers `Launcher` objects (`pcp_register_launchers`); `pcp launch
NAME` runs one. A launcher only turns a `LaunchRequest` into a `LaunchPlan`: the files
to write into the run directory (a batch script, a manifest) and the command that
submits them. Everything else is the core's, once for every launcher
(`pcp_core.launch.prepare`):

- **The secret.** The core writes a fresh one to RUN_DIR/token (mode 0600) and hands
  the launcher its path, never its value: no launcher can put it on a command line, in
  a script or in a log. Every process reads it with `--token-file`.
- **The files.** Written owner-only (0700 for the submit script, 0600 otherwise),
  whatever the umask, so no script on disk is readable by the group or others.
- **Submitting.** The plan's command runs in the run directory unless `--dry-run`.

The commands a plan runs come from the request (`shepherd_command`,
`worker_command`), so every launcher starts the same `pcp shepherd` and `pcp worker`.
"""

import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class LaunchError(ValueError):
    """A launch that cannot be planned or submitted: bad options, a missing tool."""


@dataclass(frozen=True)
class LaunchRequest:
    """What `pcp launch` asks of a launcher."""

    run_dir: Path  # absolute; every node the engine uses must see it at this path
    token_file: Path  # RUN_DIR/token, mode 0600
    workers: int
    port: int  # the shepherd's TCP port
    python: str  # the interpreter that runs pcp on every node
    shepherd_args: tuple[str, ...] = ()  # the run's settings, as `pcp shepherd` takes them
    worker_args: tuple[str, ...] = ()  # added to every `pcp worker` (--backend, ...)
    options: Mapping[str, str] = field(default_factory=dict)  # the launcher's own

    @property
    def shepherd_dir(self) -> Path:
        """Where the shepherd writes the run: metrics, checkpoints, summary."""
        return self.run_dir / "shepherd"

    def shepherd_command(self) -> list[str]:
        """`pcp shepherd` listening on every address, without its `--out`/`--resume`
        (`pcp_core.launch.script.resume_or_start` picks one at start)."""
        return [
            *(self.python, "-m", "pcp_core", "shepherd", "--host", "0.0.0.0"),
            *("--port", str(self.port), "--workers", str(self.workers)),
            *("--token-file", str(self.token_file), "--no-dashboard", *self.shepherd_args),
        ]

    def worker_command(self, connect: str) -> list[str]:
        """`pcp worker` joining the shepherd at `connect` (HOST:PORT, may be a shell
        expression such as `$host:7433` when the command goes into a script)."""
        return [
            *(self.python, "-m", "pcp_core", "worker", "--connect", connect),
            *("--token-file", str(self.token_file), *self.worker_args),
        ]


@dataclass(frozen=True)
class LaunchPlan:
    """What a launcher wants done: files written into the run directory, then a command."""

    files: Mapping[str, str]  # name in the run directory -> text
    submit: tuple[str, ...] | None  # run in the run directory; None: nothing to run
    executable: str | None = None  # the one file written 0700 (the script `submit` runs)
    next_steps: str = ""  # shown after launching: how to watch, stop and resubmit


class Launcher(ABC):
    """Turns a `LaunchRequest` into a `LaunchPlan`; see the module docstring."""

    name: str
    description: str
    options: Mapping[str, str] = {}  # --option KEY=VALUE this launcher takes -> its help
    tool: str | None = None  # the command `submit` needs on PATH (sbatch, mpirun, ...)

    @abstractmethod
    def plan(self, request: LaunchRequest) -> LaunchPlan:
        """The files and the submit command; LaunchError for options it cannot use."""


def shell_join(command: list[str]) -> str:
    """`command` quoted for a POSIX shell, except words of the form `$name...`, which
    stay expandable (`$host:7433`)."""
    return " ".join(word if word.startswith("$") else shlex.quote(word) for word in command)
