"""The anchor: PCP's nanoGPT train step in PyTorch, timed beside PCP's `xla` backend.

What a GPU owner would write instead of PCP: the same model (pre-norm blocks, GELU
tanh MLP, tied embeddings, LayerNorm eps 1e-5, no dropout) started from the very
parameters `pcp_core.program.nanogpt.init` draws, with SDPA attention, fused AdamW (PCP's
defaults: betas 0.9/0.99, eps 1e-8, weight decay 0.1 on matrices only, PCP's warmup +
cosine schedule), global-norm clipping at 1.0 and bf16 autocast; run eagerly and
through `torch.compile`. In the same process, on the same batches, PCP's `xla` backend
runs its exported step (K steps a call). Each way is timed as K steps a call, the
batch copied to the device and the losses read back at the call's end; the figure is
the median ms a step after one warm-up call. The losses of every way are compared
step by step with the first PCP row's: the comparison is of equal work. One way's calls
run after another's unless `--interleave` has them take turns, call by call: a GPU
machine's speed drifts by a few percent over a minute, and turns spread that drift over
every way alike. `--power` adds each way's median SM clock, mean power and joules a step
over its timed calls (`gpu_power.py`): at a GPU's power cap, time follows energy.
`--remat blocks` recomputes each block in the backward pass in both: PCP's `--remat
blocks`, and torch.utils.checkpoint around each of torch's blocks.

    python benchmarks/torch_anchor.py --quick            # CPU: the tiny model, f32
    python benchmarks/torch_anchor.py --size gpt2-small --batch 8 16 --precision bf16 \
        --torch compiled --interleave --calls 10
    python benchmarks/torch_anchor.py --size gpt2-xl --batch 16 --remat blocks \
        --torch compiled

FLOPs a step = tokens × (6 × parameters + 12 × layers × width × block); MFU is that
over the time and `--peak-tflops` (H100 dense bf16: 989). Memory: torch's peak allocated
bytes; for PCP, what XLA's compiled step says it needs (state, batch, temporaries), as
jax's own peak counts every earlier program's too. A way that fails (out of memory at a
large batch) is a row that says so. The table goes to `--results`/`--stem`.md, every
row with its losses to .json. Needs torch, which is no dependency of PCP: install it
beside.
"""

import argparse
import contextlib
import functools
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, NamedTuple

import gpu_power
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

RESULTS = Path(__file__).parent / "results"
H100_BF16_DENSE_TFLOPS = 989.0


def flops_per_step(config: dict[str, int], parameters: int, batch: int) -> float:
    layers, width, block = config["n_layer"], config["n_embd"], config["block_size"]
    return batch * block * (6.0 * parameters + 12.0 * layers * width * block)


def schedule(steps: int) -> list[float]:
    """PCP's inner learning rate (InnerSettings defaults) for steps 0 .. steps-1."""
    import jax

    from pcp_core.optimizers import InnerSettings, learning_rate

    with jax.default_device(jax.devices("cpu")[0]):
        lr = learning_rate(InnerSettings())
        return [float(lr(step)) for step in range(steps)]


# --- the model in PyTorch ---------------------------------------------------------------


