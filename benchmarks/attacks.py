"""Attacks on a DiLoCo run by workers that hold valid credentials, against each aggregator.

Each scenario is real processes on loopback: `pcp shepherd`, honest `pcp worker`s and
attackers (`python -m pcp_core.testing.attacker`), the tiny model on the CPU. For each
it reports the final validation loss against two runs of the same seed and rounds: the
honest workers alone, and the honest workers beside as many `absent` attackers, whose
every result is refused (the honest workers then read the data shards they read in the
attacked run: on 20 rounds of the tiny model the layout alone moves the loss by up to 5%
either way). It also reports the round in which the log first names an attacker, and what
the run did with them (left out, down-weighted, quarantined: summary.json).

    python benchmarks/attacks.py                       # every attack, the default aggregator
    python benchmarks/attacks.py --aggregators mean centered-clip --attacks flip:5 lazy
    python benchmarks/attacks.py --seeds 0 1 2 --rounds 20 --inner-steps 10

Results: benchmarks/results/attacks.{json,md} (or --stem).
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
# (attack, attackers, workers in all): the table
SCENARIOS = [
    ("flip:1", 1, 4),
    ("flip:5", 1, 4),
    ("flip:9", 1, 8),
    ("random", 1, 4),
    ("ratchet:1.5", 1, 4),
    ("ratchet:1.5", 2, 4),
    ("flip:1", 2, 4),
    ("lazy", 1, 4),
    ("transpose", 1, 4),
]


@dataclass
class Outcome:
    attack: str
    attackers: int
    workers: int
    aggregator: str
    seed: int
    val_loss: float
    honest_val_loss: float
    vs_honest: float  # relative
    absent_val_loss: float  # the honest workers beside `absent` attackers
    vs_absent: float
    first_named_round: int | None
    quarantined: list[str]
    wall_s: float


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(
    folder: Path,
    honest: int,
    attack: str | None,
    attackers: int,
    aggregator: str,
    seed: int,
    rounds: int,
    inner_steps: int,
    extra: list[str],
) -> tuple[dict, str]:
    """One run to its end: its summary and the shepherd's log."""
    folder.mkdir(parents=True)
    token = folder / "token"
    token.write_text("attack-benchmark-secret\n")
    token.chmod(0o600)
    port, workers = free_port(), honest + attackers
    pcp = [sys.executable, "-m", "pcp_core"]
    shepherd = [*pcp, "shepherd", "--backend", "cpu", "--workers", str(workers)]
    shepherd += ["--port", str(port), "--token-file", str(token), "--seed", str(seed)]
    shepherd += ["--steps", str(rounds * inner_steps), "--inner-steps", str(inner_steps)]
    shepherd += ["--eval-every", "0", "--aggregator", aggregator, "--out", str(folder / "run")]
    processes = [_start(shepherd, folder / "shepherd.log")]
    address = f"127.0.0.1:{port}"
    time.sleep(1.0)
    for i in range(honest):
        worker = [*pcp, "worker", "--connect", address, "--token-file", str(token)]
        worker += ["--restarts", "0", "--state-dir", str(folder / f"honest-{i}"), *extra]
        processes.append(_start(worker, folder / f"honest-{i}.log"))
    # the attackers join last, so the honest workers hold the indices (and data shards)
    # of the run of the honest workers alone
    while attack and (folder / "shepherd.log").read_text().count('"worker joined"') < honest:
        if processes[0].poll() is not None:
            break
        time.sleep(0.2)
    for i in range(attackers if attack else 0):
        bad = [sys.executable, "-m", "pcp_core.testing.attacker", attack, address]
        bad += ["--token-file", str(token), "--state-dir", str(folder / f"attacker-{i}")]
        bad += ["--name", f"attacker-{i}", "--seed", str(seed * 100 + i)]
        processes.append(_start(bad, folder / f"attacker-{i}.log"))
    try:
        code = processes[0].wait(1800)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    log = (folder / "shepherd.log").read_text()
    if code != 0:
        raise RuntimeError(f"the shepherd exited {code}: {log[-3000:]}")
    return json.loads((folder / "run" / "summary.json").read_text()), log


