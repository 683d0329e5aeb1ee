#!/bin/bash
# Issue 32, session 20, call 7: which set-up lets a jax process run under ncu (calls 4
# to 6 crashed). A small jitted product under ncu, profiling nothing and then everything,
# with jax's default allocator, the platform allocator, and no CUDA graphs; then PCP's
# step (xla_ncu.py) with the first set-up that ran.
set -u
source scripts/device_env.sh
call_log ncu_jax_log.txt
ncu --version >> $log 2>&1
small='import jax, jax.numpy as jnp; x = jnp.ones((1024, 1024)); print("sum", float(jax.jit(lambda a: (a @ a).sum())(x)))'
try() {  # $1: a name; the rest: environment settings for the run
    local name=$1; shift
    env "$@" timeout 45 ncu --clock-control none --profile-from-start "$profile" --csv \
        --metrics gpu__time_duration.sum python3 -c "$small" > /tmp/$name.csv 2>&1
    local rc=$?
    echo "== $name (profile from start: $profile): rc=$rc, $(grep -c '^"' /tmp/$name.csv) rows" >> $log
    tail -3 /tmp/$name.csv >> $log
    return $rc
}
chosen=""
for profile in off on; do
    try default_$profile XLA_PYTHON_CLIENT_PREALLOCATE=false && chosen=${chosen:-"XLA_PYTHON_CLIENT_PREALLOCATE=false"}
    try platform_$profile XLA_PYTHON_CLIENT_ALLOCATOR=platform && chosen=${chosen:-"XLA_PYTHON_CLIENT_ALLOCATOR=platform"}
    try graphless_$profile XLA_PYTHON_CLIENT_PREALLOCATE=false "XLA_FLAGS=--xla_gpu_enable_command_buffer=" \
        && chosen=${chosen:-"XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_enable_command_buffer="}
done
echo "== chosen: ${chosen:-none}" >> $log
if [ -n "$chosen" ]; then
    metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum
    env $chosen timeout 200 ncu --clock-control none --profile-from-start off --csv --print-units base \
        --metrics $metrics python3 $(dirname $0)/xla_ncu.py --batch 16 > /tmp/pcp.csv 2>> $log
    stage pcp $?
    grep -v '^"' /tmp/pcp.csv | tail -5 >> $log
    zcat $(dirname $0)/torch.csv.gz > /tmp/torch.csv
    python3 benchmarks/ncu_bytes.py /tmp/pcp.csv /tmp/torch.csv --steps 1 --rows 40 --results $OUT >> $log 2>&1
    stage summary $?
    gzip -c /tmp/pcp.csv > $OUT/pcp.csv.gz
fi
tar czf /tmp/ncu.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/ncu.tgz $OUT/
