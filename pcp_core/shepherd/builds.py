"""The program builds running on admission threads, ended before the shepherd exits.

A shepherd builds each kind of worker's program on the thread that admits the first
worker of that kind: an IREE compile in a child process, or jax's export (xla) in this
one. Neither may still run when the process ends, Ctrl-C included: an IREE compiler
would go on as an orphan, and jax aborts the whole process (SIGABRT, "terminate called
after throwing") when the interpreter exits while another thread is inside it, so
`pcp train` died of that signal instead of exiting 130. `Builds.end` kills the
compilers and gives the rest up to `END_GRACE_S` to finish.
"""

import contextlib
import threading
import time
from collections.abc import Iterator

import structlog

log = structlog.get_logger(__name__)

END_GRACE_S = 30.0  # how long an exit waits for builds in flight (a compiler is killed)


class Builds:
    def __init__(self) -> None:
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The calling thread builds (or ships) a program for the length of the block."""
        thread = threading.current_thread()
        with self._lock:
            self._threads.add(thread)
        try:
            yield
        finally:
            with self._lock:
                self._threads.discard(thread)

    def end(self, grace_s: float = END_GRACE_S) -> None:
        """Kill the compilers of the builds in flight and wait up to `grace_s` for them
        all to end."""
        with self._lock:
            threads = list(self._threads)
        if not threads:
            return
        from pcp_core.iree.compile_process import stop_compilers

        stop_compilers({thread.ident for thread in threads if thread.ident is not None})
        log.info("waiting for program builds in flight to end", builds=len(threads))
        deadline = time.monotonic() + grace_s
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        if still := sum(thread.is_alive() for thread in threads):
            log.warning("program builds still running at exit", builds=still, waited_s=grace_s)
