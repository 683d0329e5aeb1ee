"""Admission: accept connections, authenticate workers, ship each its program.

Joins run on background threads, so a slow, malicious or broken peer never holds up the
others or the rounds. An admitted worker's link goes into `joined`; the shepherd takes it
into the next round. A worker that comes back after a restart asks for the index it had,
so it keeps its data shard and its saved inner state stays paired with it.
"""

import contextlib
import json
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from pcp_core import auth
from pcp_core.backends import Backend
from pcp_core.compiler import (
    CompiledProgram,
    CompileError,
    compile_program,
    iree_compiler_version,
)
from pcp_core.liveness import LiveConnection
from pcp_core.messages import Challenge, Hello, Proof, Reject, Setup, Tensor, Welcome
from pcp_core.registry import UnknownNameError
from pcp_core.training import TrainingSetup
from pcp_core.transport import Connection, Listener, TransportError

log = structlog.get_logger(__name__)


@dataclass
class WorkerLink:
    index: int
    conn: LiveConnection
    hello: Hello

    @property
    def label(self) -> str:
        hello = self.hello
        return f"worker {self.index} ({hello.worker_name}, {hello.backend}/{hello.arch})"


@dataclass
class Admission:
    setup: TrainingSetup
    listener: Listener
    secret: bytes
    plugins: Any
    settings: dict[str, Any]  # run settings every worker gets (algorithm, run id, ...)
    heartbeat_s: float
    joined: "queue.Queue[WorkerLink]" = field(default_factory=queue.Queue)
    closing: threading.Event = field(default_factory=threading.Event)
    setup_bytes: int = 0
    stop_late: Callable[[], None] = lambda: None  # stops links that joined while closing
    _programs: dict[tuple[str, str], CompiledProgram] = field(default_factory=dict)
    _compile_lock: threading.Lock = field(default_factory=threading.Lock)
    _index_lock: threading.Lock = field(default_factory=threading.Lock)
    _reserved: set[int] = field(default_factory=set)
    _shared: list[Tensor] | None = None
    _shared_lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="pcp-accept", daemon=True).start()

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
            threading.Thread(target=self._admit, args=(conn,), daemon=True).start()

    def _admit(self, conn: Connection) -> None:
        try:
            link = self._handshake(conn)
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

    def _refuse(self, conn: Connection, reason: str) -> None:
        log.warning("refusing worker", peer=conn.peer, reason=reason)
        try:
            conn.send(Reject(reason))
        finally:
            conn.close()

    def _handshake(self, conn: Connection) -> WorkerLink | None:
        hello = conn.receive()
        if not isinstance(hello, Hello):
            self._refuse(conn, f"expected Hello, got {type(hello).__name__}")
            return None
        challenge = auth.nonce()
        conn.send(Challenge(challenge))
        proof = conn.receive()
        if not isinstance(proof, Proof) or not auth.matches(
            auth.worker_proof(self.secret, challenge, proof.nonce), proof.mac
        ):
            self._refuse(conn, "authentication failed: wrong or missing shared secret")
            return None
        compiler = iree_compiler_version()
        if hello.iree_runtime_version != compiler:
            self._refuse(
                conn,
                f"IREE version mismatch: the shepherd compiles with IREE "
                f"{compiler} but this worker runs iree-base-runtime "
                f"{hello.iree_runtime_version}; install iree-base-runtime=={compiler}",
            )
            return None
        try:
            backend: Backend = self.plugins.backend(hello.backend)
            backend.check_precision(self.setup.config.precision)
        except (UnknownNameError, ValueError) as error:
            self._refuse(conn, f"the shepherd cannot compile for this worker: {error}")
            return None
        index = self._reserve_index(hello.previous_index)
        live = LiveConnection(conn)
        try:
            mac = auth.shepherd_proof(self.secret, challenge, proof.nonce)
            conn.send(Welcome(index, mac, self.heartbeat_s))
            live.start_heartbeats(self.heartbeat_s)  # compiling may take minutes
            compiled = self.program_for(backend, hello.arch)
            link = WorkerLink(index, live, hello)
            self._send_setup(link, backend, compiled)
        except CompileError as error:
            self.release_index(index)
            self._refuse(conn, f"the shepherd cannot compile for this worker: {error}")
            live.close()
            return None
        except BaseException:
            self.release_index(index)
            live.close()
            raise
        log.info("worker joined", worker=link.label, peer=conn.peer)
        return link

    def _reserve_index(self, previous: int) -> int:
        """The index a returning worker had, if free and one of this run's (a worker's
        saved state may be from an older run with more workers); else the lowest free."""
        with self._index_lock:
            if 0 <= previous < self.setup.config.workers and previous not in self._reserved:
                index = previous
            else:
                index = next(i for i in range(len(self._reserved) + 1) if i not in self._reserved)
            self._reserved.add(index)
            return index

    def release_index(self, index: int) -> None:
        with self._index_lock:
            self._reserved.discard(index)

    def program_for(self, backend: Backend, arch: str) -> CompiledProgram:
        """One compile per distinct (backend, architecture), shared by its workers."""
        with self._compile_lock:
            key = (backend.name, arch)
            if key not in self._programs:
                self._programs[key] = compile_program(self.setup.program.stablehlo, backend, arch)
            return self._programs[key]

    def _send_setup(self, link: WorkerLink, backend: Backend, compiled: CompiledProgram) -> None:
        program, corpus = self.setup.program, self.setup.corpus
        settings = {
            **self.settings,
            "driver": backend.driver,
            "batch_size": program.batch_size,
            "block_size": program.block_size,
            "steps_per_call": program.steps_per_call,
            "vocabulary": corpus.vocabulary,
            "param_specs": [(s.name, s.shape, s.dtype) for s in program.param_specs],
            "opt_specs": [(s.name, s.shape, s.dtype) for s in program.opt_specs],
        }
        tensors = [Tensor("vmfb", np.frombuffer(compiled.vmfb, dtype=np.uint8))]
        tensors += self._shared_tensors()
        self.setup_bytes += link.conn.send(Setup(compiled.sha256, json.dumps(settings), tensors))

    def _shared_tensors(self) -> list[Tensor]:
        """The tokens and the initial inner state, the same for every worker: built once,
        so sixteen workers joining at once do not hold sixteen copies."""
        with self._shared_lock:
            if self._shared is None:
                program, corpus = self.setup.program, self.setup.corpus
                opt_state = program.init_opt_state(self.setup.initial_params())
                token_dtype = np.uint8 if corpus.vocab_size <= 256 else np.int32
                self._shared = [
                    Tensor("tokens", corpus.train.astype(token_dtype)),
                    *(Tensor(s.name, a) for s, a in zip(program.opt_specs, opt_state, strict=True)),
                ]
            return self._shared
