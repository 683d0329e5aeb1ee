"""PCP's lossy codecs (`pcp_core.codecs`): what a tensor becomes on the link.

| codec | bytes a value | error |
|---|---|---|
| `bf16` | 2 | half a bfloat16 step: 2^-8 of the value |
| `int8` | 1 + 4/256 | half a step of its block of 256: max / 254 |
| `fp4` | 1/2 + 4/64 | 4-bit floats (e2m1) scaled per block of 64: up to max / 6 |
| `topk` | 8 per kept value | the k largest magnitudes (1%), the rest fed back later |
"""

from pcp_core.hookspecs import hookimpl

PCP_PLUGIN_API = 5


@hookimpl
def pcp_register_codecs(register) -> None:
    from pcp_codecs.bf16 import BFLOAT16
    from pcp_codecs.blocks import FP4, INT8
    from pcp_codecs.topk import TOPK

    for codec in (BFLOAT16, INT8, FP4, TOPK):
        register(codec)
