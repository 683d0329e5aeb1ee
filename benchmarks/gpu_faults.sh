# Fault-tolerance checks with CUDA workers, run on a GPU machine from the repository root
# with the IREE compiler/runtime and the wheels carried in .gpu9/ (see
# benchmarks/results/gpu/h100/faults_cuda.md); writes logs and metrics to $OUT.
set -u
# Everything outside $OUT goes to one private folder (mktemp: unpredictable, mode 0700):
# the unpacked compiler, the wheels, the compile cache (PCP uses only a cache no one else
# can write to) and the workers' state.
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
mkdir -p $work/iree-x && tar xJf .gpu9/compiler.tar.xz -C $work/iree-x && tar xJf .gpu9/runtime.tar.xz -C $work/iree-x || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target $work/site .gpu9/whl/*.whl || exit 1
export PYTHONPATH=$work/iree-x:$work/site:$(python3 scripts/register_checkout.py $work/site) PYTHONUNBUFFERED=1 PCP_CACHE_DIR=$work/cache XDG_STATE_HOME=$work/state
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import jax, pluggy, typer, rich; print('jax', jax.__version__)" || exit 1
MODEL="--n-layer 4 --n-head 4 --n-embd 256 --block-size 128 --batch-size 32 --eval-every 0 --worker-timeout 5"
metrics() { python3 -c "import json,sys; rs=[json.loads(l) for l in open('$1/metrics.jsonl')]; print(len(rs), 'rounds; workers per round:', ''.join(str(r['workers']) for r in rs))"; }
wpids() { pgrep -f "pcp_core worker --connect .* --state-dir $1/worker-$2"; }
waitrounds() { for i in $(seq 600); do [ -f $1/metrics.jsonl ] && [ $(wc -l < $1/metrics.jsonl) -ge $2 ] && return 0; sleep 0.2; done; echo "timeout waiting for $2 rounds"; }

echo "=== A: two CUDA workers; one suspended 12 s, then the other killed"
R=$OUT/faults; python3 -m pcp_core train --algorithm diloco --worker-backends cuda,cuda --steps 2000 --inner-steps 50 $MODEL --out $R > $OUT/faults.log 2>&1 &
T=$!
waitrounds $R 4; S=$(wpids $R 0); echo "SIGSTOP $S at round $(wc -l < $R/metrics.jsonl)"; kill -STOP $S; sleep 12; kill -CONT $S
waitrounds $R 20; K=$(wpids $R 1); echo "SIGKILL $K at round $(wc -l < $R/metrics.jsonl)"; kill -9 $K
wait $T; echo "exit $?"; metrics $R
grep -h "inner state restored\|lost the shepherd" $R/worker-*.log | head -4
grep -E "worker lost|missed|crashed|joined" $OUT/faults.log | cut -c1-160 | head -12
rm -rf $R/worker-*/slot-* $R/*.safetensors

echo "=== B: kill -9 of pcp train, --resume, against an uninterrupted run"
python3 -m pcp_core train --algorithm diloco --worker-backends cuda,cuda --steps 1000 --inner-steps 50 $MODEL --out $OUT/ref > $OUT/ref.log 2>&1; echo "ref exit $?"
python3 -m pcp_core train --algorithm diloco --worker-backends cuda,cuda --steps 1000 --inner-steps 50 $MODEL --out $OUT/res > $OUT/res1.log 2>&1 &
T=$!; waitrounds $OUT/res 8; kill -9 $T; sleep 3; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; echo "killed at round $(wc -l < $OUT/res/metrics.jsonl)"
python3 -m pcp_core train --resume $OUT/res > $OUT/res2.log 2>&1; echo "resume exit $?"; metrics $OUT/res
python3 - <<PY
from safetensors.numpy import load_file
import numpy as np
a = load_file("$OUT/ref/checkpoint.safetensors"); b = load_file("$OUT/res/checkpoint.safetensors")
print("max abs difference", max(float(np.abs(a[k] - b[k]).max()) for k in a), "bitwise equal", all(np.array_equal(a[k], b[k]) for k in a))
PY
grep -h "inner state restored" $OUT/res/worker-*.log | head -3
mkdir -p $OUT/logs; for d in ref res; do cp $OUT/$d/metrics.jsonl $OUT/logs/$d-metrics.jsonl; done
rm -rf $OUT/ref $OUT/res
