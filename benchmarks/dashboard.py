"""Does the live dashboard slow training? Rounds per second with and without it.

The same local DiLoCo run (2 workers on the CPU, a tiny model, short rounds so that any
cost of drawing shows) is run alternately with the dashboard on a pseudo-terminal of
150x50 and with `--no-dashboard` (log lines to a pipe), `--repeats` times each. Rounds per
second come from the run's own metrics.jsonl, first round excluded (joining, compiling);
validation runs every 10 rounds in both. A screen of the dashboard half-way through a
run of its own, as a terminal emulator (pyte) shows it, is saved for the README. Writes
benchmarks/results/dashboard.json, .md and dashboard_screen.txt.

    python benchmarks/dashboard.py                 # 3 runs of each, 60 rounds
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]
WIDTH, HEIGHT = 150, 50


def command(out: Path, rounds: int, inner_steps: int) -> list[str]:
    steps = str(rounds * inner_steps)
    return [
        sys.executable, "-m", "pcp_core", "train", "--algorithm", "diloco", "--workers", "2",
        "--steps", steps, "--inner-steps", str(inner_steps), "--batch-size", "4",
        "--eval-every", str(10 * inner_steps), "--out", str(out), *TINY,
    ]  # fmt: skip


def rounds_per_s(out: Path) -> float:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0]["elapsed_s"], records[-1]["elapsed_s"]
    return (len(records) - 1) / (last - first)


def with_dashboard(args: list[str]) -> None:
    """Run on a pseudo-terminal whose output is read and dropped, as cheaply as a
    terminal would take it (no emulation here: it would compete for the same cores)."""
    import pexpect

    env = {**os.environ, "TERM": "xterm-256color", "PCP_LOG_FORMAT": "auto"}
    run = pexpect.spawn(args[0], args[1:], env=env, dimensions=(HEIGHT, WIDTH), timeout=None)
    with contextlib.suppress(pexpect.EOF):
        while True:
            run.read_nonblocking(1 << 20, timeout=None)
    run.close()
    if run.exitstatus != 0:
        raise RuntimeError(f"the run with the dashboard failed: {run.exitstatus}")


def screen_of(out: Path, args: list[str], capture_at: int) -> str:
    """The dashboard as a terminal emulator (pyte) shows it once the run has written
    `capture_at` metrics records (a run of its own, not timed)."""
    import pexpect
    import pyte

    env = {**os.environ, "TERM": "xterm-256color", "PCP_LOG_FORMAT": "auto"}
    run = pexpect.spawn(args[0], args[1:], env=env, dimensions=(HEIGHT, WIDTH), timeout=None)
    screen = pyte.Screen(WIDTH, HEIGHT)
    stream = pyte.ByteStream(screen)
    captured, metrics = "", out / "metrics.jsonl"
    with contextlib.suppress(pexpect.EOF):
        while True:
            with contextlib.suppress(pexpect.TIMEOUT):
                stream.feed(run.read_nonblocking(1 << 20, timeout=0.05))
            due = not captured and metrics.exists()
            if due and metrics.read_text().count("\n") >= capture_at:
                time.sleep(0.6)  # a redraw later
                with contextlib.suppress(pexpect.TIMEOUT):
                    stream.feed(run.read_nonblocking(1 << 20, timeout=0.05))
                captured = "\n".join(line.rstrip() for line in screen.display).rstrip()
    run.close()
    return captured


def without_dashboard(args: list[str]) -> None:
    env = {**os.environ, "PCP_LOG_FORMAT": "json"}
    subprocess.run([*args, "--no-dashboard"], env=env, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--inner-steps", type=int, default=20)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"dashboard": [], "no dashboard": []}
    with tempfile.TemporaryDirectory() as folder:
        os.environ.setdefault("PCP_CACHE_DIR", str(Path(folder) / "cache"))
        out = Path(folder) / "screen"  # first: it also fills the compile cache for all
        screen = screen_of(out, command(out, args.rounds, args.inner_steps), args.rounds // 2)
        for repeat in range(args.repeats):
            for mode in rates:  # alternating, so drift in the machine hits both alike
                out = Path(folder) / f"{mode.replace(' ', '-')}-{repeat}"
                run = command(out, args.rounds, args.inner_steps)
                if mode == "dashboard":
                    with_dashboard(run)
                else:
                    without_dashboard(run)
                rates[mode].append(rounds_per_s(out))
                print(f"{mode}, run {repeat + 1}: {rates[mode][-1]:.2f} rounds/s", flush=True)
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    ratio = median["dashboard"] / median["no dashboard"]
    args.results.mkdir(parents=True, exist_ok=True)
    settings = {**vars(args), "results": str(args.results)}
    figures = {"rounds_per_s": rates, "median": median, "ratio": ratio, "settings": settings}
    (args.results / "dashboard.json").write_text(json.dumps(figures, indent=2) + "\n")
    table = [
        "| mode | rounds/s (each run) | median |",
        "|---|---|---|",
        *(
            f"| {mode} | {', '.join(f'{v:.2f}' for v in values)} | {median[mode]:.2f} |"
            for mode, values in rates.items()
        ),
        "",
        f"With the dashboard: {ratio:.3f}x the rounds per second without it "
        f"({args.rounds} rounds of {args.inner_steps} inner steps, 2 CPU workers, "
        f"`python benchmarks/dashboard.py --repeats {args.repeats}`).",
    ]
    (args.results / "dashboard.md").write_text("\n".join(table) + "\n")
    if screen:
        (args.results / "dashboard_screen.txt").write_text(screen + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
