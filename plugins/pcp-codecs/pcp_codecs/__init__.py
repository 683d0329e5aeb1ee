"""PCP's lossy codecs (`pcp_core.codecs`): what a tensor becomes on the link.

| codec | bytes a value | error |
|---|---|---|
| `bf16` | 2 | half a bfloat16 step: 2^-8 of the value |
| `int8` | 1 + 4/256 | half a step of its block of 256: max / 254 |
| `fp4` | about 0.45 | half a gap of e2m1 in its block of 512: up to max / 6 (+9%) |
| `topk` | about 0.36 | the larger half as fp4, the rest fed back later: up to the value |
"""

from pcp_core.hookspecs import hookimpl

PCP_PLUGIN_API = 5


@hookimpl
def pcp_register_codecs(register) -> None:
    from pcp_codecs.bf16 import BFLOAT16
    from pcp_codecs.blocks import INT8
    from pcp_codecs.fp4 import FP4
    from pcp_codecs.topk import TOPK

    for codec in (BFLOAT16, INT8, FP4, TOPK):
        register(codec)
