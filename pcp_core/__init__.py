"""PCP core: plugin system, training program, runtimes and CLI.

Kept free of heavy imports: `import pcp_core` must stay instant so that
`pcp --help` and plugin discovery never pay for jax or iree.
"""

from pcp_core.hookspecs import hookimpl

__version__ = "0.1.0"

# The plugin API a plugin module declares as `PCP_PLUGIN_API = 5` (see docs/plugins.md).
# Raised when a hook, or a registered object's fields, change incompatibly; a plugin
# written for another version is listed by `pcp plugins` with the reason, not loaded.
PLUGIN_API = 5

__all__ = ["PLUGIN_API", "__version__", "hookimpl"]
