"""A run's lifecycle under the CLI: its directory, sinks, status, and the `local` algorithm.

`pcp_core.run.train(config)` runs training in this process, as `pcp train` does.
"""

from pcp_core.run.lifecycle import train

__all__ = ["train"]
