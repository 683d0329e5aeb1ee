"""Admission: accept connections, authenticate workers, decide whom to serve.

Joins run on background threads, so a slow, malicious or broken peer never holds up the
others or the rounds. A peer proves it knows the secret (the shepherd's half of
`pcp_core.wire.handshake`); its credential must not be revoked, and this shepherd must
build for its backend, architecture, devices and runtime; it gets an index and its
Welcome, then is served its program, Setup and shards (`pcp_core.shepherd.provisioning`).
An admitted worker's link goes into `joined`; the shepherd takes it into the next round.
A worker that comes back after a restart asks for the index it had, so it keeps its data
shard and its saved inner state stays paired with it.

Until a peer has proved it knows the secret it gets little: its frames may be at most
`PRE_AUTH_FRAME_BYTES`, it must finish the join within `JOIN_DEADLINE_S`, and at most
`MAX_UNPROVEN` such peers are served at once, each on a thread (and its join-deadline
timer's) that holds one of as many slots: a new one closes the oldest and the accept
loop waits for that one's thread to let go of its slot, so a flood of idle or dripping
connections costs the shepherd a bounded amount of memory and threads, and a real worker
still gets in. After the Welcome every message is sealed (`pcp_core.wire.channel`).
"""

import collections
import contextlib
import json
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from pcp_core.backends import Backend, CompileError, devices_in_label, multi_device
from pcp_core.program.training import TrainingSetup
from pcp_core.registry import UnknownNameError
from pcp_core.shepherd.builds import Builds
from pcp_core.shepherd.links import WorkerLink
from pcp_core.shepherd.provisioning import Provisioning
from pcp_core.watch.run_status import RunStatus
from pcp_core.wire import auth, handshake
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Hello, Ready, Reject, RunSettings, Welcome
from pcp_core.wire.transport import Connection, Listener, TransportError

log = structlog.get_logger(__name__)

JOIN_DEADLINE_S = 10.0  # from accept to a checked proof
MAX_UNPROVEN = 64  # connections not yet past the proof, served at once
ARCH_PATTERN = re.compile(r"[A-Za-z0-9_.+-]{1,64}")  # what a worker may name as its arch


class Slot:
    """A slot of a semaphore that one thread holds, let go of once whoever calls first."""

    def __init__(self, semaphore: threading.Semaphore) -> None:
        self._semaphore, self._held = semaphore, True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._semaphore.release()


