"""`python -m pcp_core` is the `pcp` command."""

from pcp_core.cli.app import main

main()
