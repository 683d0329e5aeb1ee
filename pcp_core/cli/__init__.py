"""The `pcp` command line: one module per command family, and what they share."""
