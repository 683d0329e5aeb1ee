#!/bin/bash
# Issue 32, session 22, call 3: why IREE cuda's step is no faster with the attention in
# query blocks (call 2): one step (K=1) of each form under Nsight Compute, kernel by
# kernel (benchmarks/kernel_profile.py), and the three forms plus 512 queries a block
# timed again side by side. Then why NVIDIA's Vulkan driver does not load (call 1): the
# Vulkan loader's own account. Carried: .device/anchor, .device/iree, .device/attn.
set -u
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/iree/*.whl
export XLA_PYTHON_CLIENT_PREALLOCATE=false PCP_CACHE_DIR=$(mktemp -d)
call_log profile_log.txt
for block in 1024 256; do
  JAX_PLATFORMS=cpu timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      --print-units base --log-file /tmp/kernels_$block.csv python3 benchmarks/kernel_profile.py \
      run --vmfb-dir .device/attn/block$block --size gpt2-small --precision bf16 > /dev/null 2>&1
  stage "ncu block $block" $?
  python3 benchmarks/kernel_profile.py table /tmp/kernels_$block.csv --top 40 \
      --out $OUT/kernels_block$block.md | head -3 >> $log
  gzip -c /tmp/kernels_$block.csv > $OUT/kernels_block$block.csv.gz
done
timeout 240 python3 benchmarks/attention_blocks.py --backend cuda --size gpt2-small \
    --precision bf16 --blocks 256 1024 512 --vmfb-dir .device/attn --results $OUT >> $log 2>&1
stage blocks $?
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
cat $icd >> $log
lib=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ICD']['library_path'])" $icd)
echo "ICD library: $lib" >> $log
ldd $(ldconfig -p | grep -m1 "$lib" | awk '{print $NF}') >> $log 2>&1 || ls -la /usr/local/nvidia/lib64 | head -40 >> $log
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> $log
mkdir -p /tmp/vk && tar -C /tmp/vk -xzf .device/conf/vk.tar.gz 2>/dev/null
LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} VK_DRIVER_FILES=$icd \
    VK_LOADER_DEBUG=error,warn,driver timeout 60 python3 -m iree._runtime.scripts.iree_run_module \
    --dump_devices=vulkan >> $log 2>&1
stage "vulkan devices" $?
