#!/bin/bash
# Issue 32, session 22, call 1: the CUDA and Vulkan conformance suites on this GPU. The
# machine has no IREE compiler, and its jax (0.11.2) exports other StableHLO than the
# pinned 0.10.2, so the suites run on the pinned jax and jaxlib (CPU) with modules
# compiled here into a compile cache:
#   PCP_CACHE_DIR=.device/conf/cache python scripts/conformance_cache.py cuda:sm_80 vulkan:ampere
# .device/conf/site.tar.xz: jax and jaxlib 0.10.2 (cp312, shared objects stripped),
# iree-base-runtime 3.13.0 (without its Tracy build and tools), structlog, platformdirs,
# tomli-w, unpacked; .device/conf/vk.tar.gz: libvulkan1 and libglvnd from Debian's
# packages (the image has neither). Carried: .device/conf and, of .device/anchor/wheels,
# all but pycapnp (64 MiB in all).
set -u
source scripts/device_env.sh
call_log checks_log.txt
mkdir -p /tmp/conf /tmp/vk
tar -C /tmp/conf -xJf .device/conf/site.tar.xz && tar -C /tmp/vk -xzf .device/conf/vk.tar.gz
stage unpack $?
cp -r .device/conf/cache /tmp/conf_cache && chmod -R go-rwx /tmp/conf_cache
icd=$(ls /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json \
      /etc/vulkan/icd.d/nvidia_icd.json 2>/dev/null | head -1)
echo "vulkan ICD: ${icd:-none}" >> $log
(
  export PYTHONPATH=/tmp/conf:$PYTHONPATH JAX_PLATFORMS=cpu PCP_CACHE_DIR=/tmp/conf_cache
  export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ -n "$icd" ] && export VK_DRIVER_FILES=$icd
  python3 -c "import jax, iree.runtime; print('conformance on jax', jax.__version__)"
  timeout 300 python3 -m pytest -v -rs -p no:cacheprovider \
      plugins/pcp-iree-cuda/tests/test_conformance.py plugins/pcp-iree-cuda/tests/test_detect.py \
      plugins/pcp-iree-vulkan/tests/test_conformance.py plugins/pcp-iree-vulkan/tests/test_detect.py
) > $OUT/conformance.log 2>&1
stage conformance $?
tail -3 $OUT/conformance.log >> $log
ls /tmp/conf_cache | wc -l >> $log  # a module compiled there would add files: none can be
