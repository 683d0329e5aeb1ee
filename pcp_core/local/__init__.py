"""The `local` algorithm: one process trains on one device (`training.run_local`),
registered by `pcp_core.builtin` as plugins register theirs."""
