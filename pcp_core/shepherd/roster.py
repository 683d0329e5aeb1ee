"""The workers a shepherd holds: taken in from admission (`pcp_core.shepherd.admission`)
between rounds, waited for, turned away (a name already connected, a quarantined
worker), disconnected (a revoked credential, a lost or quarantined worker), and stopped
at the end. The rounds run on them (`pcp_core.shepherd.session`).
"""

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import structlog

from pcp_core.shepherd.admission import Admission
from pcp_core.shepherd.links import WorkerLink
from pcp_core.shepherd.merging import Merger
from pcp_core.wire.messages import Stop
from pcp_core.wire.transport import TransportError

log = structlog.get_logger(__name__)

STOP_DRAIN_S = 5.0  # how long stopped workers have to close their ends
REVOCATION_POLL_S = 1.0  # how often the revocation list is looked at during a run


class NotEnoughWorkers(RuntimeError):
    """Too few workers joined in time, and no more are coming."""


@dataclass
class Limits:
    """How long to wait for whom, and how many results make a round."""

    min_workers: int = 1
    worker_timeout_s: float = 30.0
    round_timeout_s: float | None = None  # None: derived from earlier rounds
    join_timeout_s: float | None = 600.0


@dataclass
class Roster:
    admission: Admission
    limits: Limits = field(default_factory=Limits)
    merger: Merger = field(default_factory=Merger)  # scores and combines held results
    links: dict[int, WorkerLink] = field(default_factory=dict)
    still_coming: Callable[[], bool] = lambda: True  # may more workers still join?
    _stop_reason: str = "done"

    def start(self) -> None:
        self.admission.stop_late = self.stop_joined
        self.admission.start()
        threading.Thread(target=self._watch_revocations, name="pcp-revoked", daemon=True).start()

    def _watch_revocations(self) -> None:
        """Disconnect a worker as soon as its credential is revoked: the round in flight
        loses it (its result does not count), and admission refuses it from now on."""
        while not self.admission.closing.wait(REVOCATION_POLL_S):
            self._disconnect_revoked()

    def _disconnect_revoked(self) -> None:
        """Close the connections of workers whose credential is revoked (also checked as
        each round starts, so a revocation takes effect within one round however short)."""
        revoked = self.admission.keys.revoked_now()
        for link in list(self.links.values()):
            if (link.hello.worker_name, link.hello.credential) in revoked:
                log.warning("credential revoked; disconnecting the worker", worker=link.label)
                self.merger.revoked.add(link.hello.worker_name)
                link.conn.close()

    def admit_returning(self) -> None:
        """Take in workers that (re)joined since the last round."""
        while True:
            try:
                link = self.admission.joined.get_nowait()
            except queue.Empty:
                return
            self._take(link)

    def _take(self, link: WorkerLink) -> None:
        """Take a joined worker into the next rounds, unless a connected worker has its
        name: names are unique (a default one holds the host and pid, so a restarted
        worker has a new one), and a newcomer must not push a working worker out. A
        quarantined worker is told so and stopped."""
        quarantined = self.merger.accountability.is_quarantined(link.hello.worker_name)
        if quarantined:
            log.warning("refusing a quarantined worker", worker=link.label, reason=quarantined)
            self._turn_away(link, quarantined, "quarantined")
            return
        for old in self.links.values():
            if old.hello.worker_name == link.hello.worker_name:
                log.warning(
                    "a worker of that name is already connected; refusing the newcomer",
                    worker=link.label,
                )
                self._turn_away(link, f"a worker named {link.hello.worker_name} is connected")
                return
        self.merger.revoked.discard(link.hello.worker_name)  # proved a credential not revoked
        self.links[link.index] = link

    def _turn_away(self, link: WorkerLink, reason: str, state: str = "dead") -> None:
        with contextlib.suppress(TransportError, OSError):
            link.conn.send(Stop(reason))
        link.conn.close()
        self.admission.status.worker_state(link.index, state)
        self.admission.release_index(link.index)

    def wait_for_workers(self, count: int, timeout_s: float | None = None) -> None:
        """Block until `count` workers are connected (and have their program).

        Gives up after `timeout_s`, or as soon as `still_coming()` says no more will come
        (the one-command form's local workers have all exited). A worker that connected
        and is being served its program is coming: the wait goes on while it is (a first
        compile for its kind can take minutes).
        """
        self.admit_returning()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        while len(self.links) < count:
            remaining = 1.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:  # past the deadline (remaining 0): a second at a time
                self._take(self.admission.joined.get(timeout=min(remaining, 1.0) or 1.0))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    if not self.admission.joining():
                        raise NotEnoughWorkers(
                            f"only {len(self.links)} of {count} workers connected "
                            f"within {timeout_s:.0f} s"
                        ) from None
                    if not told:
                        log.info("join timeout passed; waiting for a worker being served")
                        told = True
                if not self.still_coming():
                    raise NotEnoughWorkers(
                        f"only {len(self.links)} of {count} workers connected and no more "
                        "are coming; see the worker logs in the run directory"
                    ) from None

    def _wait_for_quorum(self, round_index: int) -> None:
        self.admit_returning()
        if len(self.links) >= self.limits.min_workers:
            return
        log.warning(
            "waiting for workers",
            round=round_index,
            connected=len(self.links),
            min_workers=self.limits.min_workers,
            timeout_s=self.limits.join_timeout_s,
        )
        self.wait_for_workers(self.limits.min_workers, self.limits.join_timeout_s)
        log.info("enough workers again", round=round_index, connected=len(self.links))

    def _drop(self, link: WorkerLink) -> None:
        link.conn.close()
        if self.links.get(link.index) is link:
            self.admission.status.worker_state(link.index, "dead")
            del self.links[link.index]
            self.admission.release_index(link.index)

    def _stop_quarantined(self) -> None:
        """Disconnect the connected workers that are quarantined now."""
        for link in list(self.links.values()):
            reason = self.merger.accountability.is_quarantined(link.hello.worker_name)
            if reason:
                log.warning("disconnecting a quarantined worker", worker=link.label)
                self._turn_away(link, reason, "quarantined")
                del self.links[link.index]

    # -- the end --------------------------------------------------------------------------

    def close(self, reason: str = "done") -> None:
        """Tell every worker to stop, those that joined too late for a round included,
        then close all connections, the listener and the program builds in flight."""
        self._stop_reason = reason
        self.admission.closing.set()
        self._stop(list(self.links.values()))
        self.links.clear()
        self.stop_joined()
        self.admission.close()

    def stop_joined(self) -> None:
        """Stop the workers that joined but were not taken into a round yet."""
        joined = []
        with contextlib.suppress(queue.Empty):
            while True:
                joined.append(self.admission.joined.get_nowait())
        self._stop(joined)

    def _stop(self, links: list[WorkerLink]) -> None:
        """Send each a Stop, read what they still send (results computed ahead of their
        Assignment, `RunSettings.ahead`) until they close their end or STOP_DRAIN_S
        pass, then close: a socket closed with bytes unread resets the connection, and
        on a far link the reset can overtake the Stop."""
        for link in links:
            with contextlib.suppress(TransportError, OSError):
                link.conn.send(Stop(self._stop_reason))
        if not links:
            return
        with ThreadPoolExecutor(len(links), thread_name_prefix="pcp-stop") as pool:
            wait([pool.submit(_drain, link) for link in links], timeout=STOP_DRAIN_S)
            for link in links:
                link.conn.close()  # wakes a drain still reading


def _drain(link: WorkerLink) -> None:
    """Read and drop a stopped worker's messages until it closes the connection."""
    with contextlib.suppress(TransportError, OSError):
        while True:
            link.conn.receive()
