# Sourced by device-call scripts (kept in the ignored .device/), from the repository root on
# the GPU machine (jax and torch there, no PCP): PCP's pure-Python dependencies from the
# carried wheels (`.device/anchor`), this checkout's packages and benchmarks/ on the path.
# The wheels, fetched here once per checkout (.device/ is ignored):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       -d .device/anchor/wheels structlog platformdirs tomli-w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site:$PWD/benchmarks

# The GPU, its driver and jax's and torch's versions, appended to the log $1.
machine_banner() {
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"
  } >> "$1" 2>&1
}

# Start the call's log, $OUT/$1 ($log), with the machine's banner; `stage NAME RC` then notes
# in it where a stage ended and how, in seconds since the start.
call_log() {
  start=$SECONDS
  log=$OUT/$1
  machine_banner $log
}
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
