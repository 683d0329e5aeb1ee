"""A real distributed PCP run over emulated links: `pcp shepherd` and one `pcp worker`
per scenario worker, each in its own network namespace.

`run_scenario(scenario, run_dir, settings)` builds the scenario's network
(`links.emulated_network`), writes a token file (a shepherd listening beyond loopback
needs a shared secret), starts the shepherd on its namespace's address, waits until it
listens, starts the workers, waits for the shepherd to finish and returns its
summary.json and metrics.jsonl records. Every process runs with `sys.executable -m
pcp_core` (the caller's environment) in a session of its own, and is stopped on the way
out, also on an exception, Ctrl-C or SIGTERM (`processes`); the namespaces go with the
network.

Run directory layout:

```
run_dir/shepherd/      the shepherd's --out: config.toml, metrics.jsonl, summary.json
run_dir/logs/<node>.log  each process's stdout and stderr
run_dir/workers/<name>/  each worker's --state-dir and --shard-cache
run_dir/shepherd-link.tsv  the shepherd's link byte counters (`pcp_core.rehearsal.counters`)
run_dir/harness.json   scenario, command lines, exit codes, wall time
```
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import structlog

from pcp_core.rehearsal.counters import INTERVAL_S, link_use, read_samples
from pcp_core.rehearsal.cpu import cpu_groups
from pcp_core.rehearsal.links import Network, emulated_network
from pcp_core.rehearsal.processes import Processes, start_process, stop_all, wait_workers
from pcp_core.rehearsal.scenario import Scenario
from pcp_core.wire.auth import write_secret

log = structlog.get_logger(__name__)

PORT = 7433
_CONSOLE_JOINED = re.compile(r"\]\s+joined\s.*\bindex=(\d+)")


class RehearsalError(RuntimeError):
    """The rehearsed run could not start or did not finish; the message says why."""


@dataclass(frozen=True)
class TrainingSettings:
    """What the rehearsed run trains: passed to `pcp shepherd` as flags.

    `shepherd_flags` are any further shepherd flags (model size, batch size, deadlines).
    """

    steps: int = 40
    inner_steps: int = 10
    seed: int = 0
    shepherd_flags: tuple[str, ...] = ()
    join_timeout_s: float = 300.0
    worker_flags: tuple[str, ...] = ()


@dataclass
class RunResult:
    """What a rehearsed run left: the shepherd's summary, its metrics, every exit code."""

    run_dir: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    exit_codes: dict[str, int | None]
    wall_s: float
    # how much of its rate the shepherd's link carried in transfer phases, each way
    # (`pcp_core.rehearsal.counters.link_use`)
    shepherd_link: dict[str, Any] = field(default_factory=dict)

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The DiLoCo round records of metrics.jsonl (those with `round` and `round_s`)."""
        return [r for r in self.records if "round" in r and "round_s" in r]


def shepherd_argv(
    scenario: Scenario, network: Network, run_dir: Path, settings: TrainingSettings, port: int
) -> list[str]:
    """The `pcp shepherd` command line: DiLoCo on the scenario's workers, its own address."""
    return [
        *(sys.executable, "-m", "pcp_core", "shepherd", "--algorithm", "diloco"),
        *("--host", network.address("shepherd"), "--port", str(port)),
        *("--workers", str(len(scenario.workers)), "--token-file", str(run_dir / "token")),
        *("--out", str(run_dir / "shepherd"), "--no-dashboard"),
        *("--steps", str(settings.steps), "--inner-steps", str(settings.inner_steps)),
        *("--seed", str(settings.seed), "--join-timeout", str(settings.join_timeout_s)),
        *settings.shepherd_flags,
    ]


def worker_argv(
    name: str, backend: str, address: str, run_dir: Path, settings: TrainingSettings
) -> list[str]:
    """One `pcp worker` command line; its state and shard cache live under the run dir.

    The worker CLI has no `--name`: the shepherd numbers workers in the order they join.
    """
    own = run_dir / "workers" / name
    return [
        *(sys.executable, "-m", "pcp_core", "worker", "--connect", address),
        *("--backend", backend, "--token-file", str(run_dir / "token")),
        *("--state-dir", str(own / "state"), "--shard-cache", str(own / "shards")),
        *settings.worker_flags,
    ]


