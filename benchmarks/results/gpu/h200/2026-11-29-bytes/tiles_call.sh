#!/bin/bash
# Issue 32, session 21, call 2. (a) The compile cache on a GPU (call 1's try evaluated on
# the CPU backend, whose IREE runtime this machine lacks): `pcp train` with one DiLoCo
# `xla` worker, the shepherd on `xla` too, twice over one fresh PCP_CACHE_DIR. (b) The
# products' kernels as cuBLAS's heuristic picks them (`untuned`, `cublas-untuned`), in
# turns with torch.compile and PCP as shipped at batch 16 with the clock and power; then
# their bytes under ncu, each step compiled outside ncu first (as in call 1).
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
power=benchmarks/results/gpu/h200/2026-11-29-power
call_log tiles_log.txt
for run in 1 2; do
  PCP_CACHE_DIR=/tmp/cache_train timeout 150 python3 -m pcp_core train --algorithm diloco \
      --backend xla --worker-backends xla --model-size gpt2-small --precision bf16 \
      --steps 20 --inner-steps 10 --batch-size 16 --no-dashboard --out /tmp/run$run \
      > /tmp/train$run.txt 2>&1
  stage "train $run" $?
  tail -3 /tmp/train$run.txt >> $log
  grep -h "program ready" /tmp/run$run/worker-0.log >> $log
done
export PCP_CACHE_DIR=/tmp/cache_anchor
timeout 300 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 --steps-per-call 10 --calls 15 --interleave --torch compiled \
    --xla pcp untuned cublas-untuned --peak-tflops 989 --power --results $OUT \
    --stem tiles_k10 >> $log 2>&1
stage turns $?
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum
for v in untuned cublas-untuned; do
  export PCP_CACHE_DIR=/tmp/cache_ncu_$v
  timeout 90 python3 $power/xla_ncu.py --batch 16 --variant $v >> $log 2>&1
  stage "$v compiled outside ncu" $?
  timeout 150 ncu --clock-control none --profile-from-start off --csv --print-units base \
      --metrics $metrics python3 $power/xla_ncu.py --batch 16 --variant $v > /tmp/$v.csv 2>> $log
  stage "$v under ncu" $?
  gzip -c /tmp/$v.csv > $OUT/$v.csv.gz
done
zcat $power/torch.csv.gz > /tmp/torch.csv
zcat benchmarks/results/gpu/h200/2026-11-29-bytes/pcp.csv.gz > /tmp/pcp.csv
python3 benchmarks/ncu_bytes.py /tmp/pcp.csv /tmp/untuned.csv /tmp/cublas-untuned.csv \
    /tmp/torch.csv --steps 1 --rows 30 --results $OUT >> $log 2>&1
stage summary $?
tar czf /tmp/tiles.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/tiles.tgz $OUT/