def torch_model(config: dict[str, int], params: dict[str, np.ndarray], device: Any) -> Any:
    """nanoGPT as PCP builds it, its weights copied from PCP's (matrices transposed:
    PCP multiplies x @ W, torch's Linear x @ Wᵀ); with the config's `remat`, each block
    under torch.utils.checkpoint."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    width, heads = config["n_embd"], config["n_head"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(width, eps=1e-5)
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.ln_2 = nn.LayerNorm(width, eps=1e-5)
            self.c_fc = nn.Linear(width, 4 * width)
            self.mlp_proj = nn.Linear(4 * width, width)

        def forward(self, x: Any) -> Any:
            batch, time, _ = x.shape
            qkv = self.c_attn(self.ln_1(x)).view(batch, time, 3, heads, width // heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(attended.transpose(1, 2).reshape(batch, time, width))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(config["vocab_size"], width)
            self.wpe = nn.Embedding(config["block_size"], width)
            self.h = nn.ModuleList(Block() for _ in range(config["n_layer"]))
            self.ln_f = nn.LayerNorm(width, eps=1e-5)

        def forward(self, tokens: Any, targets: Any) -> Any:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.wte(tokens) + self.wpe(positions)
            for block in self.h:
                x = checkpoint(block, x, use_reentrant=False) if config.get("remat") else block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    model = GPT()
    renames = {"attn.c_attn": "c_attn", "attn.c_proj": "c_proj", "mlp.c_fc": "c_fc"}
    renames["mlp.c_proj"] = "mlp_proj"
    state = {}
    for name, value in params.items():
        for old, new in renames.items():
            name = name.replace(old, new)
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        if name in ("wte", "wpe"):
            name += ".weight"
        elif name.endswith(".weight") and value.ndim == 2:
            tensor = tensor.T.contiguous()
        state[name] = tensor
    model.load_state_dict(state, strict=True)
    return model.to(device)


def torch_optimizer(model: Any, device: Any) -> Any:
    """PCP's AdamW settings; fused where torch has a fused kernel for the device."""
    import torch

    from pcp_core.optimizers import InnerSettings

    s = adamw_settings()
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": matrices, "weight_decay": s.weight_decay},
        {"params": others, "weight_decay": 0.0},
    ]
    kwargs = {"lr": InnerSettings().lr, "betas": (s.beta1, s.beta2), "eps": s.eps}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


def adamw_settings() -> Any:
    """PCP's AdamW betas, eps and weight decay at their defaults (`[adamw]`)."""
    import pcp_adamw

    return pcp_adamw.AdamWSettings()


def torch_calls(
    way: str,
    config: dict[str, int],
    params: dict[str, np.ndarray],
    batches: list[tuple[np.ndarray, np.ndarray]],
    precision: str,
    device_name: str,
    profile: bool = False,
    ncu: bool = False,
) -> Generator[None, None, dict[str, Any]]:
    """`way` ("eager" or "compiled") over `batches`, a call each time it is resumed;
    returns ms a step of each call and the losses, with `profile` the GPU kernels of one
    more call (see `kernel_table`), with `ncu` one more call for Nsight Compute
    (`ncu_range`)."""
    import torch

    from pcp_core.optimizers import InnerSettings

    device = torch.device(device_name)
    torch.manual_seed(0)
    model = torch_model(config, params, device)
    optimizer = torch_optimizer(model, device)
    forward = torch.compile(model, dynamic=False) if way == "compiled" else model
    k = len(batches[0][0])
    rates = schedule(k * len(batches))
    clip = InnerSettings().grad_clip
    parameters = list(model.parameters())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step(x: Any, y: Any, lr: float) -> Any:
        with autocast:
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, clip, foreach=True)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    times, losses, windows = [], [], []
    for call, (inputs, targets) in enumerate(batches):
        synchronize(device)
        started, began = time.perf_counter(), time.time()
        x = torch.from_numpy(inputs).to(device, torch.long, non_blocking=True)
        y = torch.from_numpy(targets).to(device, torch.long, non_blocking=True)
        call_losses = [step(x[i], y[i], rates[call * k + i]) for i in range(k)]
        losses += torch.stack(call_losses).float().cpu().tolist()  # waits for the GPU
        times.append((time.perf_counter() - started) / k)
        windows.append((began, time.time()))
        yield
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    result = {
        "times": times,
        "losses": losses,
        "windows": windows,
        "peak_memory_gb": round(peak / 2**30, 2),
    }
    if not (profile or ncu):
        return result
    inputs, targets = batches[-1]
    x = torch.from_numpy(inputs).to(device, torch.long)
    y = torch.from_numpy(targets).to(device, torch.long)

    def one_more_call() -> None:
        torch.stack([step(x[i], y[i], rates[-1]) for i in range(k)]).cpu()

    if profile:
        result["kernels"] = kernel_table(one_more_call)
    if ncu:
        ncu_range(one_more_call)
    return result