def wait_listening(
    network: Network, process: subprocess.Popen[bytes], port: int, timeout_s: float
) -> None:
    """Wait until the shepherd listens on `port` in its namespace; fail if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RehearsalError(f"the shepherd exited ({process.returncode}) before listening")
        found = network.run(
            "shepherd", ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True
        )
        if found.stdout.strip():
            return
        time.sleep(0.2)
    raise RehearsalError(f"the shepherd did not listen on port {port} within {timeout_s:.0f} s")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON records of a metrics.jsonl file (none if it is missing)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@contextlib.contextmanager
def started_run(
    scenario: Scenario,
    run_dir: Path,
    settings: TrainingSettings,
    processes: Processes,
    *,
    port: int = PORT,
    listen_timeout_s: float = 120.0,
) -> Iterator[Network]:
    """Build the network, start the shepherd and the workers into `processes`; stop
    every process, then remove the network, on exit."""
    run_dir = Path(run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    write_secret(run_dir / "token")
    quotas = {w.name: w.cpus for w in scenario.workers if w.cpus is not None}
    with emulated_network(scenario) as network, cpu_groups(quotas, network.tag) as cpu:
        counters = [sys.executable, "-m", "pcp_core.rehearsal.counters", "eth0"]
        counters += [str(run_dir / "shepherd-link.tsv"), str(INTERVAL_S)]
        sampler = network.popen("shepherd", counters, stdin=subprocess.DEVNULL)
        try:
            argv = shepherd_argv(scenario, network, run_dir, settings, port)
            shepherd = start_process(processes, network, "shepherd", argv, run_dir)
            wait_listening(network, shepherd, port, listen_timeout_s)
            address = f"{network.address('shepherd')}:{port}"
            for worker in scenario.workers:
                argv = worker_argv(worker.name, worker.backend, address, run_dir, settings)
                start_process(
                    processes, network, worker.name, argv, run_dir, cpu.joiner(worker.name)
                )
            log.info("rehearsal_started", scenario=scenario.name, workers=len(scenario.workers))
            yield network
        finally:
            sampler.terminate()
            stop_all(processes)
            sampler.wait()


def run_scenario(
    scenario: Scenario,
    run_dir: Path,
    settings: TrainingSettings,
    *,
    port: int = PORT,
    timeout_s: float = 3600.0,
    during: Callable[[Network, float], None] | None = None,
) -> RunResult:
    """Run DiLoCo over the scenario's emulated links until the shepherd finishes.

    `during(network, elapsed_s)` is called about once a second while the run goes on
    (to cut a link, say). Raises RehearsalError when the shepherd fails or runs past
    `timeout_s`; logs, exit codes and harness.json are in `run_dir` either way.
    """
    run_dir = Path(run_dir)
    started = time.monotonic()
    processes = Processes()
    try:
        with started_run(scenario, run_dir, settings, processes, port=port) as network:
            shepherd = processes.running["shepherd"]
            while shepherd.poll() is None:
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    raise RehearsalError(f"the run took over {timeout_s:.0f} s; stopped")
                if during is not None:
                    during(network, elapsed)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    shepherd.wait(1.0)
            wall_s = time.monotonic() - started
            wait_workers(processes, 30.0)
    finally:
        exit_codes = processes.exit_codes()
        # each started from a list (`links.popen_in`), which Popen keeps as `args`
        argvs = {name: cast(list[Any], p.args) for name, p in processes.running.items()}
        commands = {name: [str(a) for a in argv] for name, argv in argvs.items()}
        total_s = time.monotonic() - started
        _write_harness(run_dir, scenario, commands, exit_codes, total_s)
    if exit_codes.get("shepherd") != 0:
        code = exit_codes.get("shepherd")
        raise RehearsalError(f"the shepherd exited with {code}; see {run_dir}/logs/shepherd.log")
    summary_path = run_dir / "shepherd" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    records = read_records(run_dir / "shepherd" / "metrics.jsonl")
    samples = read_samples(run_dir / "shepherd-link.tsv")
    link = link_use(samples, scenario.shepherd.rate_mbit)
    return RunResult(run_dir, summary, records, exit_codes, wall_s, link)


def set_link(network: Network, name: str, up: bool) -> None:
    """Cut (`up=False`) or restore node `name`'s link: its router-side veth goes down or
    up, so nothing crosses the link either way while cut, and open connections stall."""
    node = network.node(name)
    state = "up" if up else "down"
    command = ["ip", "-n", network.router, "link", "set", node.router_interface, state]
    subprocess.run(command, check=True, capture_output=True)
    log.info("link_set", node=name, state=state)


def joined_indices(run_dir: Path) -> dict[str, list[int]]:
    """Each worker's shepherd-side index per join, read from its log's `joined` events.

    The shepherd names workers by index in metrics.jsonl; this maps them back to the
    scenario's names (a worker that rejoined has several).
    """
    found: dict[str, list[int]] = {}
    for path in sorted((Path(run_dir) / "logs").glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            index = _joined_index(line)
            if index is not None:
                found.setdefault(path.stem, []).append(index)
    return found


def _joined_index(line: str) -> int | None:
    """The index of a worker's `joined` log line, JSON or console rendered, else None."""
    if line.startswith("{"):
        with contextlib.suppress(json.JSONDecodeError, ValueError, TypeError):
            event = json.loads(line)
            if event.get("event") == "joined" and "index" in event:
                return int(event["index"])
        return None
    match = _CONSOLE_JOINED.search(line)
    return int(match.group(1)) if match else None


def _write_harness(
    run_dir: Path,
    scenario: Scenario,
    commands: dict[str, list[str]],
    exit_codes: dict[str, int | None],
    wall_s: float,
) -> None:
    """Record what ran and how each process ended in run_dir/harness.json."""
    data = {
        "scenario": scenario.name,
        "commands": {name: " ".join(argv) for name, argv in commands.items()},
        "exit_codes": exit_codes,
        "wall_s": round(wall_s, 3),
    }
    (run_dir / "harness.json").write_text(json.dumps(data, indent=2) + "\n")
