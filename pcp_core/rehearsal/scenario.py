"""Scenario files: the links of a rehearsed deployment, read from TOML.

A scenario names the shepherd's link and each worker's link (rate, one-way delay,
jitter, loss). `load_scenario` checks every key and bound and fails with one line
naming the bad key, so a typo never silently becomes an unlimited link.

```toml
name = "mixed-planet"

[shepherd]
rate_mbit = 1000
delay_ms = 0

[[workers]]
name = "far"          # workers of a group are named far-0, far-1, ... when count > 1
count = 2
rate_mbit = 20
delay_ms = 150
jitter_ms = 10
loss_percent = 0.5
backend = "cpu"
cpus = 0.5            # optional: CPU time in cores, a cgroup quota (pcp_core.rehearsal.cpu)
```
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LINK_KEYS = ("rate_mbit", "delay_ms", "jitter_ms", "loss_percent")
WORKER_KEYS = (*LINK_KEYS, "name", "count", "backend", "cpus")
TOP_KEYS = ("name", "description", "shepherd", "workers")
# Worker names become namespace names (`pcpw-<pid>-<name>`): short and shell-safe.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
MAX_NODES = 250  # one /24 per link in 10.77.0.0/16


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the bad key."""


@dataclass(frozen=True)
class Link:
    """One node's link to the rest of the network: the same in both directions.

    rate_mbit: the wire rate (headers included) each way; delay_ms: one-way delay;
    jitter_ms: the delay varies by up to ± this much; loss_percent: the share of
    packets dropped, each way.
    """

    rate_mbit: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0

    def __post_init__(self) -> None:
        problem = link_problem(self)
        if problem:
            raise ScenarioError(problem)


@dataclass(frozen=True)
class Worker:
    """One worker of a scenario: its name, its link, the backend it should run and the
    CPU time it may use, in cores (None: unlimited)."""

    name: str
    link: Link
    backend: str = "cpu"
    cpus: float | None = None


@dataclass(frozen=True)
class Scenario:
    """A rehearsed deployment: the shepherd's link and every worker's."""

    name: str
    shepherd: Link
    workers: list[Worker] = field(default_factory=list)
    description: str = ""


def link_problem(link: Link, where: str = "") -> str | None:
    """Return a one-line description of the first out-of-bounds field, or None."""
    for key in LINK_KEYS:
        value = getattr(link, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return f"{where}{key}: expected a number, got {value!r}"
        if math.isinf(value):
            return f"{where}{key}: must be finite, got {value!r}"
    if link.rate_mbit <= 0:
        return f"{where}rate_mbit: must be > 0, got {link.rate_mbit}"
    if link.delay_ms < 0:
        return f"{where}delay_ms: must be >= 0, got {link.delay_ms}"
    if link.jitter_ms < 0 or link.jitter_ms > link.delay_ms:
        return (
            f"{where}jitter_ms: must be between 0 and delay_ms ({link.delay_ms}), "
            f"got {link.jitter_ms}"
        )
    if not 0 <= link.loss_percent < 100:
        return f"{where}loss_percent: must be >= 0 and < 100, got {link.loss_percent}"
    return None


def _link(table: dict[str, Any], where: str, allowed: tuple[str, ...]) -> Link:
    """Build a Link from a TOML table, naming the first unknown or bad key."""
    for key in table:
        if key not in allowed:
            raise ScenarioError(f"{where}{key}: unknown key (expected one of {', '.join(allowed)})")
    if "rate_mbit" not in table:
        raise ScenarioError(f"{where}rate_mbit: missing (every link needs a rate)")
    values = {key: table[key] for key in LINK_KEYS if key in table}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScenarioError(f"{where}{key}: expected a number, got {value!r}")
    values = {key: float(value) for key, value in values.items()}
    link = object.__new__(Link)  # checked below, with the key's full path in the message
    for key in LINK_KEYS:
        object.__setattr__(link, key, values.get(key, 0.0))
    problem = link_problem(link, where)
    if problem:
        raise ScenarioError(problem)
    return link


def parse_scenario(data: dict[str, Any], default_name: str = "scenario") -> Scenario:
    """Check a parsed TOML document and build the Scenario it describes."""
    for key in data:
        if key not in TOP_KEYS:
            raise ScenarioError(f"{key}: unknown key (expected one of {', '.join(TOP_KEYS)})")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"name: expected a non-empty string, got {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(f"description: expected a string, got {description!r}")
    shepherd = data.get("shepherd")
    if not isinstance(shepherd, dict):
        raise ScenarioError("shepherd: missing table [shepherd] with at least rate_mbit")
    shepherd_link = _link(shepherd, "shepherd.", LINK_KEYS)
    groups = data.get("workers")
    if not isinstance(groups, list) or not groups:
        raise ScenarioError("workers: missing; add at least one [[workers]] table")
    workers: list[Worker] = []
    for index, group in enumerate(groups):
        where = f"workers[{index}]."
        if not isinstance(group, dict):
            raise ScenarioError(f"workers[{index}]: expected a table, got {group!r}")
        group_name = group.get("name", f"w{index}")
        if not isinstance(group_name, str) or not NAME_PATTERN.match(group_name):
            raise ScenarioError(
                f"{where}name: must be lowercase letters, digits and '-', starting with a "
                f"letter, at most 20 characters; got {group_name!r}"
            )
        count = group.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ScenarioError(f"{where}count: expected an integer >= 1, got {count!r}")
        backend = group.get("backend", "cpu")
        if not isinstance(backend, str) or not backend:
            raise ScenarioError(f"{where}backend: expected a non-empty string, got {backend!r}")
        cpus = group.get("cpus")
        if cpus is not None and (
            isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0.01 <= cpus <= 1024
        ):
            raise ScenarioError(f"{where}cpus: expected a number of cores from 0.01, got {cpus!r}")
        link = _link(group, where, WORKER_KEYS)
        for n in range(count):
            worker_name = group_name if count == 1 else f"{group_name}-{n}"
            workers.append(Worker(worker_name, link, backend, cpus))
    names = [worker.name for worker in workers]
    duplicates = sorted(
        {n for n in names if names.count(n) > 1} | ({"shepherd", "router"} & set(names))
    )
    if duplicates:
        raise ScenarioError(
            f"workers: names must be unique and not 'shepherd' or 'router': {duplicates}"
        )
    if len(workers) + 1 > MAX_NODES:
        raise ScenarioError(f"workers: at most {MAX_NODES - 1} workers, got {len(workers)}")
    return Scenario(name=name, shepherd=shepherd_link, workers=workers, description=description)


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario TOML file; raise ScenarioError with one line on any problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read ({error.strerror})") from error
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(f"{path}: not valid TOML ({error})") from error
    try:
        return parse_scenario(data, default_name=path.stem)
    except ScenarioError as error:
        raise ScenarioError(f"{path}: {error}") from None