def kernel_table(call: Any, rows: int = 200) -> str | None:
    """The GPU kernels that `call` ran, by total time, as torch's profiler (CUPTI) saw
    them (it sees every kernel of the process, XLA's too), then where the GPU sat idle
    between them (`idle_report`). None without a CUDA GPU."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize()
    table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=rows)
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    return table + "\n" + idle_report(events) + "\n" + edges_report(events)


def ncu_range(call: Callable[[], Any]) -> None:
    """Run `call` between cuProfilerStart and cuProfilerStop: the range that
    `ncu --profile-from-start off` profiles, one call of each way. Through the driver
    (ctypes), as torch and XLA both run in device 0's primary context. XLA's compile of
    PCP's step has crashed under ncu (benchmarks/results/gpu/h200/2026-11-29-power)."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    context = ctypes.c_void_p()
    if cuda.cuCtxGetCurrent(ctypes.byref(context)) or not context.value:
        device = ctypes.c_int()  # this thread has no context yet: take the primary one
        for status in (
            cuda.cuInit(0),
            cuda.cuDeviceGet(ctypes.byref(device), 0),
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
            cuda.cuCtxSetCurrent(context),
        ):
            if status:
                raise RuntimeError(f"CUDA driver error {status} setting up the profiled range")
    cuda.cuCtxSynchronize()
    if status := cuda.cuProfilerStart():
        raise RuntimeError(f"CUDA driver error {status} starting the profiled range")
    try:
        call()
        cuda.cuCtxSynchronize()
    finally:
        cuda.cuProfilerStop()


def edges_report(events: list[dict[str, Any]], rows: int = 40) -> str:
    """The first and last `rows` events of the call, the host's CUDA API calls with the
    GPU's work, each at its start (us from the first event) with its duration: what the
    host and the GPU did while the GPU waited at the call's edges."""
    timed = sorted(
        (
            e
            for e in events
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")
        ),
        key=lambda e: e["ts"],
    )
    if not timed:
        return "no events in the trace\n"
    origin = timed[0]["ts"]

    def line(e: dict[str, Any]) -> str:
        at, took = e["ts"] - origin, e.get("dur", 0)
        return f"{at:10.1f} | {took:8.1f} | {e['cat']:12} | {e.get('name', '?')[:70]}"

    head = "at (us) | took (us) | what | name"
    first = [line(e) for e in timed[:rows]]
    last = [line(e) for e in timed[-rows:]] if len(timed) > rows else []
    return "\n".join(
        [f"the call's first events:\n{head}", *first, f"its last events:\n{head}", *last, ""]
    )


def idle_report(events: list[dict[str, Any]], rows: int = 25) -> str:
    """From a chrome trace's GPU events (kernels, copies, memsets, one stream or
    several): the time they cover, the time between them, and the kernels the GPU
    waited longest before (the idle time before each start, summed by name)."""
    gpu = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        key=lambda e: e["ts"],
    )
    if not gpu:
        return "no GPU events in the trace\n"
    from host_trace import waits

    idle, by_name = 0.0, {}
    for idle_from, event in waits(gpu):
        gap = max(0.0, event["ts"] - idle_from)
        idle += gap
        name = event.get("name", "?")[:70]
        count, total = by_name.get(name, (0, 0.0))
        by_name[name] = (count + 1, total + gap)
    span = max(e["ts"] + e.get("dur", 0) for e in gpu) - gpu[0]["ts"]
    lines = [
        f"GPU events: {len(gpu)}, first start to last end {span / 1e3:.2f} ms, "
        f"idle between them {idle / 1e3:.2f} ms ({idle / max(len(gpu) - 1, 1):.2f} us a gap)",
        "idle before (us, summed) | starts | name",
    ]
    worst = sorted(by_name.items(), key=lambda item: -item[1][1])[:rows]
    lines += [f"{total:10.1f} | {count:6d} | {name}" for name, (count, total) in worst]
    return "\n".join(lines) + "\n"


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def release_torch() -> None:
    import torch

    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# --- PCP's xla backend ------------------------------------------------------------------


