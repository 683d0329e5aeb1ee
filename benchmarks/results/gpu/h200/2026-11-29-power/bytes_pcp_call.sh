#!/bin/bash
# Issue 32, session 20, call 6 (it crashed the same way): call 4 again for PCP, whose
# process (torch and XLA in one) crashed under ncu while XLA compiled (segmentation
# fault). Here PCP's step runs in a process without torch (xla_ncu.py beside this
# script), its range opened through the driver. Call 5, an earlier version of this
# script, autotuned into a cache without ncu first and captured no CUDA graphs
# (bytes_pcp_autotune_log.txt).
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log bytes_pcp_log.txt
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum
timeout 300 ncu --clock-control none --profile-from-start off --csv --print-units base \
    --metrics $metrics python3 $(dirname $0)/xla_ncu.py --batch 16 > /tmp/pcp.csv 2>> $log
stage pcp $?
grep -v '^"' /tmp/pcp.csv >> $log
zcat $(dirname $0)/torch.csv.gz > /tmp/torch.csv
python3 benchmarks/ncu_bytes.py /tmp/pcp.csv /tmp/torch.csv --steps 1 --rows 40 --results $OUT >> $log 2>&1
stage summary $?
gzip -c /tmp/pcp.csv > $OUT/pcp.csv.gz
tar czf /tmp/bytes.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/bytes.tgz $OUT/
