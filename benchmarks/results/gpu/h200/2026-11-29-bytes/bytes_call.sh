#!/bin/bash
# Issue 32, session 21, call 1. (a) The compile cache on a GPU: the same `pcp train` with one
# DiLoCo `xla` worker twice over one fresh PCP_CACHE_DIR, each worker's "program ready"
# seconds. (b) PCP's bytes under Nsight Compute, whose process crashed in XLA's compile
# of the step last session: the step is compiled once outside ncu into the persistent
# cache (pcp_xla.runtime.keep_compiled_steps), and the run under ncu loads it.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
here=benchmarks/results/gpu/h200/2026-11-29-bytes
power=benchmarks/results/gpu/h200/2026-11-29-power
call_log bytes_log.txt
for run in 1 2; do
  PCP_CACHE_DIR=/tmp/cache_train timeout 150 python3 -m pcp_core train --algorithm diloco \
      --worker-backends xla --model-size gpt2-small --precision bf16 --steps 20 \
      --inner-steps 10 --batch-size 16 --no-dashboard --out /tmp/run$run >> $log 2>&1
  stage "train $run" $?
  grep -h "program ready" /tmp/run$run/worker-0.log >> $log
done
export PCP_CACHE_DIR=/tmp/cache_ncu
timeout 120 python3 $power/xla_ncu.py --batch 16 >> $log 2>&1
stage "compile outside ncu" $?
ls -la /tmp/cache_ncu/xla >> $log 2>&1
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum
timeout 240 ncu --clock-control none --profile-from-start off --csv --print-units base \
    --metrics $metrics python3 $power/xla_ncu.py --batch 16 > /tmp/pcp.csv 2>> $log
stage "pcp under ncu" $?
grep -v '^"' /tmp/pcp.csv | tail -20 >> $log
zcat $power/torch.csv.gz > /tmp/torch.csv
python3 benchmarks/ncu_bytes.py /tmp/pcp.csv /tmp/torch.csv --steps 1 --rows 60 \
    --results $OUT >> $log 2>&1
stage summary $?
gzip -c /tmp/pcp.csv > $OUT/pcp.csv.gz
tar czf /tmp/bytes.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/bytes.tgz $OUT/
