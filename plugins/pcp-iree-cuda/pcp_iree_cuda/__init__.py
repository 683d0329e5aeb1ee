"""NVIDIA GPUs: IREE's `cuda` target (PTX for an `sm_XY` architecture), `cuda` driver.

IREE 3.13 cannot target sm_90 or newer ("missing GPU target"), but sm_80 PTX is
JIT-compiled by the driver and runs on Hopper and later, so those map to sm_80.

Compile flags (docs/iree-cuda.md measures each, and the ones left out):
- `--iree-codegen-transform-dialect-library=kernel_configs.mlir`: shared-memory SIMT
  configs for float32 matrix products, which IREE otherwise runs at a small fraction of
  the GPU's rate; tiles for the bf16 ones, which IREE gives one 64x64 tile whatever
  their shape; and eight warps a workgroup for elementwise passes, which IREE gives one
  (the file says what each buys). `--iree-codegen-tuning-spec-path` would be the
  documented flag, but IREE 3.13 ignores it for CUDA: the spec is never read.
- No `--iree-dispatch-creation-split-matmul-reduction`: it splits every product, the
  short forward ones too, into partial sums that cost more than they save once the
  products are tuned.

`unroll_steps=True`: the K steps of a call compiled straight-line, not as a loop
(pcp_core/program/build.py): one command buffer a call, recorded once and replayed, without
the loop's per-step copies of every parameter and moment; compiling takes several times
longer.

Runtime flag `--cuda_async_allocations=false`: IREE's own caching allocator for the
step's transient buffers instead of CUDA's stream-ordered pools, which cost a bf16 step
more than a tenth of its time before the call was unrolled. With the call unrolled the
GPU rather than the host sets the pace, and no other choice (async allocations, CUDA
graphs, inline execution) is clearly faster.
"""

import os
from importlib import resources

from pcp_core import hookimpl
from pcp_core.backends import Backend, iree_device_dump, run_quietly
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for

NEWEST_SUPPORTED = (8, 9)  # the newest compute capability IREE 3.13 emits code for
FALLBACK = "sm_80"


def arch_for(capability: str) -> str | None:
    """The IREE target for a compute capability such as "8.6" or "9.0"."""
    try:
        major, minor = (int(part) for part in capability.strip().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) > NEWEST_SUPPORTED:
        return FALLBACK
    return f"sm_{major}{minor}"


def detect_arch(device: int = 0) -> str | None:
    """The target of CUDA device index `device`, as IREE (and CUDA) number them."""
    devices = iree_device_dump("cuda")
    if device < len(devices) and "gpu-compute-capability" in devices[device]:
        return arch_for(devices[device]["gpu-compute-capability"])
    query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    capabilities = run_quietly(query).split()
    if device >= len(capabilities):
        return None
    # nvidia-smi numbers GPUs by PCI bus, CUDA fastest first unless told otherwise: its
    # answer for `device` is that device's only if all are alike or the orders agree
    same_order = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    if len(set(capabilities)) == 1 or (same_order and "CUDA_VISIBLE_DEVICES" not in os.environ):
        return arch_for(capabilities[device])
    return None


KERNEL_CONFIGS = resources.files(__name__) / "kernel_configs.mlir"

CUDA = Backend(
    name="cuda",
    runtime=IreeRuntime(
        target="cuda",
        driver="cuda",
        arch_flag="--iree-cuda-target={arch}",
        extra_flags=(f"--iree-codegen-transform-dialect-library={KERNEL_CONFIGS}",),
        runtime_flags=("--cuda_async_allocations=false",),
        unroll_steps=True,
    ),
    default_arch=FALLBACK,
    description="NVIDIA GPUs through IREE cuda",
    detect_arch=detect_arch,
    install_hint="install the NVIDIA driver (libcuda.so) and check `nvidia-smi` sees a GPU",
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(CUDA)
