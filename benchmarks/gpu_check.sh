#!/usr/bin/env bash
# The GPU check: run on a machine with an NVIDIA GPU, from the repository root, with a
# python3 that has jax, optax, numpy, pytest, pluggy, typer, rich and safetensors.
# Wheels for what it lacks (iree-base-compiler/runtime 3.13.0, pycapnp, structlog,
# platformdirs) may be given in $WHEELS; a PYTHONPATH already set is kept (an IREE
# compiler unpacked elsewhere, say). It runs:
#   1. the backend conformance suite for cuda (IREE CUDA against JAX on the CPU),
#   2. a DiLoCo run with one cuda worker and one cpu worker,
#   3. IREE CUDA against XLA on the GPU, same train step, f32 and bf16
#      (benchmarks/step_time.py), and where the time goes (benchmarks/kernel_profile.py),
#   4. with VULKAN=1, the conformance suite for vulkan on the GPU's Vulkan driver.
# Figures go to $OUT (default benchmarks/results).
set -uo pipefail
out=${OUT:-benchmarks/results}
# Everything this script writes outside $out lies in one private folder of its own
# (mktemp: unpredictable, mode 0700), removed at the end.
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
site=$work/site
mkdir -p "$out"
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$site" \
        "$WHEELS"/*.whl
fi
PYTHONPATH=$(python3 scripts/register_checkout.py "$site")${PYTHONPATH:+:$PYTHONPATH} || exit 1
# The compile cache is this run's own: PCP uses only a cache no one else can write to.
cache=$work/cache
export PYTHONPATH PCP_CACHE_DIR=$cache PYTHONUNBUFFERED=1 COLUMNS=160
status=0
step() { echo; echo "=== $*"; }

step "device"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
python3 -m pcp_core devices

step "1. conformance suite: cuda"
JAX_PLATFORMS=cpu python3 -m pytest -q -rs -p no:cacheprovider plugins/pcp-iree-cuda || status=1

step "2. DiLoCo: one cuda worker + one cpu worker"
JAX_PLATFORMS=cpu python3 -m pcp_core train --algorithm diloco --worker-backends cuda,cpu \
    --steps 300 --inner-steps 50 --eval-every 50 --out "$out/gpu-diloco" 2>&1 \
    | grep -v "^\s*$" || status=1
python3 - "$out/gpu-diloco/metrics.jsonl" <<'PY' || status=1
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
for r in records:
    print(f"round {r['round']}: workers {r['workers']} loss {r['loss']:.4f} "
          f"per worker {r['worker_losses']} val {r.get('val_loss', float('nan')):.4f} "
          f"compute {r['compute_s']:.2f}s comm {r['communication_s']:.3f}s")
assert all(r["workers"] == 2 for r in records) and records[-1]["val_loss"] < records[0]["val_loss"]
print("DiLoCo cuda+cpu: OK, validation loss fell")
PY

step "3. IREE CUDA vs XLA on the GPU, f32 and bf16; kernels"
precisions=(--sizes gpt-b32 --precision f32 bf16)
python3 benchmarks/step_time.py --backend cuda "${precisions[@]}" --results "$out" || status=1
python3 benchmarks/step_time.py --backend cuda "${precisions[@]}" --vmfb-dir $work/vmfb \
    --compile-only || status=1
for precision in f32 bf16; do
    JAX_PLATFORMS=cpu ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        --print-units base --log-file "$work/kernels_$precision.csv" \
        python3 benchmarks/kernel_profile.py run --vmfb-dir $work/vmfb --precision "$precision" \
        >/dev/null || status=1
    python3 benchmarks/kernel_profile.py table "$work/kernels_$precision.csv" \
        --out "$out/kernels_$precision.md" | head -8 || status=1
done

if [ "${VULKAN:-0}" = 1 ]; then
    step "4. conformance suite: vulkan (NVIDIA driver)"
    JAX_PLATFORMS=cpu python3 -m pytest -q -rs -p no:cacheprovider \
        plugins/pcp-iree-vulkan/tests/test_conformance.py || status=1
fi
exit $status
