#!/bin/bash
# Issue 32, session 19, call 5: is PCP's 2% behind torch.compile at batch 32 the GPU's
# clock? torch.compile alone, then PCP's xla alone, batch 32, 10 steps a call, 10 calls,
# each with nvidia-smi sampling the SM clock, power and throttle reasons every 50 ms.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log clocks_log.txt
query=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$query --format=csv > /dev/null 2>&1 || query=${query%,*}  # a driver without that field
for way in "--torch compiled --xla" "--torch --xla pcp"; do
    name=$(echo $way | tr -d ' -')
    nvidia-smi --query-gpu=$query --format=csv,noheader,nounits -lms 50 > $OUT/smi_$name.csv &
    smi=$!
    timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
        --batch 32 --steps-per-call 10 --calls 10 $way --peak-tflops 989 \
        --results $OUT --stem b32_$name >> $log 2>&1
    stage $name $?
    kill $smi
done
rm -f $OUT/*.md
tar czf /tmp/clocks.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/clocks.tgz $OUT/
