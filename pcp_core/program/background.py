"""One job at a time on a thread beside the training loop (a checkpoint's write).

A job waits for the one before it, so at most one is in flight and they finish in
order; `wait` joins the last and raises what it raised. The thread is not a daemon: a
run that stops still finishes the write it started (`checkpoint.save` keeps the earlier
checkpoints until the new one is whole).
"""

import threading
from collections.abc import Callable


class OneInFlight:
    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on a thread, once the job before it has finished."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(job,), name=self.name)
        self._thread.start()

    def _run(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as error:  # raised again by wait(), in the caller's thread
            self._error = error

    def wait(self) -> None:
        """Join the job in flight, if any; raise what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
