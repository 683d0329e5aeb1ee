"""The whole training loop against the step benchmark: `pcp train` on a prepared dataset.

Issue 32, part 4: `pcp train --backend xla --model-size gpt2-small --precision bf16`
on a dataset prepared by `pcp data prepare` (read from memmapped shards), evaluation,
checkpoints and logging included, should reach 95% of the tokens/s of the step alone
(`torch_anchor.py`'s xla row at the same batch and steps per call).

    # a dataset whose vocabulary is GPT-2's padded one (50304), from any text
    python benchmarks/loop_time.py prepare tinyshakespeare.txt -o data/shakespeare50304
    # one run of the command; appends a row to RESULTS/STEM.jsonl
    python benchmarks/loop_time.py run --data data/shakespeare50304 --label pcp \\
        --batch 16 --steps 400 --steps-per-call 10 --eval-every 100
    # the rows beside the step benchmark's row (torch_anchor.py's JSON)
    python benchmarks/loop_time.py table --step-json anchor_b16.json

The loop's rate is the tokens trained between its first and last metrics record over
the time between them: the first call and the compiles before it are left out (as the
step benchmark leaves out its warm-up call), every evaluation and checkpoint in between
is in. The tokenizer is a byte-level BPE trained on the text, its vocabulary padded to
50304 ids with one unused token, so the model is GPT-2 small's size exactly.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
GPT2_VOCABULARY = 50304  # GPT-2's 50257, padded to a multiple of 64
H100_BF16_DENSE_TFLOPS = 989.0
GPT2_SMALL = {"parameters": 124_475_904, "n_layer": 12, "n_embd": 768, "block_size": 1024}


def pcp(*args: str) -> list[str]:
    return [sys.executable, "-m", "pcp_core", *args]


def prepare(text: Path, output: Path, vocabulary: int) -> None:
    """A BPE learnt from `text`, padded to `vocabulary` ids, then `pcp data prepare`."""
    from pcp_core.data.tokenizers import train_bpe

    output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = json.loads(train_bpe([text.read_text(encoding="utf-8")], vocabulary).to_json())
    spec = tokenizer["tokenizer"]
    spec["model"]["vocab"]["<|pad|>"] = vocabulary - 1  # never produced: it only sizes the model
    tokenizer_file = output.parent / f"{output.name}.tokenizer.json"
    tokenizer_file.write_text(json.dumps(spec))
    command = pcp("data", "prepare", str(text), "-o", str(output), "--tokenizer")
    subprocess.run([*command, str(tokenizer_file), "--overwrite"], check=True)


def flops_per_token(model: dict[str, int]) -> int:
    return 6 * model["parameters"] + 12 * model["n_layer"] * model["n_embd"] * model["block_size"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One `pcp train` run; its loop's rate from metrics.jsonl."""
    out = args.out or Path(f"runs/loop_{args.label}")
    command = pcp(
        "train",
        *("--backend", args.backend, "--model-size", args.model_size),
        *("--precision", args.precision, "--data", str(args.data)),
        *("--batch-size", str(args.batch), "--steps", str(args.steps)),
        *("--steps-per-call", str(args.steps_per_call), "--eval-every", str(args.eval_every)),
        *("--out", str(out), "--overwrite"),
    )
    print(" ".join(command[2:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    wall_s = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "step" in r and "tokens" in r]
    first, last = records[0], records[-1]
    loop_s = last["elapsed_s"] - first["elapsed_s"]
    tokens_per_s = (last["tokens"] - first["tokens"]) / loop_s
    summary = json.loads((out / "summary.json").read_text())
    evaluations = [r["step"] for r in records[:-1] if "val_loss" in r]
    # the time between records: a call alone, or a call and what followed it (evaluation,
    # checkpoint); what the evaluations cost is the total above the calls' median
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in itertools.pairwise(records)]
    median_gap = sorted(gaps)[len(gaps) // 2]
    extra_s = loop_s - median_gap * len(gaps)
    return {
        "label": args.label,
        "command": "pcp " + " ".join(command[3:]),
        "batch_size": args.batch,
        "steps_per_call": args.steps_per_call,
        "steps": args.steps,
        "eval_every": args.eval_every,
        "evaluations_inside": evaluations,
        "loop_s": round(loop_s, 3),
        "loop_tokens_per_s": round(tokens_per_s),
        "loop_ms_per_step": round(1000 * loop_s / (last["step"] - first["step"]), 2),
        "compute_tokens_per_s": round(summary["tokens_per_s"]),  # the calls alone
        "wall_s": round(wall_s, 1),
        "final_loss": last["loss"],
        "final_val_loss": summary.get("final_val_loss"),
        "median_call_ms": round(1000 * median_gap, 2),
        "extra_ms_per_evaluation": round(1000 * extra_s / max(len(evaluations), 1), 1),
        "record_gaps_ms": [round(1000 * g, 1) for g in gaps],
    }


def table(rows: list[dict[str, Any]], step: list[dict[str, Any]], peak: float) -> str:
    per_token = flops_per_token(GPT2_SMALL)
    lines = [
        "| what | batch | K | evaluations | ms/step | tokens/s | MFU | vs the step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in step:
        mfu = row["tokens_per_s"] * per_token / (peak * 1e12)
        lines.append(
            f"| step: {row['what']} | {row['batch_size']} | {row['steps_per_call']} | — | "
            f"{row['ms_per_step']} | {row['tokens_per_s']:,} | {mfu:.1%} | |"
        )
    reference = {r["batch_size"]: r for r in step if r["what"] == "pcp xla"}
    for row in rows:
        mfu = row["loop_tokens_per_s"] * per_token / (peak * 1e12)
        base = reference.get(row["batch_size"])
        ratio = f"{row['loop_tokens_per_s'] / base['tokens_per_s']:.1%}" if base else ""
        lines.append(
            f"| loop: {row['label']} | {row['batch_size']} | {row['steps_per_call']} | "
            f"every {row['eval_every'] or '—'} ({len(row['evaluations_inside'])} inside) | "
            f"{row['loop_ms_per_step']} | {row['loop_tokens_per_s']:,} | {mfu:.1%} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prepare", help="a GPT-2-sized BPE dataset from a text file")
    p.add_argument("text", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--vocab-size", type=int, default=GPT2_VOCABULARY)
    r = sub.add_parser("run", help="one pcp train run")
    r.add_argument("--data", type=Path, required=True)
    r.add_argument("--label", default="pcp")
    r.add_argument("--backend", default="xla")
    r.add_argument("--model-size", default="gpt2-small")
    r.add_argument("--precision", default="bf16")
    r.add_argument("--batch", type=int, default=16)
    r.add_argument("--steps", type=int, default=400)
    r.add_argument("--steps-per-call", type=int, default=10)
    r.add_argument("--eval-every", type=int, default=100)
    r.add_argument("--out", type=Path, default=None, help="the run directory")
    t = sub.add_parser("table", help="the runs beside the step benchmark")
    t.add_argument("--step-json", type=Path, nargs="*", default=[])
    t.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS)
    for each in (r, t):
        each.add_argument("--results", type=Path, default=RESULTS)
        each.add_argument("--stem", default="loop_time")
    args = parser.parse_args()
    if args.what == "prepare":
        prepare(args.text, args.output, args.vocab_size)
        return
    rows_file = args.results / f"{args.stem}.jsonl"
    if args.what == "run":
        row = run(args)
        print(json.dumps(row), flush=True)
        args.results.mkdir(parents=True, exist_ok=True)
        with rows_file.open("a") as file:
            file.write(json.dumps(row) + "\n")
        return
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    step = [r for f in args.step_json for r in json.loads(f.read_text())["rows"]]
    text = table(rows, step, args.peak_tflops)
    (args.results / f"{args.stem}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