def xla_calls(
    program: Any,
    params: dict[str, np.ndarray],
    batches: list[tuple[np.ndarray, np.ndarray]],
    profile: bool = False,
    hlo: Path | None = None,
    host_trace: Path | None = None,
    ncu: bool = False,
) -> Generator[None, None, dict[str, Any]]:
    """PCP's `xla` backend (the export for this machine's platform) over `batches`, a
    call each time it is resumed; with `hlo`, the compiled step's optimized HLO written
    there; with `host_trace`, jax's profiler over two more calls
    (`host_trace.trace_two_calls`), its trace kept there; with `ncu`, one more call for
    Nsight Compute (`ncu_range`)."""
    from pcp_core import plugins

    backend = plugins.host().backend("xla")
    arch = backend.resolve_arch()
    started = time.perf_counter()
    artifact = backend.runtime.build(program, backend, arch).data
    executor = backend.runtime.open(artifact, backend, program, None)
    build_s = time.perf_counter() - started
    initial = list(params.values())
    executor.set_params(initial)
    executor.set_opt_state(program.init_opt_state(initial))
    times, losses, dispatch_s, windows = [], [], [], []
    k = program.steps_per_call
    for inputs, targets in batches:
        started, began = time.perf_counter(), time.time()
        fetch = executor.dispatch(inputs, targets)  # queued: the host's share of the call
        dispatch_s.append(time.perf_counter() - started)
        losses += [float(v) for v in fetch()]  # waits for the device
        times.append((time.perf_counter() - started) / k)
        windows.append((began, time.time()))
        yield
    peak = xla_peak_memory(executor.devices[0])
    step_memory = xla_step_memory(executor._step)
    if hlo is not None:
        hlo.parent.mkdir(parents=True, exist_ok=True)
        hlo.write_text(executor._step.as_text())
    one_more_call = functools.partial(executor.run, *batches[-1])
    kernels = kernel_table(one_more_call) if profile else None
    if ncu:
        ncu_range(one_more_call)
    traced = None
    if host_trace is not None:
        import host_trace as tracing

        traced = tracing.trace_two_calls(executor, *batches[-1], keep=host_trace)
    executor = None  # its device state goes before the next program is built
    gc.collect()
    return {
        "kernels": kernels,
        "host_trace": traced,
        "times": times,
        "losses": losses,
        "windows": windows,
        "build_and_compile_s": round(build_s, 1),
        # the host's time to queue a call: launching its kernels, before it waits for them
        "dispatch_ms_median": round(statistics.median(dispatch_s[1:]) * 1e3, 2),
        "artifact_bytes": len(artifact),
        "uses_cudnn_attention": uses_cudnn_attention(artifact),
        "step_memory_gb": step_memory,
        # the process's peak since it started, every earlier program's included
        "jax_peak_so_far_gb": peak,
    }


def uses_cudnn_attention(artifact: bytes) -> bool:
    """Whether the exported step calls cuDNN's fused attention."""
    import jax

    return "__cudnn$fmha" in jax.export.deserialize(bytearray(artifact)).mlir_module()


def xla_step_memory(compiled: Any) -> float | None:
    """What the compiled step needs on the device: its arguments (the state and the
    batch), outputs not written over donated arguments, and its temporary buffers."""
    try:
        m = compiled.memory_analysis()
        total = (
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            - m.alias_size_in_bytes
            + m.temp_size_in_bytes
        )
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    return round(total / 2**30, 2)


def xla_peak_memory(device: Any) -> float | None:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return round(stats["peak_bytes_in_use"] / 2**30, 2)


# --- the comparison ---------------------------------------------------------------------


