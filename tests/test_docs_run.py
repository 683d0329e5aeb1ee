"""Every command block in README.md, docs/ and the plugins' READMEs, run as written.

Each document's shell blocks run in order, line by line, in a folder of their own where
small stand-ins take the place of the files the docs name (a tiny corpus for
`shakespeare.txt`, a GPT-2 made by `transformers` for `gpt2/`, a short run for a run
directory that an earlier command was stopped before writing). A `pcp` command passes:

- when it ends with exit code 0;
- when it is still working once it shows so (training, listening, waiting for its
  workers): it is stopped there, as hours of training are not run here;
- when it fails in one line for what this machine lacks and the docs' reader has (a GPU,
  the host `shepherd.example`, a Slurm or Kubernetes cluster), never with a traceback or
  a usage error.

Lines that install packages, download, or drive clusters and containers (`pip`, `curl`,
`nox`, `sudo`, `kubectl`, ...) are not run; the Python snippets that check an export
are. `tests/test_docs_commands.py` parses the same commands against the CLI, quickly.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_pcp, save_small_gpt2

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCUMENTS += sorted((ROOT / "plugins").glob("*/README.md"))
BLOCK = re.compile(r"```(bash|sh|console|toml)\n(.*?)```", re.S)

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # a fixed port (7433), many processes

# Not run: installs, downloads, the development set, clusters, containers, root.
NOT_RUN = {
    "pip", "curl", "wget", "nox", "sudo", "kubectl", "squeue", "scancel", "sbatch", "tail",
    "podman", "docker", "containers/build.sh", "tensorboard", "mlflow", "huggingface-cli",
    "cd", "bash", "python3.11", ".venv/bin/pytest", "pytest", "mpirun", "srun",
}  # fmt: skip
NOT_RUN_PYTHON = ("benchmarks/", "scripts/")  # benchmarks and the development scripts
# What a pcp command shows once it works: it is then stopped.
WORKING = re.compile(
    r"state=training|\"state\": \"training\"|shepherd listening|waiting for workers|"
    r"shepherd and workers running|"
    r"worker state.*state=(joining|compiling)|status endpoint"
)
# What this machine lacks and the docs' reader has: a one-line refusal for it passes.
ELSEWHERE = re.compile(
    r"no (CUDA|ROCm|NVIDIA|AMD|GPU|Metal)|backend '?(cuda|rocm|metal|xla)'?.*(not |no |un)|"
    r"(cuda|rocm|gpu|device).*(not found|unavailable|no device|not available)|"
    r"shepherd\.example|name or service not known|out of reach|cannot reach|"
    r"(sbatch|srun|mpirun|kubectl|ray)\b.*(not found|not installed|no such)|"
    r"Temporary failure in name resolution|nodename nor servname|"
    r"sbatch: (error|fatal)|no Ray cluster|failed to download openapi|"
    r"need \d+ devices; this machine has \d+|driver '\w+' is not usable here|"
    r"more than this machine's [\d.]+ GiB",
    re.I,
)
# Ctrl-C that lands in a finalizer (`Popen.__del__`): Python reports it and goes on.
INTERRUPT_IN_FINALIZER = re.compile(
    r"Exception ignored in: .*\nTraceback \(most recent call last\):\n(?:  .*\n|\n)*"
    r"KeyboardInterrupt.*\n?"
)
USAGE = re.compile(r"^Usage: pcp|No such option|Try 'pcp .*--help'", re.M)
NOT_INSTALLED = re.compile(r"unknown (optimizer|backend|algorithm|codec|launcher|model) '[\w-]+'")
SLOW_START_S = 240  # a first compile of a new model size on a 2-core machine
REFUSAL_EXIT_S = 15  # how long a command that refused may take to exit by itself
TEXT = "".join(  # with the prompts the docs give: "ROMEO:", "The "
    f"ROMEO: The {name} walks to the {place} and sells {count} loaves of bread before dusk.\n"
    for count in range(120)
    for name, place in (("Ada", "mill"), ("Bram", "market"), ("Cora", "harbour"))
)


@dataclass(frozen=True)
class Line:
    where: str
    text: str  # one shell command, or a heredoc or a multi-line `python -c` whole
    block: int  # which block of its document


def blocks(document: Path) -> Iterator[tuple[str, int, str]]:
    text = document.read_text()
    for block in BLOCK.finditer(text):
        yield block.group(1), text[: block.start()].count("\n") + 2, block.group(2)


def lines(document: Path) -> Iterator[Line]:
    """The shell lines of a document's blocks, in order, continuations joined."""
    for number, (language, first, body) in enumerate(blocks(document)):
        if language == "toml":
            continue
        raw = body.splitlines()
        index = 0
        while index < len(raw):
            start, text = index, raw[index]
            while text.endswith("\\") and index + 1 < len(raw):
                index += 1
                text = text[:-1] + " " + raw[index].strip()
            heredoc = re.search(r"<<'?(\w+)'?", text)
            if heredoc:
                while index + 1 < len(raw) and raw[index].strip() != heredoc.group(1):
                    index += 1
                    text += "\n" + raw[index]
            elif text.count('"') % 2:  # python -c "... over several lines
                while index + 1 < len(raw) and text.count('"') % 2:
                    index += 1
                    text += "\n" + raw[index]
            index += 1
            if text.strip() and not text.strip().startswith("#"):
                yield Line(f"{document.relative_to(ROOT)}:{first + start}", text, number)


