# sourced by each call's script, from the repository root on the GPU machine.
# 2026-11-28 (issue 31, session 9): the GPU worker beside an IREE cpu worker with one step
# a call (--steps-per-call 1), so the CPU worker's calls are half as long as with 2.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/pair3/wheels/*.whl || exit 1
D=$PWD/.device/pair3
# a compilation cache brought back from an earlier call skips the cold XLA compile
mkdir -p /tmp/jaxcache; [ -f $D/jaxcache.tgz ] && tar xzf $D/jaxcache.tgz -C /tmp/jaxcache
# the code: src/ (git archive of a commit) where it is there, else the checkout
if [ -d $D/src ]; then cd $D/src || exit 1; fi
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
FLAGS=(--model-size shakespeare-char --data $D/stdlib
       --batch-size 16 --steps-per-call ${K:-1} --inner-steps 500 --steps ${STEPS:-10000} --lr 1e-3
       --inner-lr-scaling none --merge tokens --overlap delayed --eval-every 1000 --seed ${SEED:-0})
