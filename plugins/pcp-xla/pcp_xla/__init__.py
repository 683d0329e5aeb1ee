"""The `xla` backend: PCP's training program through XLA instead of IREE.

The shepherd exports the step with `jax.export` for the worker's platform and ships it
serialized; the worker deserializes it and runs it with its own jaxlib, the parameters
and optimizer state donated from call to call so they stay on the device. The
architecture of an `xla` worker is its jaxlib's platform: cpu, cuda, rocm or tpu.
"""

from pcp_core import hookimpl
from pcp_core.backends import Backend
from pcp_xla.runtime import XLA, detect_platform

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for

BACKEND = Backend(
    name="xla",
    runtime=XLA,
    default_arch="cpu",
    description="XLA through jax.export and the worker's jaxlib (cpu, cuda, rocm, tpu)",
    install_hint='pip install "pcp-xla[cuda]" (or [rocm], [tpu]) for a GPU or TPU jaxlib',
    detect_arch=detect_platform,
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(BACKEND)
