# sourced by each call's script, from the repository root on the GPU machine
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/unequal/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
FLAGS=(--model-size shakespeare-char --data .device/unequal/tinyshakespeare.txt
       --batch-size 16 --steps-per-call 2 --inner-steps 500 --steps ${STEPS:-10000} --lr 1e-3
       --inner-lr-scaling none --merge tokens --overlap delayed --eval-every 0 --seed 0)
