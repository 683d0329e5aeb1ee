"""What the transform library (kernel_configs.mlir) gives the kernels of a small program.

An elementwise pass gets eight warps a workgroup instead of IREE's one; a product keeps
its own config, bias epilogue and all; and integer arithmetic on constants, which IREE
compiles for the host with the same library, still compiles.
"""

import re

import numpy as np
import pcp_iree_cuda


def configured_dispatches() -> dict[str, tuple[str, int, str]]:
    """Each dispatch's pipeline, workgroup size and lowering config, as IREE sets them."""
    import jax
    import jax.numpy as jnp

    from pcp_core.iree.compile_process import compile_stablehlo
    from pcp_core.program.build import without_locations

    def program(v, x, w, b):
        constant = jnp.arange(4096, dtype=jnp.int32) % 7  # evaluated at compile time
        return v.astype(jnp.bfloat16), v.astype(jnp.int32) + constant, x @ w + b

    shapes = ((4096,), (256, 128), (128, 128), (128,))
    args = [np.zeros(shape, np.float32) for shape in shapes]
    mlir = without_locations(jax.export.export(jax.jit(program))(*args).mlir_module())
    flags = ["--iree-cuda-target=sm_80", *pcp_iree_cuda.CUDA.runtime.extra_flags]
    configured = compile_stablehlo(
        mlir, "cuda", [*flags, "--compile-to=executable-configurations"]
    ).decode()
    found = re.finditer(
        r"func\.func @(\w+)\(\) attributes \{translation_info = #iree_codegen.translation_info"
        r"<pipeline = #iree_gpu.pipeline<(\w+)> workgroup_size = \[(\d+).*?lowering_config = "
        r"(#iree_gpu.lowering_config<\{[^}]*\}>)",
        configured,
        re.DOTALL,
    )
    return {m[1]: (m[2], int(m[3]), m[4]) for m in found}


def test_elementwise_passes_get_eight_warps_and_products_keep_theirs() -> None:
    dispatches = configured_dispatches()
    (cast,) = [config for name, config in dispatches.items() if "elementwise_4096_f32xbf16" in name]
    assert cast[:2] == ("TileAndFuse", 256), dispatches
    (product,) = [config for name, config in dispatches.items() if "matmul" in name]
    assert product[1] == 128 and "thread = [8, 8, 0]" in product[2], dispatches
