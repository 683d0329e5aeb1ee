"""One job at a time on a thread beside the training loop (a checkpoint's write).

A job waits for the one before it, so at most one is in flight and they finish in
order; `wait` joins the last and raises what it raised. The thread stays for the next
job (starting one a job cost a worker's rounds a few milliseconds each, waiting for it
to start), and the interpreter joins it at exit: a run that stops still finishes the
write it started (`checkpoint.save` keeps the earlier checkpoints until the new one is
whole).
"""

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class OneInFlight:
    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: ThreadPoolExecutor | None = None
        self._job: Future[None] | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on the thread, once the job before it has finished."""
        self.wait()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, initializer=self._named)
        self._job = self._thread.submit(job)

    def _named(self) -> None:
        """The thread is called by the job's name, as in logs and profiles."""
        threading.current_thread().name = self.name

    def wait(self) -> None:
        """Wait for the job in flight, if any; raise what it raised."""
        job, self._job = self._job, None
        if job is not None:
            job.result()
