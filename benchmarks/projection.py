"""A model of a star round, checked against rehearsed runs, then projected to many workers
and large models (issue 68).

One blocking round of a star (every worker talks to the shepherd alone), as PCP runs it:

1. the shepherd sends every worker its Assignment (`down` bytes) at once, from a thread a
   worker; each transfer is held to the worker's link and to its share of the shepherd's
   link (max-min fair, as TCP flows sharing a bottleneck get);
2. each worker computes its H steps and encodes its pseudo-gradient (`compute` seconds);
3. its Result reaches the shepherd, which fetches the Delta (`up` bytes) into one of
   STAGING_BUFFERS staging buffers: at most that many uploads run at once, each holding
   its buffer until it is received and decoded (with pushed deltas, every worker sends
   as soon as it is done);
4. the shepherd merges, steps and plans the next round (`shepherd` seconds).

Every message also pays its path's one-way delay (the worker's link's plus the
shepherd's), and every byte on the wire carries TCP/IP and Ethernet headers (WIRE).
Links with loss are held to Mathis's TCP bound, 1.22 MSS / (RTT √p).

    python benchmarks/projection.py check --workers 4 8 16 32 64   # rehearse, compare (root)
    python benchmarks/projection.py project                         # the table to 10,000

`check` rehearses real DiLoCo runs (`pcp_core.rehearsal`) on a star of equal workers,
feeds the model what each steady round measured (each worker's compute and encoding,
the bytes each way, the shepherd's own work, the decoding) and compares the model's
cycle (round to round) with the measured one. `project` feeds it the GPU and codec
figures measured on the H100 machine (docs/gpu.md, benchmarks/results/codecs/speed.md)
and gives each worker's busy share for float32 DiLoCo, fp4 DiLoCo and sparse rounds.
Both write benchmarks/results/projection/<name>.json and .md with the command.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "projection"
STAGING_BUFFERS = 2  # pcp_core.shepherd.aggregation: deltas received at once
WIRE = 1514 / 1448  # an Ethernet frame's bytes per TCP payload byte (timestamps on)
MSS = 1448
TINY = "--n-layer 2 --n-embd 64 --block-size 64 --overlap none --eval-every 0"


@dataclass(frozen=True)
class Link:
    rate_mbit: float
    delay_ms: float = 0.0  # one way
    loss_percent: float = 0.0


@dataclass(frozen=True)
class Round:
    """What one blocking round moves and computes; seconds and bytes per worker."""

    compute_s: list[float]  # each worker's steps and encoding
    down_bytes: float
    up_bytes: float
    shepherd_s: float  # the shepherd's own work after the last delta
    decode_s: float = 0.0  # the shepherd's decoding of one delta
    pushed: bool = False


def rate_bytes(worker: Link, shepherd: Link) -> float:
    """The worker's path's payload rate alone: its link, held to Mathis's bound where the
    path loses packets."""
    rate = min(worker.rate_mbit, shepherd.rate_mbit) * 1e6 / 8 / WIRE
    loss = (worker.loss_percent + shepherd.loss_percent) / 100
    if loss > 0:
        rtt = 2 * (worker.delay_ms + shepherd.delay_ms) / 1000
        rate = min(rate, 1.22 * MSS / (max(rtt, 1e-3) * math.sqrt(loss)))
    return rate


def shared(flows: list[tuple[float, float, float]], capacity: float, slots: int) -> list[float]:
    """When each flow (ready at, bytes, own cap in bytes/s) has crossed a link of
    `capacity` bytes/s that it shares max-min fairly, at most `slots` at once (in the
    order they are ready). A fluid model: rates change only when a flow starts or ends."""
    order = sorted(range(len(flows)), key=lambda i: flows[i][0])
    waiting, active, done = list(order), {}, [0.0] * len(flows)
    now = 0.0
    while waiting or active:
        while waiting and len(active) < slots and flows[waiting[0]][0] <= now:
            i = waiting.pop(0)
            active[i] = flows[i][1]
        if not active:
            now = flows[waiting[0]][0]
            continue
        rates = fair_rates({i: flows[i][2] for i in active}, capacity)
        finish = min(active[i] / rates[i] for i in active)
        start = flows[waiting[0]][0] - now if waiting and len(active) < slots else math.inf
        step = min(finish, max(start, 0.0))
        for i in list(active):
            active[i] -= rates[i] * step
            if active[i] <= 1e-9 * flows[i][1] + 1e-9:
                done[i] = now + step
                del active[i]
        now += step
    return done


def fair_rates(caps: dict[int, float], capacity: float) -> dict[int, float]:
    """Max-min fair shares of `capacity` among flows held to their own caps."""
    rates, left, open_ = {}, capacity, sorted(caps, key=caps.get)
    while open_:
        share = left / len(open_)
        i = open_[0]
        if caps[i] <= share:
            rates[i] = caps[i]
            left -= caps[i]
            open_.pop(0)
        else:
            for j in open_:
                rates[j] = share
            break
    return rates


def cycle_s(round_: Round, workers: list[Link], shepherd: Link) -> float:
    """The round's cycle: from the Assignments leaving to the next round's, blocking."""
    latency = [(w.delay_ms + shepherd.delay_ms) / 1000 for w in workers]
    caps = [rate_bytes(w, shepherd) for w in workers]
    capacity = shepherd.rate_mbit * 1e6 / 8 / WIRE
    down = shared([(0.0, round_.down_bytes, c) for c in caps], capacity, len(workers))
    reported = [d + 2 * lat + c for d, lat, c in zip(down, latency, round_.compute_s, strict=True)]
    if round_.pushed:
        starts, slots = [r - lat for r, lat in zip(reported, latency, strict=True)], len(workers)
    else:  # the Fetch crosses the path before the Delta starts
        starts, slots = [r + lat for r, lat in zip(reported, latency, strict=True)], STAGING_BUFFERS
    # a staging buffer is held while the delta crosses and is decoded: as extra bytes
    sizes = [round_.up_bytes + round_.decode_s * cap for cap in caps]
    held = list(zip(starts, sizes, caps, strict=True))
    up = shared(held, capacity, slots)
    arrived = max(u + lat for u, lat in zip(up, latency, strict=True))
    return arrived + round_.shepherd_s


# --- check: rehearsed runs against the model -------------------------------------------


def star(workers: int, worker: Link, shepherd: Link) -> dict[str, Any]:
    """A scenario document: `workers` equal workers on `worker` links."""
    return {
        "name": f"star{workers}",
        "description": f"{workers} workers at {worker.rate_mbit:g} Mbit/s, star",
        "shepherd": {"rate_mbit": shepherd.rate_mbit, "delay_ms": shepherd.delay_ms},
        "workers": [
            {"name": "w", "count": workers, "rate_mbit": worker.rate_mbit,
             "delay_ms": worker.delay_ms}
        ],
    }  # fmt: skip


def steady_rounds(records: list[dict[str, Any]], skip: int) -> list[dict[str, Any]]:
    """The round records after the first `skip` (the first sends the whole model)."""
    rounds = [r for r in records if "round" in r and "cycle_s" in r]
    return rounds[skip:]


def measured_round(record: dict[str, Any], workers: int, pushed: bool) -> Round:
    """A Round from what one rehearsed round recorded."""
    compute = record["worker_compute_s"]
    encode = record.get("encode_s", 0.0)  # the slowest worker's, the same for all here
    own = sum(record.get(k, 0.0) for k in ("plan_s", "merge_s", "outer_s", "evaluate_s"))
    own += record.get("checkpoint_s", 0.0)
    return Round(
        compute_s=[compute[k] + encode for k in sorted(compute)],
        down_bytes=record["bytes_sent"] / workers,
        up_bytes=record["bytes_received"] / workers,
        shepherd_s=own,
        decode_s=record.get("decode_s", 0.0) / workers,
        pushed=pushed,
    )


def check(args: argparse.Namespace) -> dict[str, Any]:
    from pcp_core.rehearsal.harness import TrainingSettings, run_scenario
    from pcp_core.rehearsal.scenario import parse_scenario

    worker = Link(args.worker_mbit, args.worker_delay_ms)
    shepherd = Link(args.shepherd_mbit, args.shepherd_delay_ms)
    flags = tuple(args.shepherd_flags or shlex.split(TINY))
    raw: dict[int, list[tuple[dict[str, Any], float]]] = {}
    for count in args.workers:
        scenario = parse_scenario(star(count, worker, shepherd))
        settings = TrainingSettings(
            steps=args.rounds * args.inner_steps, inner_steps=args.inner_steps,
            shepherd_flags=flags, join_timeout_s=900,
        )  # fmt: skip
        run_dir = Path(tempfile.mkdtemp(prefix=f"projection-{count}-"))
        result = run_scenario(scenario, run_dir, settings, timeout_s=args.timeout)
        pushed = "pushed" in flags
        raw[count] = [
            (record, cycle_s(measured_round(record, count, pushed), [worker] * count, shepherd))
            for record in steady_rounds(result.records, skip=1)
        ]
        print(f"{count} workers: {[(round(r['cycle_s'], 3), round(p, 3)) for r, p in raw[count]]}")
    # what the model does not see (each side's handling of a message, Python's own time)
    # is one constant a round, taken from the first run alone
    first = args.workers[0]
    fixed = statistics.median(r["cycle_s"] - p for r, p in raw[first])
    rows = [
        {
            "workers": count, "round": record["round"], "measured_s": record["cycle_s"],
            "predicted_s": round(predicted + fixed, 4),
            "error": round((predicted + fixed) / record["cycle_s"] - 1, 4),
            "compute_s": max(record["worker_compute_s"].values()),
            "bytes_down": record["bytes_sent"] // count,
            "bytes_up": record["bytes_received"] // count,
        }
        for count, pairs in raw.items()
        for record, predicted in pairs
    ]  # fmt: skip
    by_count = {}
    for count in args.workers:
        mine = [r for r in rows if r["workers"] == count]
        measured = statistics.median(r["measured_s"] for r in mine)
        predicted = statistics.median(r["predicted_s"] for r in mine)
        by_count[count] = {
            "rounds": len(mine), "measured_s": round(measured, 3),
            "predicted_s": round(predicted, 3), "error": round(predicted / measured - 1, 4),
            "compute_s": round(statistics.median(r["compute_s"] for r in mine), 3),
            "bytes_down": mine[0]["bytes_down"], "bytes_up": mine[0]["bytes_up"],
        }  # fmt: skip
    return {"worker": vars(worker), "shepherd": vars(shepherd), "fixed_s": round(fixed, 4),
            "calibrated_on": first, "by_workers": by_count, "rounds": rows}  # fmt: skip


def check_markdown(result: dict[str, Any]) -> list[str]:
    lines = [
        "| workers | steady rounds | compute s (median) | bytes down / up a worker "
        "| cycle s measured | model | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for count, row in result["by_workers"].items():
        lines.append(
            f"| {count} | {row['rounds']} | {row['compute_s']} | {row['bytes_down']:,} / "
            f"{row['bytes_up']:,} | {row['measured_s']} | {row['predicted_s']} "
            f"| {row['error']:+.1%} |"
        )
    checked = [r for r in result["rounds"] if r["workers"] != result["calibrated_on"]]
    worst = max((abs(r["error"]) for r in checked), default=math.nan)
    lines += [
        "",
        f"The model's one fitted constant, {result['fixed_s']} s a round (each side's handling "
        f"of the messages), comes from the {result['calibrated_on']}-worker run alone; over "
        f"the other runs, the worst single round is {worst:.1%} off.",
    ]
    return lines


# --- project: many workers, large models -------------------------------------------------

# Parameters, and ms a step at batch 8 x 1024 tokens, bf16, on one H100 (PCP `xla`,
# benchmarks/results/gpu_larger_models.md); 7B from GPT-2 XL's MFU (42.6%) at 6 N flops
# a token.
MODELS = {
    "gpt2-small": (124e6, 20.25),
    "gpt2-medium": (355e6, 51.32),
    "gpt2-large": (774e6, 104.48),
    "gpt2-xl": (1558e6, 200.0),
    "7b": (6.7e9, 6 * 6.7e9 * 8192 / (0.426 * 989e12) * 1000),
}
# Bytes a parameter crosses the link, up / down, in a steady round; and the shepherd's
# decoding speed per core of float32 (MB/s, the H100 machine's host, one core).
ENCODINGS = {
    "float32 DiLoCo": (4.0, 4.0, 924.0),
    "fp4 DiLoCo": (0.408, 0.416, 364.0),  # GPT-2 large's measured round
    "sparse rounds": (4 / 65, 4 / 45, 850.0),  # sparse2 at 1/16 up, 1/10 down (issue 68)
}
SHEPHERD_CORES = 16


def project(args: argparse.Namespace) -> dict[str, Any]:
    worker = Link(args.worker_mbit, args.worker_delay_ms)
    shepherd = Link(args.shepherd_mbit, args.shepherd_delay_ms)
    table = []
    for model, (params, step_ms) in MODELS.items():
        compute = args.inner_steps * step_ms / 1000
        for encoding, (up, down, decode_mb_s) in ENCODINGS.items():
            decode = params * 4 / (decode_mb_s * 1e6 * SHEPHERD_CORES)
            for count in args.workers:
                round_ = Round(
                    compute_s=[compute] * count, down_bytes=params * down,
                    up_bytes=params * up, shepherd_s=0.0, decode_s=decode, pushed=args.pushed,
                )  # fmt: skip
                cycle = cycle_s(round_, [worker] * count, shepherd)
                table.append({
                    "model": model, "encoding": encoding, "workers": count,
                    "compute_s": round(compute, 3), "cycle_s": round(cycle, 3),
                    "busy": round(compute / cycle, 4),
                })  # fmt: skip
    return {"worker": vars(worker), "shepherd": vars(shepherd), "inner_steps": args.inner_steps,
            "pushed": args.pushed, "table": table}  # fmt: skip


def project_markdown(result: dict[str, Any]) -> list[str]:
    counts = sorted({row["workers"] for row in result["table"]})
    worker, shepherd = result["worker"], result["shepherd"]
    lines = [
        f"Workers on {worker['rate_mbit']:g} Mbit/s and {worker['delay_ms']:g} ms, the shepherd "
        f"on {shepherd['rate_mbit']:g} Mbit/s and {shepherd['delay_ms']:g} ms; H = "
        f"{result['inner_steps']}; deltas {'pushed' if result['pushed'] else 'fetched'}; each "
        "model's step at batch 8 x 1024 tokens on one H100. Each worker's busy share (compute "
        "over the round's cycle), blocking rounds:",
        "",
        "| model | rounds | compute s a round | " + " | ".join(f"{c:,}" for c in counts) + " |",
        "|---|---|---|" + "---|" * len(counts),
    ]
    rows: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for row in result["table"]:
        rows.setdefault((row["model"], row["encoding"]), {})[row["workers"]] = row
    for (model, encoding), by_count in rows.items():
        first = by_count[counts[0]]
        cells = " | ".join(f"{by_count[c]['busy']:.0%}" for c in counts)
        lines.append(f"| {model} | {encoding} | {first['compute_s']} | {cells} |")
    return lines


def write(name: str, command: str, result: dict[str, Any], lines: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"command": command, **result}, indent=1))
    text = [f"# {name} (benchmarks/projection.py)", "", "```", command, "```", "", *lines, ""]
    (RESULTS / f"{name}.md").write_text("\n".join(text))
    print("\n".join(lines))
    print(f"wrote {RESULTS / name}.json and .md")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["check", "project"])
    parser.add_argument("--workers", type=int, nargs="+")
    parser.add_argument("--worker-mbit", type=float, default=None)
    parser.add_argument("--worker-delay-ms", type=float, default=None)
    parser.add_argument("--shepherd-mbit", type=float, default=None)
    parser.add_argument("--shepherd-delay-ms", type=float, default=None)
    parser.add_argument("--inner-steps", type=int, default=None, help="H")
    parser.add_argument("--rounds", type=int, default=6, help="check: rounds a run")
    parser.add_argument("--timeout", type=float, default=1800, help="check: seconds a run")
    parser.add_argument("--pushed", action="store_true", help="project: deltas pushed")
    parser.add_argument("--name", default=None)
    parser.epilog = f"check: flags after -- go to pcp shepherd (default: {TINY})"
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.shepherd_flags = argv[cut + 1 :]
    command = "python benchmarks/projection.py " + shlex.join(argv)
    if args.mode == "check":
        defaults = {"workers": [4, 8, 16, 32, 64], "worker_mbit": 20, "worker_delay_ms": 20,
                    "shepherd_mbit": 200, "shepherd_delay_ms": 5, "inner_steps": 10}  # fmt: skip
        fill(args, defaults)
        result = check(args)
        write(args.name or "check", command, result, check_markdown(result))
    else:
        defaults = {"workers": [8, 64, 512, 1000, 10000], "worker_mbit": 1000,
                    "worker_delay_ms": 50, "shepherd_mbit": 10000, "shepherd_delay_ms": 5,
                    "inner_steps": 100}  # fmt: skip
        fill(args, defaults)
        result = project(args)
        write(args.name or "project", command, result, project_markdown(result))
    return 0


def fill(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
