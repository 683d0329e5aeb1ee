"""PCP core: plugin system, training program, runtimes and CLI.

Kept free of heavy imports: `import pcp_core` must stay instant so that
`pcp --help` and plugin discovery never pay for jax or iree.
"""

from pcp_core.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl"]
