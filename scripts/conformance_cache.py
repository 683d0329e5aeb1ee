"""Compile the backend conformance suite's reference program into a compile cache, for
a machine that has the GPU but no IREE compiler (the device tool's GPU box).

    PCP_CACHE_DIR=DIR python scripts/conformance_cache.py cuda:sm_80 cuda:sm_86 \
        vulkan:ampere vulkan:rdna3 vulkan:vp_android_baseline_2022

Give every architecture a suite compiles there: the one it detects on that machine
(sm_80 for Hopper and newer; a Vulkan vendor's target), the backend's
default and the suite's `compile_archs`. There, with the same jax, jaxlib and IREE
versions (the IREE runtime whole: detection runs its `iree-run-module`) and
`PCP_CACHE_DIR` pointing at a copy of DIR (mode 0700), `pytest
plugins/pcp-iree-cuda/tests/test_conformance.py` finds every module it needs in the
cache: the key covers the program's StableHLO, the flags and the IREE version, so a hit
is the very module the suite would have compiled there.
"""

import sys

from pcp_core import plugins
from pcp_core.testing.reference import reference


def main(targets: list[str]) -> None:
    if not targets or any(":" not in t for t in targets):
        sys.exit("usage: conformance_cache.py BACKEND:ARCH [BACKEND:ARCH ...]")
    program = reference()[2]
    for target in targets:
        name, _, arch = target.partition(":")
        backend = plugins.host().backend(name)
        compiled = backend.runtime.build(program, backend, arch)  # as the suite builds it
        print(f"{name} {arch}: {len(compiled.data)} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