def measure(args: argparse.Namespace, corpus: Any) -> list[dict[str, Any]]:
    """Every way at every batch size, one way's calls after another: PyTorch's first (jax
    keeps what it took of the GPU's memory; torch gives its cache back). With
    `--interleave`, the ways of a batch size take turns call by call instead, all in
    memory at once, so that the machine's drift from one call to the next falls on each
    way alike."""
    from pcp_core.program import nanogpt

    size = size_of(args)
    vocab = size.get("vocab_size", corpus.vocab_size)
    remat = {"remat": nanogpt.REMAT_BLOCKS} if args.remat == "blocks" else {}
    config = nanogpt.MODEL.config({**size["model"], "vocab_size": vocab, **remat})
    params = nanogpt.init(config, 0)
    parameters = int(sum(p.size for p in params.values()))
    runs: dict[int, list[tuple[str, dict[str, Any]]]] = {batch: [] for batch in args.batch}
    failed: list[dict[str, Any]] = []
    k, block = args.steps_per_call, config["block_size"]
    batches = {
        batch: [corpus.batches("train", k, batch, block, (0, c)) for c in range(args.calls + 1)]
        for batch in args.batch
    }

    def record(batch: int, ways: list[Way]) -> None:
        done, not_done = take_turns(batch, ways)
        runs[batch] += done
        failed.extend(not_done)

    sampler = gpu_power.PowerSampler() if args.power else None
    with sampler or contextlib.nullcontext():
        run_ways(args, config, params, batches, record)
    return failed + [
        row
        for batch in args.batch
        if runs[batch]
        for row in rows_of(
            args,
            runs[batch],
            batch,
            flops_per_step(config, parameters, batch),
            config["block_size"],
            sampler.samples if sampler else [],
        )
    ]


class Way(NamedTuple):
    """One way to run the step: its name, a function that starts its calls (a generator
    that runs one a time it is resumed), and the errors that mean it did not fit."""

    name: str
    start: Callable[[], Generator[None, None, dict[str, Any]]]
    not_fitting: tuple[type[BaseException], ...]


def run_ways(
    args: argparse.Namespace,
    config: dict[str, int],
    params: dict,
    batches: dict[int, list],
    record: Callable[[int, list[Way]], None],
) -> None:
    """Hand `record` every batch size's ways to run: all of a batch size's at once to
    take turns, or one at a time, torch's first (see `measure`)."""
    if args.interleave:
        for batch in args.batch:
            program = xla_program(args, config, batch) if args.xla else None
            record(
                batch,
                torch_ways(args, config, params, batches[batch])
                + xla_ways(args, program, params, batches[batch], batch),
            )
            del program
            release_torch()
            gc.collect()
    else:
        for batch in args.batch:
            for way in torch_ways(args, config, params, batches[batch]):
                record(batch, [way])
                release_torch()  # the model and optimizer went with the way's generator
        for batch in args.batch:
            if args.xla:
                program = xla_program(args, config, batch)
                for way in xla_ways(args, program, params, batches[batch], batch):
                    record(batch, [way])
                    gc.collect()
                del program
                gc.collect()


def torch_ways(
    args: argparse.Namespace, config: dict[str, int], params: dict, batches: list
) -> list[Way]:
    """Each of `--torch`'s ways."""
    return [
        Way(
            f"torch {way}",
            functools.partial(
                torch_calls,
                way,
                config,
                params,
                batches,
                args.precision,
                args.torch_device,
                profile=args.profile and way == "compiled",
                ncu=args.ncu,
            ),
            (RuntimeError, MemoryError),  # torch's out of memory is a RuntimeError
        )
        for way in args.torch
    ]


def xla_program(args: argparse.Namespace, config: dict[str, int], batch: int) -> Any:
    """The train program at `batch`, its schedule as state, as `pcp train` builds it."""
    import pcp_adamw

    from pcp_core.optimizers import InnerSettings, schedule_values
    from pcp_core.program import nanogpt
    from pcp_core.program.build import build_train_program

    return build_train_program(
        nanogpt.MODEL,
        config,
        pcp_adamw.build(InnerSettings()),
        steps_per_call=args.steps_per_call,
        batch_size=batch,
        precision=args.precision,
        schedule=schedule_values(InnerSettings()),
    )


