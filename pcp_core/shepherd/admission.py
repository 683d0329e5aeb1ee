"""Admission: accept connections, authenticate workers, ship each its program.

Joins run on background threads, so a slow, malicious or broken peer never holds up the
others or the rounds. An admitted worker's link goes into `joined`; the shepherd takes it
into the next round. A worker that comes back after a restart asks for the index it had,
so it keeps its data shard and its saved inner state stays paired with it.

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
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import structlog

from pcp_core.backends import (
    Artifact,
    Backend,
    CompileError,
    MultiDeviceRuntime,
    devices_in_label,
    multi_device,
)
from pcp_core.data.text import CharCorpus
from pcp_core.program.training import TrainingSetup
from pcp_core.registry import UnknownNameError
from pcp_core.shepherd.builds import Builds
from pcp_core.watch.run_status import RunStatus
from pcp_core.wire import auth
from pcp_core.wire.channel import SealedConnection, session_keys
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import (
    Challenge,
    Hello,
    Proof,
    Ready,
    Reject,
    RunSettings,
    Setup,
    ShardRequest,
    Tensor,
    Welcome,
    WorkerSettings,
)
from pcp_core.wire.shard_transfer import (
    assign_shards,
    serve_shard,
    training_shards,
    worker_manifest,
)
from pcp_core.wire.transport import Connection, Listener, TransportError

log = structlog.get_logger(__name__)

PRE_AUTH_FRAME_BYTES = 64 * 2**10  # a Hello or a Proof is a few hundred bytes
JOIN_DEADLINE_S = 10.0  # from accept to a checked proof
MAX_UNPROVEN = 64  # connections not yet past the proof, served at once
ARCH_PATTERN = re.compile(r"[A-Za-z0-9_.+-]{1,64}")  # what a worker may name as its arch


@dataclass
class WorkerLink:
    index: int
    conn: LiveConnection
    hello: Hello

    @property
    def label(self) -> str:
        hello = self.hello
        several = f" on devices {hello.device}" if "," in hello.device else ""
        return f"worker {self.index} ({hello.worker_name}, {hello.backend}/{hello.arch}{several})"


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
    setup_bytes: int = 0
    shard_bytes: int = 0  # the shards served to workers that did not have them
    shards_fetched: dict[int, list[str]] = field(default_factory=dict)  # by worker index
    stop_late: Callable[[], None] = lambda: None  # stops links that joined while closing
    status: RunStatus = field(default_factory=lambda: RunStatus(log_progress=False))
    builds: Builds = field(default_factory=Builds)  # ended by `close`
    _programs: dict[tuple[str, str, int], "Future[Artifact]"] = field(default_factory=dict)
    _compile_lock: threading.Lock = field(default_factory=threading.Lock)
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
    _shared: list[Tensor] | None = None
    _text_tokens: Tensor | None = None
    _shared_lock: threading.Lock = field(default_factory=threading.Lock)

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
        hello = conn.receive(max_frame_bytes=PRE_AUTH_FRAME_BYTES)
        if not isinstance(hello, Hello):
            self._refuse(conn, f"expected Hello, got {type(hello).__name__}")
            return None
        try:
            secret = self.keys.secret_for(hello.worker_name, hello.credential)
        except auth.AuthError as error:
            self._refuse(conn, f"authentication failed: {error}")
            return None
        challenge = auth.nonce()
        conn.send(Challenge(challenge))
        proof = conn.receive(max_frame_bytes=PRE_AUTH_FRAME_BYTES)
        if not isinstance(proof, Proof) or not auth.matches(
            auth.worker_proof(secret, challenge, proof.nonce), proof.mac
        ):
            self._refuse(conn, "authentication failed: wrong or missing secret")
            return None
        deadline.cancel()
        self._proven(conn, slot)
        if revoked := self.keys.refusal(hello.worker_name, hello.credential):
            self._refuse(conn, revoked)
            return None
        try:
            backend: Backend = self.plugins.backend(hello.backend)
            backend.check_precision(self.setup.config.precision)
            self._check_served(hello.backend, hello.arch)
            devices = self._check_devices(backend, hello.device)
            report = json.loads(hello.runtime)
            if not isinstance(report, dict):
                raise ValueError(f"its runtime report is not an object: {hello.runtime[:80]!r}")
        except (UnknownNameError, ValueError) as error:
            self._refuse(conn, f"the shepherd cannot compile for this worker: {error}")
            return None
        if refusal := backend.runtime.refusal(backend, hello.arch, report):
            self._refuse(conn, refusal)
            return None
        index = self._reserve_index(hello.previous_index)
        with self._index_lock:
            self._welcomed.add(id(conn))
        mac = auth.shepherd_proof(secret, challenge, proof.nonce)
        welcome = Welcome(index, mac, self.heartbeat_s)
        keys = session_keys(secret, challenge, proof.nonce, hello, welcome)
        live = LiveConnection(
            SealedConnection(conn, keys.shepherd_to_worker, keys.worker_to_shepherd)
        )
        self.status.worker_joined(
            index,
            hello.worker_name,
            hello.backend,
            hello.arch,
            conn.peer,
            heard=lambda: live.last_heard,
            restarting=hello.previous_index >= 0,
        )
        try:
            conn.send(welcome)  # the last message in the clear: from here on all are sealed
            live.start_heartbeats(self.heartbeat_s)  # compiling may take minutes
            self.status.worker_state(index, "compiling")
            with self.builds.running():
                artifact = self.program_for(backend, hello.arch, devices)
                link = WorkerLink(index, live, hello)
                assigned = self._send_setup(link, artifact)
            loaded = live.receive()  # loading may take a while (XLA compiles): heartbeats
            while isinstance(loaded, ShardRequest):
                # each of its shards once: a worker cannot make it send a shard twice
                self._serve_shard(link, loaded, assigned)
                assigned.pop(loaded.name)
                loaded = live.receive()
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

    def program_for(self, backend: Backend, arch: str, devices: int = 1) -> Artifact:
        """One compile per distinct (backend, architecture, device count), shared by its
        workers.

        The first worker of a kind compiles; later ones of that kind wait for its result.
        No lock is held while compiling, so joins of other kinds go on meanwhile.
        """
        key = (backend.name, arch, devices)
        with self._compile_lock:
            program = self._programs.get(key)
            compiling = program is None
            if program is None:
                program = self._programs[key] = Future()
        if compiling:
            runtime, program_in = backend.runtime, self.setup.program
            try:
                if devices > 1:  # only a multi_device runtime takes it (_check_devices)
                    several = cast(MultiDeviceRuntime, runtime)
                    program.set_result(several.build(program_in, backend, arch, devices))
                else:
                    program.set_result(runtime.build(program_in, backend, arch))
            except BaseException as error:
                program.set_exception(error)
        return program.result()

    def _send_setup(self, link: WorkerLink, artifact: Artifact) -> dict[str, Path]:
        """Send the worker its program, settings and data; returns the shards it may ask
        for (a prepared dataset's share of this worker; none for a text corpus, whose
        tokens travel in the Setup)."""
        tensors = [Tensor("artifact", np.frombuffer(artifact.data, dtype=np.uint8))]
        tensors += self._shared_tensors()
        assigned: dict[str, Path] = {}
        names = self.shard_names(link.index)
        if names is None:
            tensors.append(self._tokens())
        else:
            shards = training_shards(self.setup.corpus) or {}
            assigned = {name: shards[name] for name in names}
            log.info("data shards assigned", worker=link.label, shards=names)
        settings = self.worker_settings(names)
        setup = Setup(artifact.kind, artifact.sha256, settings.to_json(), tensors)
        self.setup_bytes += link.conn.send(setup)
        return assigned

    def shard_names(self, index: int) -> list[str] | None:
        """Worker `index`'s share of a prepared dataset's training shards; None for a
        text corpus, which travels whole."""
        shards = training_shards(self.setup.corpus)
        if shards is None:
            return None
        return assign_shards(list(shards), index, self.setup.config.shepherd.workers)

    def worker_settings(self, shard_names: list[str] | None) -> WorkerSettings:
        """What a worker's Setup tells it: the run's settings, the program's shape, and
        its data: a text corpus's vocabulary (`shard_names` None), or its shards' manifest."""
        program = self.setup.program
        if shard_names is None:
            corpus = cast(CharCorpus, self.setup.corpus)  # not prepared: a text corpus
            data: dict[str, Any] = {"vocabulary": tuple(corpus.vocabulary)}
        else:
            data = {"manifest": worker_manifest(self.setup.corpus, shard_names)}
        return WorkerSettings(
            **vars(self.settings),
            batch_size=program.batch_size,
            block_size=program.block_size,
            steps_per_call=program.steps_per_call,
            param_specs=tuple((s.name, s.shape, s.dtype) for s in program.param_specs),
            opt_specs=tuple((s.name, s.shape, s.dtype) for s in program.opt_specs),
            **data,
        )

    def _serve_shard(
        self, link: WorkerLink, request: ShardRequest, assigned: dict[str, Path]
    ) -> None:
        sent = serve_shard(link.conn.send, request, assigned)
        with self._shared_lock:
            self.shard_bytes += sent
            self.shards_fetched.setdefault(link.index, []).append(request.name)
        log.info("shard sent", worker=link.label, shard=request.name, bytes=sent)

    def _shared_tensors(self) -> list[Tensor]:
        """The initial inner state, the same for every worker: built once, so sixteen
        workers joining at once do not hold sixteen copies."""
        with self._shared_lock:
            if self._shared is None:
                program = self.setup.program
                opt_state = program.init_opt_state(self.setup.initial_params())
                self._shared = [
                    Tensor(s.name, a) for s, a in zip(program.opt_specs, opt_state, strict=True)
                ]
            return self._shared

    def _tokens(self) -> Tensor:
        """A text corpus's training tokens, built once like `_shared_tensors`."""
        with self._shared_lock:
            if self._text_tokens is None:
                corpus = cast(CharCorpus, self.setup.corpus)  # (as `shard_names` said)
                token_dtype = np.uint8 if corpus.vocab_size <= 256 else np.int32
                self._text_tokens = Tensor("tokens", corpus.train.astype(token_dtype))
            return self._text_tokens