@dataclass
class Admission:
    setup: TrainingSetup
    listener: Listener
    keys: auth.Keys  # a shared secret, or per-worker credentials
    plugins: Any
    settings: RunSettings  # what every worker is told about the run
    heartbeat_s: float
    # "backend" or "backend:arch" entries this shepherd compiles for; empty: any installed
    serves: tuple[str, ...] = ()
    joined: "queue.Queue[WorkerLink]" = field(default_factory=queue.Queue)
    closing: threading.Event = field(default_factory=threading.Event)
    stop_late: Callable[[], None] = lambda: None  # stops links that joined while closing
    status: RunStatus = field(default_factory=lambda: RunStatus(log_progress=False))
    builds: Builds = field(default_factory=Builds)  # ended by `close`
    # the programs, Setups and shards the workers are served (made from the above)
    provisioning: Provisioning = field(init=False)
    _unproven: "collections.OrderedDict[int, Connection]" = field(
        default_factory=collections.OrderedDict
    )
    _unproven_lock: threading.Lock = field(default_factory=threading.Lock)
    # one per thread serving a connection not yet past its proof
    _unproven_slots: threading.Semaphore = field(
        default_factory=lambda: threading.Semaphore(MAX_UNPROVEN)
    )
    _index_lock: threading.Lock = field(default_factory=threading.Lock)
    _reserved: set[int] = field(default_factory=set)
    _welcomed: set[int] = field(default_factory=set)  # connections past the proof, not in joined

    def __post_init__(self) -> None:
        self.provisioning = Provisioning(self.setup, self.settings, self.builds)

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="pcp-accept", daemon=True).start()

    def close(self) -> None:
        """Admit no one more: close the listener and end the builds in flight."""
        self.closing.set()
        self.listener.close()
        self.builds.end()

    def _accept_loop(self) -> None:
        while not self.closing.is_set():
            try:
                conn = self.listener.accept(timeout_s=0.2)
            except TimeoutError:
                continue
            except OSError:
                if self.closing.is_set():
                    return
                log.warning("accept failed", exc_info=True)
                continue
            while not self._unproven_slots.acquire(timeout=0.05):
                self._close_oldest_unproven()  # its thread lets go of its slot
                if self.closing.is_set():
                    conn.close()
                    return
            with self._unproven_lock:
                self._unproven[id(conn)] = conn
            threading.Thread(target=self._admit, args=(conn,), daemon=True).start()

    def _close_oldest_unproven(self) -> None:
        with self._unproven_lock:
            if not self._unproven:
                return
            _, oldest = self._unproven.popitem(last=False)
        log.info("too many unproven connections, closing the oldest", peer=oldest.peer)
        oldest.close()

    def _proven(self, conn: Connection, slot: "Slot") -> None:
        """`conn` is past its proof (or done): no longer counted, its thread's slot free."""
        with self._unproven_lock:
            self._unproven.pop(id(conn), None)
        slot.release()

    def _admit(self, conn: Connection) -> None:
        deadline = threading.Timer(JOIN_DEADLINE_S, self._expire, args=(conn,))
        deadline.daemon = True
        deadline.start()
        slot = Slot(self._unproven_slots)  # acquired by the accept loop
        try:
            link = self._handshake(conn, deadline, slot)
            if link is not None:
                self.joined.put(link)
                if self.closing.is_set():  # joined while closing: close() may have missed it
                    self.stop_late()
        except (TransportError, OSError, TimeoutError) as error:
            log.warning("join failed", peer=conn.peer, error=str(error))
            conn.close()
        except Exception as error:  # e.g. no compiler here: refuse, so it does not retry
            log.error(
                "cannot serve worker", peer=conn.peer, error=f"{type(error).__name__}: {error}"
            )
            with contextlib.suppress(TransportError, OSError):
                self._refuse(conn, f"the shepherd cannot serve this worker: {error}")
        finally:
            deadline.cancel()
            self._proven(conn, slot)
            with self._index_lock:
                self._welcomed.discard(id(conn))

    def joining(self) -> bool:
        """Whether a worker that was let in is still being served its program (compiled,
        shipped, loaded): it will join, however long that takes."""
        with self._index_lock:
            return bool(self._welcomed)

    def _expire(self, conn: Connection) -> None:
        """The join deadline passed before the proof was checked."""
        with self._unproven_lock:
            expired = self._unproven.pop(id(conn), None) is not None
        if expired:
            log.info("no join within the deadline, closing", peer=conn.peer, s=JOIN_DEADLINE_S)
            conn.close()

    def _refuse(self, conn: Connection, reason: str) -> None:
        log.warning("refusing worker", peer=conn.peer, reason=reason)
        try:
            conn.send(Reject(reason))
        finally:
            conn.close()

    def _handshake(
        self, conn: Connection, deadline: threading.Timer, slot: "Slot"
    ) -> WorkerLink | None:
        try:
            proven = handshake.prove(conn, self.keys)
            deadline.cancel()
            self._proven(conn, slot)
            backend, devices = self._police(proven.hello)
        except handshake.Refusal as refusal:
            self._refuse(conn, str(refusal))
            return None
        hello = proven.hello
        index = self._reserve_index(hello.previous_index)
        with self._index_lock:
            self._welcomed.add(id(conn))
        welcome, sealed = proven.welcome(conn, index, self.heartbeat_s)
        live = LiveConnection(sealed)
        self.status.worker_joined(
            index,
            hello.worker_name,
            hello.backend,
            hello.arch,
            conn.peer,
            heard=lambda: live.last_heard,
            restarting=hello.previous_index >= 0,
        )
        return self._provision(conn, welcome, WorkerLink(index, live, hello), backend, devices)

    def _police(self, hello: Hello) -> tuple[Backend, int]:
        """The worker's backend and device count, once its credential, backend, precision,
        architecture, devices and runtime report pass; else a Refusal that says why."""
        if revoked := self.keys.refusal(hello.worker_name, hello.credential):
            raise handshake.Refusal(revoked)
        try:
            backend: Backend = self.plugins.backend(hello.backend)
            backend.check_precision(self.setup.config.precision)
            self._check_served(hello.backend, hello.arch)
            devices = self._check_devices(backend, hello.device)
            report = json.loads(hello.runtime)
            if not isinstance(report, dict):
                raise ValueError(f"its runtime report is not an object: {hello.runtime[:80]!r}")
        except (UnknownNameError, ValueError) as error:
            raise handshake.Refusal(
                f"the shepherd cannot compile for this worker: {error}"
            ) from None
        if refusal := backend.runtime.refusal(backend, hello.arch, report):
            raise handshake.Refusal(refusal)
        return backend, devices

    def _provision(
        self, conn: Connection, welcome: Welcome, link: WorkerLink, backend: Backend, devices: int
    ) -> WorkerLink | None:
        """Send the Welcome, then serve the worker its program, Setup and shards
        (`provisioning`): its link once it is Ready, None (its index free again) where it
        cannot load them."""
        index, live = link.index, link.conn
        try:
            conn.send(welcome)  # the last message in the clear: from here on all are sealed
            live.start_heartbeats(self.heartbeat_s)  # compiling may take minutes
            self.status.worker_state(index, "compiling")
            loaded = self.provisioning.serve(link, backend, devices)
            if not isinstance(loaded, Ready):
                reason = getattr(loaded, "reason", f"it sent {type(loaded).__name__}")
                log.warning(
                    "worker could not load its program or data", worker=link.label, reason=reason
                )
                self.status.worker_state(index, "dead")
                self.release_index(index)
                live.close()
                return None
        except CompileError as error:
            self.status.worker_state(index, "dead")
            self.release_index(index)
            if not self.closing.is_set():  # a compile stopped at exit is no refusal
                self._refuse(live, f"the shepherd cannot compile for this worker: {error}")
            live.close()
            return None
        except BaseException:
            self.status.worker_state(index, "dead")
            self.release_index(index)
            live.close()
            raise
        log.info("worker joined", worker=link.label, peer=conn.peer)
        self.status.worker_state(index, "ready")
        return link

    def _reserve_index(self, previous: int) -> int:
        """The index a returning worker had, if free and one of this run's (a worker's
        saved state may be from an older run with more workers); else the lowest free."""
        with self._index_lock:
            if (
                0 <= previous < self.setup.config.shepherd.workers
                and previous not in self._reserved
            ):
                index = previous
            else:
                index = next(i for i in range(len(self._reserved) + 1) if i not in self._reserved)
            self._reserved.add(index)
            return index

    def release_index(self, index: int) -> None:
        with self._index_lock:
            self._reserved.discard(index)

    def _check_served(self, backend: str, arch: str) -> None:
        """ValueError unless this shepherd compiles for `backend`/`arch` (see `serves`)."""
        if not ARCH_PATTERN.fullmatch(arch):
            raise ValueError(f"architecture {arch[:80]!r} is not a valid name")
        if self.serves and not {backend, f"{backend}:{arch}"} & set(self.serves):
            raise ValueError(
                f"this shepherd serves only {', '.join(self.serves)}, not {backend}:{arch}"
            )

    @staticmethod
    def _check_devices(backend: Backend, label: str) -> int:
        """How many devices the worker trains on (its Hello's device list); ValueError
        if that is several and its backend drives one device per worker."""
        devices = devices_in_label(label)
        if devices > 1 and not multi_device(backend):
            raise ValueError(
                f"a {backend.name} worker drives one device; start one worker per device "
                "(--device N) or use the xla backend for several devices in one worker"
            )
        return devices