def xla_ways(
    args: argparse.Namespace, program: Any, params: dict, batches: list, batch: int
) -> list[Way]:
    """PCP's `xla` step, unless `--no-xla`."""
    if not args.xla:
        return []
    hlo = args.hlo_dir / f"pcp_b{batch}.hlo.txt" if args.hlo_dir else None
    trace = None
    if args.host_trace:
        trace = args.results / f"{args.stem}_pcp_b{batch}.perfetto.json.gz"
    start = functools.partial(
        xla_calls,
        program,
        params,
        batches,
        profile=args.profile,
        hlo=hlo,
        host_trace=trace,
        ncu=args.ncu,
    )
    return [Way("pcp xla", start, (Exception,))]  # XLA's out of memory is of no one class


def take_turns(
    batch: int, ways: list[Way]
) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """Run `ways` a call each in turn until all have finished: their results, and a row
    for each that did not fit."""
    running = {}
    for way in ways:
        print(f"batch {batch}: {way.name}", flush=True)
        running[way.name] = (way.start(), way.not_fitting)
    done: dict[str, dict[str, Any]] = {}
    failed = []
    while running:
        for name, (calls, not_fitting) in list(running.items()):
            try:
                next(calls)
            except StopIteration as finished:
                done[name] = finished.value
                said(name, batch, finished.value)
                del running[name]
            except not_fitting as error:
                failed.append(did_not_fit(name, batch, error))
                del running[name]
    return [(way.name, done[way.name]) for way in ways if way.name in done], failed


def said(what: str, batch: int, run: dict[str, Any]) -> None:
    """One line as each way finishes, so a run cut short still tells what it measured."""
    ms = statistics.median(run["times"][1:]) * 1e3
    memory = run.get("step_memory_gb", run.get("peak_memory_gb"))
    print(f"batch {batch}: {what}: {ms:.2f} ms/step, {memory} GB", flush=True)


def did_not_fit(what: str, batch: int, error: BaseException) -> dict[str, Any]:
    message = str(error).strip().splitlines()[0][:300] if str(error).strip() else repr(error)
    print(f"batch {batch}: {what} failed: {message}", flush=True)
    return {"what": what, "batch_size": batch, "error": message}


def rows_of(
    args: argparse.Namespace,
    runs: list[tuple[str, dict[str, Any]]],
    batch: int,
    flops: float,
    block: int,
    samples: list[tuple[float, float, float]],
) -> list[dict[str, Any]]:
    """One row a way; losses compared with the first PCP way's (else the first way's);
    with `samples` (gpu_power's), the GPU's clock and power over the way's timed calls."""
    k = args.steps_per_call
    reference_name, reference = next(((n, r) for n, r in runs if n.startswith("pcp")), runs[0])
    rows = []
    for name, run in runs:
        ms = statistics.median(run["times"][1:]) * 1e3  # call 0 warms up (and compiles)
        difference = np.abs(np.array(run["losses"]) - np.array(reference["losses"]))
        row = {
            "what": name,
            "size": args.size,
            "batch_size": batch,
            "precision": args.precision,
            "remat": args.remat,
            "steps_per_call": k,
            "ms_per_step": round(ms, 2),
            "ms_per_step_each_call": [round(t * 1e3, 2) for t in run["times"]],
            "tokens_per_s": round(batch * block / (ms / 1e3)),
            "tflops": round(flops / (ms / 1e3) / 1e12, 1),
            "first_loss": run["losses"][0],
            "last_loss": run["losses"][-1],
            "checked_loss": checked_loss(run["losses"]),
            "loss_reference": reference_name,
            "loss_max_abs_difference": float(difference.max()),
            "losses": run["losses"],
        }
        if args.peak_tflops:
            row["mfu"] = round(flops / (ms / 1e3) / (args.peak_tflops * 1e12), 4)
        power = gpu_power.during(samples, run["windows"][1:]) if samples else None
        if power:  # joules a step: the mean power over the calls' time a step
            row |= power | {"joules_per_step": round(power["power_w_mean"] * ms / 1e3, 2)}
        texts = ("kernels", "host_trace")
        kept_out = ("times", "losses", "windows", *texts)
        row |= {k: v for k, v in run.items() if k not in kept_out}
        for text in texts:
            if run.get(text):
                path = args.results / f"{args.stem}_{text}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as out:
                    out.write(f"{name}, batch {batch}, {k} steps:\n{run[text]}\n\n")
        print(json.dumps({k: v for k, v in row.items() if k != "losses"}), flush=True)
        rows.append(row)
    return rows


