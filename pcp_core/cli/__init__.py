"""The `pcp` command line: one module per command family, and what they share.

Set here, before anything imports numpy: OpenBLAS runs one thread, unless the
environment says otherwise. Its threads spin after each call waiting for the next, and
a shepherd's or worker's few dot products a round (the pseudo-gradients' norms) then
kept every core busy: on 2 cores a DiLoCo run of a small model took 1.8x the time and
2.2x the CPU (`OPENBLAS_NUM_THREADS` unset against 1, 100 rounds of two workers). The
training itself runs on IREE's and XLA's own threads, which this leaves alone.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
