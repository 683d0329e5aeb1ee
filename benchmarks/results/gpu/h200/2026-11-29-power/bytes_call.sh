#!/bin/bash
# Issue 32, session 20, call 4: where each step's DRAM bytes, L2 bytes and instructions
# go, by Nsight Compute, torch.compile's and PCP's, GPT-2 small bf16 at batch 16, one step
# (torch_anchor.py --ncu brackets one call of each way; ncu_bytes.py sums the CSVs).
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log bytes_log.txt
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum
profiled() {  # $1: the CSV's name; then torch_anchor's ways
    local name=$1; shift
    timeout 270 ncu --clock-control none --profile-from-start off --csv --print-units base \
        --metrics $metrics python3 benchmarks/torch_anchor.py --size gpt2-small \
        --precision bf16 --batch 16 --steps-per-call 1 --calls 1 "$@" --ncu \
        --results /tmp/anchor --stem $name > /tmp/$name.csv 2>> $log
    stage $name $?
    grep -v '^"' /tmp/$name.csv >> $log
}
profiled pcp --torch --xla pcp
profiled torch --torch compiled --xla
python3 benchmarks/ncu_bytes.py /tmp/pcp.csv /tmp/torch.csv --steps 1 --results $OUT >> $log 2>&1
stage summary $?
gzip -c /tmp/pcp.csv > $OUT/pcp.csv.gz; gzip -c /tmp/torch.csv > $OUT/torch.csv.gz
tar czf /tmp/bytes.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/bytes.tgz $OUT/
