#!/bin/bash
# Issue 32, session 20, call 9: PCP's step process under ncu, stage by stage (ncu_stages.py),
# to find what crashes it (calls 4-6 and 8), profiling nothing.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log ncu_stages_log.txt
for stage in 1 2 3 4; do
    timeout 50 ncu --profile-from-start off python3 $(dirname $0)/ncu_stages.py $stage >> $log 2>&1
    rc=$?
    stage "stage $stage under ncu" $rc
    [ $rc -eq 0 ] || break
done
tar czf /tmp/ncu.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/ncu.tgz $OUT/
