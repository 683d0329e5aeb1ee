"""Every nox session, as `nox` runs them, with those that use about one core run side by side.

`nox` runs its sessions one after another. The core's tests and the plugins whose tests
run on pytest-xdist fill every core by themselves (nox tag `fills-cores`): they run here
one at a time with nothing beside them, as under `nox`. Most other sessions (the
combination matrix, the plugins without xdist, the scaffold, the wheels) spend their
time in one process, a compile or a short run, and leave the other core of a 2-core CI
machine idle: here they run `--lanes` at a time (default 2).

A unit is one `nox -s ...` call: a plugin session alone, or the sessions that share a
first tag (a backend's environment with its combinations, which need it; `dist` with
`install`), in nox's order. Each unit's output goes to `.nox/lanes/<unit>.log` and is
printed whole when the unit ends, so lanes never interleave; a failed unit does not stop
the others. The exit status is nonzero if any unit failed.

    python scripts/nox_lanes.py            # what CI runs (.ci/run)
    python scripts/nox_lanes.py --lanes 1  # the same as `nox`, one session at a time
"""

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".nox" / "lanes"
FILLS_CORES = "fills-cores"
INDEPENDENT_TAGS = {"plugins"}  # sessions under these tags need nothing of each other


@dataclass
class Unit:
    name: str
    sessions: list[str]
    fills_cores: bool
    alone: bool  # a session of an INDEPENDENT_TAGS tag: short, so it runs late
    passed: bool = False
    seconds: float = 0.0


def nox(*args: str) -> list[str]:
    return [sys.executable, "-m", "nox", "--noxfile", str(ROOT / "noxfile.py"), *args]


def units() -> list[Unit]:
    """nox's sessions as units, in nox's order."""
    listed = json.loads(subprocess.run(nox("-l", "--json"), check=True, capture_output=True).stdout)
    grouped: dict[str, Unit] = {}
    for session in listed:
        name, tags = session["session"], session["tags"] or [session["session"]]
        alone = tags[0] in INDEPENDENT_TAGS
        key = name if alone or FILLS_CORES in tags else tags[0]
        unit = grouped.setdefault(key, Unit(key, [], FILLS_CORES in tags, alone))
        unit.sessions.append(name)
    return list(grouped.values())


def run(unit: Unit) -> Unit:
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{unit.name.replace('(', '-').replace(')', '')}.log"
    print(f"----- {unit.name}: started, its output when it ends", flush=True)
    started = time.monotonic()
    with log.open("wb") as output:
        done = subprocess.run(
            nox("-s", *unit.sessions), stdout=output, stderr=subprocess.STDOUT, cwd=ROOT
        )
    unit.passed, unit.seconds = done.returncode == 0, time.monotonic() - started
    print(f"\n===== {unit.name} ({', '.join(unit.sessions)}) =====", flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    verdict = "passed" if unit.passed else f"FAILED (exit {done.returncode})"
    print(f"===== {unit.name}: {verdict} in {unit.seconds:.0f} s =====", flush=True)
    return unit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=2, help="units run side by side (default 2)")
    lanes = parser.parse_args().lanes
    if lanes < 1:
        parser.error("--lanes must be at least 1")
    started = time.monotonic()
    everything = units()
    for unit in everything:  # those that fill the cores, alone
        if unit.fills_cores:
            run(unit)
    side_by_side = [u for u in everything if not u.fills_cores]
    side_by_side.sort(key=lambda u: (u.alone, -len(u.sessions)))  # the long groups first
    with ThreadPoolExecutor(lanes) as pool:
        list(pool.map(run, side_by_side))
    print(f"\n{len(everything)} units, {sum(len(u.sessions) for u in everything)} sessions")
    for unit in everything:
        print(f"  {'ok    ' if unit.passed else 'FAILED'} {unit.seconds:6.0f} s  {unit.name}")
    print(f"in {(time.monotonic() - started) / 60:.1f} minutes")
    return 0 if all(u.passed for u in everything) else 1


if __name__ == "__main__":
    sys.exit(main())