def size_of(args: argparse.Namespace) -> dict[str, Any]:
    from step_time import SIZES

    return SIZES[args.size]


# The steps whose losses `check_losses` compares: before the model starts to memorise
# the corpus. Past that, two bf16 runs of the same step part ways (GPT-2 small at batch
# 16 on tinyshakespeare, 410 steps: 0.40 against 0.45), as any two orders of rounding do.
CHECKED_STEPS = 60
CHECKED_WINDOW = 10


def checked_loss(losses: list[float]) -> float:
    """The mean loss of the last `CHECKED_WINDOW` steps of the first `CHECKED_STEPS`."""
    end = min(len(losses), CHECKED_STEPS)
    return statistics.fmean(losses[max(0, end - CHECKED_WINDOW) : end])


def check_losses(rows: list[dict[str, Any]], tolerance: float) -> list[str]:
    """What went wrong: a loss that did not fall, or a `checked_loss` further than
    `tolerance` (relative) from the reference's."""
    problems = []
    for row in rows:
        if "error" in row:
            continue
        if not row["last_loss"] < row["first_loss"]:
            problems.append(f"{row['what']} batch {row['batch_size']}: the loss did not fall")
        reference = next(
            r["checked_loss"]
            for r in rows
            if r["what"] == row["loss_reference"] and r["batch_size"] == row["batch_size"]
        )
        if abs(row["checked_loss"] - reference) > tolerance * abs(reference):
            problems.append(
                f"{row['what']} batch {row['batch_size']}: loss {row['checked_loss']:.4f}, "
                f"{row['loss_reference']} {reference:.4f} (steps up to {CHECKED_STEPS})"
            )
    return problems


def machine() -> dict[str, Any]:
    import jax
    import torch

    info = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "jax_device": str(jax.devices()[0].device_kind),
    }
    if torch.cuda.is_available():
        info["torch_device"] = torch.cuda.get_device_name()
    return info


def power_cells(row: dict[str, Any]) -> str:
    if "joules_per_step" not in row:
        return " | | |"
    return f" {row['sm_mhz_median']:.0f} | {row['power_w_mean']} | {row['joules_per_step']} |"