def runs_here(line: str) -> bool:
    first = line.split()[0].lstrip("(")
    if (
        placeholder(line)
        or first in NOT_RUN
        or (first.startswith("python") and any(p in line for p in NOT_RUN_PYTHON))
    ):
        return False
    return not (first.startswith("python") and "-m venv" in line)


def is_pcp(line: str) -> bool:
    return line.split()[0] == "pcp"


def placeholder(line: str) -> bool:
    """A command with `...` for the reader's own options or names: not runnable as it is."""
    return is_pcp(line) and "..." in line.split("#")[0]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_stand_ins(tmp_path_factory.mktemp("stand-ins"))


def make_stand_ins(folder: Path) -> Path:
    """The files the docs name, small: corpora, a GPT-2 folder, a token, a run."""
    for name in ("shakespeare.txt", "corpus.txt"):
        (folder / name).write_text(TEXT)
    (folder / "books").mkdir()
    for part in range(2):  # with a validation shard longer than GPT-2's 1024 tokens
        (folder / "books" / f"part{part}.txt").write_text(TEXT * 4)
    shutil.copytree(folder / "books", folder / "scratch" / "books")  # a cluster's disk
    (folder / "more.jsonl").write_text('{"text": "Ada sells bread."}\n' * 50)
    (folder / "hosts").write_text("localhost slots=8\n")
    (folder / "token").write_text("c3RhbmQtaW4gc2VjcmV0IGZvciB0aGUgZG9jcycgY29tbWFuZHM=\n")
    (folder / "token").chmod(0o600)
    (folder / "gpt2").mkdir()
    save_small_gpt2(folder / "gpt2", TEXT, 256)
    (folder / "run.toml").write_text(toml_of(ROOT / "docs" / "training.md"))
    made = run_pcp(
        "train", *TINY, "--steps", "20", "--out", "runs/short", env=environment(folder), cwd=folder
    )
    assert made.returncode == 0, made.stderr[-3000:]
    interrupted_diloco_run(folder, "runs/short-diloco")
    return folder


TINY = ("--data", "shakespeare.txt", "--n-layer", "1", "--n-embd", "32", "--block-size", "64")


def interrupted_diloco_run(folder: Path, out: str) -> None:
    """A DiLoCo run stopped with Ctrl-C after its first checkpoint, as a shepherd's
    reboot leaves one: what `pcp shepherd --resume` continues."""
    diloco = ("--algorithm", "diloco", "--workers", "2", "--inner-steps", "5")
    command = [sys.executable, "-m", "pcp_core", "train", *TINY, *diloco, "--steps", "100000"]
    process = subprocess.Popen(
        [*command, "--checkpoint-every", "1", "--out", out],
        cwd=folder, env=environment(folder), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + SLOW_START_S
    while not (folder / out / "checkpoint.safetensors").exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.2)
    stop(process)


def toml_of(document: Path) -> str:
    """The document's first TOML block: the run file the docs show."""
    return next(body for language, _, body in blocks(document) if language == "toml")


def environment(folder: Path) -> dict[str, str]:
    """`pcp` and `python` on PATH as this interpreter's (the reader's venv), and no
    terminal: logs as plain lines."""
    bin_dir = folder / ".bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        commands = {"pcp": f'"{sys.executable}" -m pcp_core', "python": f'"{sys.executable}"'}
        for name, command in commands.items():
            script = bin_dir / name
            script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
            script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "80"}


def stand_in_runs(line: str, folder: Path) -> None:
    """A run a command reads (`sample`, `export`, `--resume`, `--init-from`-less inputs)
    that an earlier command was stopped before finishing: the short run stands in."""
    words = line.split()
    if words[:2] == ["pcp", "sample"] or words[:2] == ["pcp", "export"]:
        wanted = [words[2]]
    else:
        wanted = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--resume"]
    stand_in = "short-diloco" if words[:2] == ["pcp", "shepherd"] else "short"
    for name in wanted:
        run = folder / name
        if not (run / "checkpoint.safetensors").exists():
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(folder / "runs" / stand_in, run)


@dataclass
class Outcome:
    code: int | None  # None: stopped, or left running, while it worked
    output: str
    seconds: float
    server: subprocess.Popen[bytes] | None = None  # left running for the lines after it


