"""Keeping glibc malloc from handing freed memory back to the kernel in training processes.

With glibc's defaults every large buffer is mmap'd and unmapped again when freed, so
IREE's per-call transients (750 MB a call for a 10M-parameter GPT at block 256) are
page-faulted and zeroed afresh on every call: measured at about 45% of the IREE CPU
step time (benchmarks/step_time.py). One arena, no mmap and no trimming keep those pages.
glibc reads its tunables only when a process starts, so they go into the environment of
the processes PCP starts (workers); for `pcp train` itself, export them beforehand.
The price: freed memory stays with the process (2.0 → 2.9 GB at that size).
"""

import os

RETAIN_FREED_MEMORY = (
    "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
)


def retaining_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with RETAIN_FREED_MEMORY added to GLIBC_TUNABLES."""
    env = dict(os.environ if env is None else env)
    current = env.get("GLIBC_TUNABLES", "")
    if RETAIN_FREED_MEMORY not in current:
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [current, RETAIN_FREED_MEMORY]))
    return env