def write_results(results: Path, stem: str, info: dict, rows: list[dict], command: str) -> None:
    results.mkdir(parents=True, exist_ok=True)
    body = {"machine": info, "command": command, "rows": rows}
    (results / f"{stem}.json").write_text(json.dumps(body, indent=2) + "\n")
    mfu = any("mfu" in r for r in rows)
    power = any("joules_per_step" in r for r in rows)
    device = info.get("torch_device") or info["jax_device"]
    lines = [
        f"PCP's nanoGPT train step against the PyTorch anchor on {device} (jax {info['jax']}, "
        f"torch {info['torch']}): ms per step, median after one warm-up call\n",
        f"    {command}\n",
        "| what | batch | precision | ms/step | tokens/s | TFLOP/s |"
        + (" MFU |" if mfu else "")
        + (" SM MHz | W | J/step |" if power else "")
        + " memory (GB) | loss first → last | max |Δloss| vs PCP |",
        "|---|---|---|---|---|---|"
        + ("---|" if mfu else "")
        + ("---|---|---|" if power else "")
        + "---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['what']} | {r['batch_size']} | failed: {r['error'][:120]} |")
            continue
        memory = r.get("step_memory_gb", r.get("peak_memory_gb"))
        lines.append(
            f"| {r['what']} | {r['batch_size']} | {r['precision']} | {r['ms_per_step']} "
            f"| {r['tokens_per_s']:,} | {r['tflops']} |"
            + (f" {r['mfu']:.1%} |" if mfu else "")
            + (power_cells(r) if power else "")
            + f" {memory} |"
            + f" {r['first_loss']:.4f} → {r['last_loss']:.4f}"
            + f" | {r['loss_max_abs_difference']:.2e} |"
        )
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model on the CPU, f32")
    parser.add_argument("--size", default="gpt2-small", help="a size of step_time.SIZES")
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[8, 16], help="batch sizes: rows of each"
    )
    parser.add_argument("--precision", choices=["f32", "bf16"], default="bf16")
    parser.add_argument(
        "--remat",
        choices=["none", "blocks"],
        default="none",
        help="blocks: each block recomputed in the backward pass, in PCP and in torch",
    )
    parser.add_argument(
        "--steps-per-call", type=int, default=4, help="K: steps a call (pcp train's own)"
    )
    parser.add_argument("--calls", type=int, default=5, help="timed calls (after one warm-up)")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="the ways of a batch size take turns call by call (all in memory at once), "
        "so that the machine's drift between calls falls on each alike",
    )
    parser.add_argument(
        "--torch", nargs="*", choices=["eager", "compiled"], default=["eager", "compiled"]
    )
    parser.add_argument(
        "--xla",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PCP's xla step beside torch's ways (--no-xla: torch's alone)",
    )
    parser.add_argument("--torch-device", default=None, help="default: cuda if torch has it")
    parser.add_argument("--peak-tflops", type=float, default=None, help="default: H100's on one")
    parser.add_argument("--profile", action="store_true", help="kernel tables (CUDA only)")
    parser.add_argument(
        "--power",
        action="store_true",
        help="sample the GPU's SM clock and power with nvidia-smi: each way's median clock, "
        "mean power and joules a step over its timed calls",
    )
    parser.add_argument("--hlo-dir", type=Path, default=None, help="write each xla step's HLO")
    parser.add_argument(
        "--ncu",
        action="store_true",
        help="one more call of each way between cuProfilerStart and cuProfilerStop, for "
        "`ncu --profile-from-start off` (CUDA only; see `ncu_range`)",
    )
    parser.add_argument(
        "--host-trace",
        action="store_true",
        help="jax's profiler over two more PCP calls queued back to back: a report of where "
        "the host's time goes while the device idles, and the Perfetto trace",
    )
    parser.add_argument("--loss-tolerance", type=float, default=0.05)
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the folder for <stem>.md and .json"
    )
    parser.add_argument("--stem", default="torch_anchor")
    args = parser.parse_args()
    # jax and torch share the GPU: jax must not take 75% of it up front
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch

    from pcp_core.data import text as data

    if args.power and shutil.which("nvidia-smi") is None:
        parser.error("--power needs nvidia-smi, which is not on PATH")
    if args.quick:
        args.size, args.batch, args.precision = "default", [4], "f32"
        args.steps_per_call, args.calls = 2, 3
    if args.torch_device is None:
        args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.precision == "f32":
        torch.backends.cuda.matmul.allow_tf32 = False  # PCP's f32 is full f32
        torch.backends.cudnn.allow_tf32 = False
    if args.peak_tflops is None and "H100" in machine().get("torch_device", ""):
        args.peak_tflops = H100_BF16_DENSE_TFLOPS
    command = "python benchmarks/torch_anchor.py " + " ".join(sys.argv[1:])
    corpus = data.load_text_file(None)
    info = machine()
    rows = measure(args, corpus)
    write_results(args.results, args.stem, info, rows, command)
    problems = check_losses(rows, args.loss_tolerance)
    for problem in problems:
        print("LOSS CHECK:", problem, flush=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
