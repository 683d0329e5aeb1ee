#!/bin/bash
# Issue 32, session 20, call 8: a small jitted product ran under ncu (call 7), PCP's step did
# not. Does cuDNN's attention make the difference? PCP's step with attention in the
# portable form under ncu, and the bytes of what it shares with torch's step.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log ncu_unfused_log.txt
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum
timeout 200 ncu --clock-control none --profile-from-start off --csv --print-units base \
    --metrics $metrics python3 $(dirname $0)/xla_ncu.py --batch 16 --variant unfused-attention \
    > /tmp/pcp_unfused.csv 2>> $log
stage pcp_unfused $?
grep -v '^"' /tmp/pcp_unfused.csv | tail -5 >> $log
zcat $(dirname $0)/torch.csv.gz > /tmp/torch.csv
python3 benchmarks/ncu_bytes.py /tmp/pcp_unfused.csv /tmp/torch.csv --steps 1 --rows 40 --results $OUT >> $log 2>&1
stage summary $?
gzip -c /tmp/pcp_unfused.csv > $OUT/pcp_unfused.csv.gz
tar czf /tmp/ncu.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/ncu.tgz $OUT/