def _start(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


NAMING = ("result rejected", "result left out", "result down-weighted", "worker quarantined")


def first_named_round(log: str) -> int | None:
    """The first round in which a refusal, a down-weighting or a quarantine names an
    attacker."""
    rounds = []
    for line in log.splitlines():
        if "attacker-" in line and any(event in line for event in NAMING):
            found = re.search(r'\bround"?[=:] ?(\d+)', line)  # console or JSON lines
            if found:
                rounds.append(int(found.group(1)))
    return min(rounds) if rounds else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aggregators", nargs="+", default=["centered-clip"])
    parser.add_argument("--attacks", nargs="*", default=None, help="default: the table")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--stem", default="attacks")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs' folders here")
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if args.attacks is None or s[0] in args.attacks]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="pcp-attacks-") as scratch:
        folder = args.keep or Path(scratch)
        for seed in args.seeds:
            honest_loss: dict[tuple[int, int, str], float] = {}
            for attack, attackers, workers in chosen:
                for aggregator in args.aggregators:
                    honest = workers - attackers
                    common = (seed, args.rounds, args.inner_steps, [])
                    for absent in (0, attackers):
                        if (honest, absent, aggregator) not in honest_loss:
                            where = folder / f"honest-{honest}-{absent}-{aggregator}-{seed}"
                            summary, _ = run(where, honest, "absent", absent, aggregator, *common)
                            honest_loss[honest, absent, aggregator] = summary["final_val_loss"]
                    started = time.perf_counter()
                    where = folder / f"{attack}-{attackers}-{workers}-{aggregator}-{seed}"
                    summary, log = run(where, honest, attack, attackers, aggregator, *common)
                    base = honest_loss[honest, 0, aggregator]
                    layout = honest_loss[honest, attackers, aggregator]
                    outcome = Outcome(
                        attack,
                        attackers,
                        workers,
                        aggregator,
                        seed,
                        summary["final_val_loss"],
                        base,
                        summary["final_val_loss"] / base - 1,
                        layout,
                        summary["final_val_loss"] / layout - 1,
                        first_named_round(log),
                        sorted(summary.get("quarantined", {})),
                        round(time.perf_counter() - started, 1),
                    )
                    print(json.dumps(asdict(outcome)), flush=True)
                    outcomes.append(outcome)
    write(args.results, args.stem, outcomes, args)


def write(results: Path, stem: str, outcomes: list[Outcome], args: argparse.Namespace) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{stem}.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    lines = [
        f"# Attacks by workers holding valid credentials ({args.rounds} rounds of "
        f"{args.inner_steps} steps, tiny model, CPU)",
        "",
        "`python benchmarks/attacks.py " + " ".join(sys.argv[1:]) + "`",
        "",
        "| attack | attackers / workers | aggregator | seed | val loss | honest alone | vs it "
        "| beside absent attackers | vs it | first named (round) | quarantined |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.attack} | {o.attackers} / {o.workers} | {o.aggregator} | {o.seed} | "
            f"{o.val_loss:.4f} | {o.honest_val_loss:.4f} | {o.vs_honest:+.1%} | "
            f"{o.absent_val_loss:.4f} | {o.vs_absent:+.1%} | "
            f"{o.first_named_round if o.first_named_round is not None else '-'} | "
            f"{', '.join(o.quarantined) or '-'} |"
        )
    lines += [
        "",
        "Mean over the seeds:",
        "",
        "| attack | attackers / workers | aggregator | vs honest alone | vs beside absent "
        "attackers | worst vs absent |",
        "|---|---|---|---|---|---|",
    ]
    cells: dict[tuple[str, int, int, str], list[Outcome]] = {}
    for o in outcomes:
        cells.setdefault((o.attack, o.attackers, o.workers, o.aggregator), []).append(o)
    for (attack, attackers, workers, aggregator), runs in cells.items():
        honest = sum(o.vs_honest for o in runs) / len(runs)
        absent = sum(o.vs_absent for o in runs) / len(runs)
        worst = max(o.vs_absent for o in runs)
        lines.append(
            f"| {attack} | {attackers} / {workers} | {aggregator} | {honest:+.1%} | "
            f"{absent:+.1%} | {worst:+.1%} |"
        )
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