def serves(line: Line) -> bool:
    """A shepherd: the reader leaves it running while the block's next lines (a worker,
    `pcp status`) talk to it."""
    return line.text.startswith("pcp shepherd")


SHARED_PATHS = re.compile(r"(?<=[ =])/(shared|scratch)/")  # a cluster's file systems


def run_line(line: Line, folder: Path) -> Outcome:
    """Run one shell line in `folder` (a cluster's shared paths inside it too); a `pcp`
    command that shows it works is stopped, or left running if it serves."""
    started = time.monotonic()
    text = SHARED_PATHS.sub(lambda m: f"{folder}/{m.group(1)}/", line.text)
    log = folder / f".output-{time.monotonic_ns()}"  # a server left running writes on
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", text],
            cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=environment(folder),
            start_new_session=True,
        )  # fmt: skip
        while process.poll() is None:
            output = log.read_text(errors="replace")
            waited = time.monotonic() - started
            if WORKING.search(output) and serves(line):
                return Outcome(None, output, waited, server=process)
            if ELSEWHERE.search(output) and not WORKING.search(output):
                # a refusal exits by itself: a Ctrl-C now would land in its exit handlers
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=REFUSAL_EXIT_S)
                if process.poll() is not None:
                    break
            if WORKING.search(output) or ELSEWHERE.search(output) or waited > SLOW_START_S:
                stop(process)
                return Outcome(None, log.read_text(errors="replace"), waited)
            time.sleep(0.2)
        stop(process, signal.SIGTERM)  # what it left running in the background (`&`)
    return Outcome(process.returncode, log.read_text(errors="replace"), time.monotonic() - started)


def stop(process: subprocess.Popen[bytes], first: int = signal.SIGINT) -> None:
    """Ctrl-C (or `first`: a shell's background jobs ignore Ctrl-C) to the command's whole
    process group, then a kill for what lingers."""
    for sent in (first, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sent)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and group_alive(process):
            time.sleep(0.1)
    process.wait()


def group_alive(process: subprocess.Popen[bytes]) -> bool:
    """Whether any process of the group lives (the shell reaped: a zombie counts)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def problem(line: Line, outcome: Outcome, installs: bool = False) -> str | None:
    """Why the line's outcome does not pass, or None."""
    tail = outcome.output[-3000:]
    output = outcome.output
    if outcome.code is None:  # stopped here with Ctrl-C
        output = INTERRUPT_IN_FINALIZER.sub("", output)
        if outcome.seconds > SLOW_START_S and not WORKING.search(output):
            # stopped for taking too long: said so, not as the traceback the Ctrl-C left
            return (
                f"{line.where}: neither working nor refused after {outcome.seconds:.0f} s\n{tail}"
            )
    traceback = output.find("Traceback (most recent call last)")
    if traceback >= 0:
        return f"{line.where}: a traceback\n{output[traceback : traceback + 3000]}"
    if USAGE.search(outcome.output):
        return f"{line.where}: a usage error\n{tail}"
    if outcome.code == 0:
        return None
    if outcome.code is None:
        if WORKING.search(outcome.output) or ELSEWHERE.search(outcome.output):
            return None
        return f"{line.where}: neither working nor refused after {outcome.seconds:.0f} s\n{tail}"
    if is_pcp(line.text) and ELSEWHERE.search(outcome.output):
        return None  # what this machine lacks, said in a line
    if installs and NOT_INSTALLED.search(outcome.output):
        return None  # a plugin the document's `pip install` line (not run here) brings
    return f"{line.where}: exit code {outcome.code}\n{tail}"


DOCUMENTS_WITH_LINES = [d for d in DOCUMENTS if any(runs_here(x.text) for x in lines(d))]


@pytest.mark.parametrize("document", DOCUMENTS_WITH_LINES, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_command_of_the_document_runs_as_written(
    document: Path, stand_ins: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "reader"
    shutil.copytree(stand_ins, folder, symlinks=True)
    problems = run_document(document, folder)
    assert not problems, "\n\n".join(problems)


def run_document(
    document: Path, folder: Path, report: Callable[[Line, Outcome], None] | None = None
) -> list[str]:
    """Run the document's lines in order in `folder`; what did not pass."""
    problems, installs = [], False
    servers: list[subprocess.Popen[bytes]] = []
    block = -1
    try:
        for line in lines(document):
            if line.block != block or serves(line):  # a new block, or a new shepherd
                stop_all(servers)
            block = line.block
            if not runs_here(line.text):
                installs = installs or "pip install" in line.text
                continue
            if is_pcp(line.text):
                stand_in_runs(line.text, folder)
            outcome = run_line(line, folder)
            if outcome.server:
                servers.append(outcome.server)
            found = problem(line, outcome, installs)
            if found:
                problems.append(found)
            if report:
                report(line, outcome)
    finally:
        stop_all(servers)
    return problems


def stop_all(servers: list[subprocess.Popen[bytes]]) -> None:
    while servers:
        stop(servers.pop())
