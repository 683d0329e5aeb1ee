"""The shepherd: admits workers, ships each the program compiled for its device, and
runs rounds in which workers' results are summed as they arrive.

Joins are handled on background threads, so a slow, malicious or broken peer never
holds up the others; a worker that comes back (restarted by its supervisor) is
admitted again between rounds. Pseudo-gradients are read from the socket one tensor
at a time into a small scratch buffer and added into a running sum, so memory stays
near three copies of the model whatever the number of workers.
"""

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
from pcp_core.messages import (
    Assignment,
    Challenge,
    Failure,
    Hello,
    Proof,
    Reject,
    Result,
    Setup,
    Stop,
    Tensor,
    Welcome,
)
from pcp_core.program import TensorSpec
from pcp_core.registry import UnknownNameError
from pcp_core.training import TrainingSetup
from pcp_core.transport import Connection, Listener, TensorHeader, TransportError

log = structlog.get_logger(__name__)


class RoundFailed(RuntimeError):
    """No worker returned a usable result for a round."""


class NotEnoughWorkers(RuntimeError):
    """The run cannot start: too few workers joined in time, and no more are coming."""


@dataclass
class WorkerLink:
    index: int
    conn: Connection
    hello: Hello

    @property
    def label(self) -> str:
        return f"worker {self.index} ({self.hello.backend}/{self.hello.arch})"


@dataclass
class RoundOutcome:
    results: dict[int, Result]  # worker index -> result (tensors not kept)
    bytes_sent: int
    bytes_received: int
    seconds: float
    discarded: bool = False  # a worker failed mid-result: the sum is incomplete


class _SummingSink:
    """Reads each tensor into one scratch buffer, then adds it into the running sum."""

    def __init__(self, sums: list[np.ndarray], specs: list[TensorSpec], lock: threading.Lock):
        self.sums, self.specs, self.lock = sums, specs, lock
        largest = max(s.nbytes for s in specs)
        self.scratch = np.empty(largest, dtype=np.uint8)
        self.added = 0

    def buffer(self, index: int, header: TensorHeader) -> np.ndarray:
        spec = self.specs[index] if index < len(self.specs) else None
        if spec is None or (header.name, header.shape, header.dtype) != (
            spec.name,
            spec.shape,
            spec.dtype,
        ):
            raise TransportError(f"unexpected tensor {header.name} {header.shape} {header.dtype}")
        return self.scratch[: spec.nbytes].view(spec.dtype).reshape(spec.shape)

    def filled(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        with self.lock:
            self.sums[index] += array
        self.added += 1


@dataclass
class Shepherd:
    setup: TrainingSetup
    listener: Listener
    secret: bytes
    plugins: Any
    algorithm: str
    links: dict[int, WorkerLink] = field(default_factory=dict)
    _joined: "queue.Queue[WorkerLink]" = field(default_factory=queue.Queue)
    _programs: dict[tuple[str, str], CompiledProgram] = field(default_factory=dict)
    _compile_lock: threading.Lock = field(default_factory=threading.Lock)
    _index_lock: threading.Lock = field(default_factory=threading.Lock)
    _reserved: set[int] = field(default_factory=set)
    _closing: threading.Event = field(default_factory=threading.Event)
    _stop_reason: str = "done"
    setup_bytes: int = 0
    still_coming: Callable[[], bool] = lambda: True  # may more workers still join?

    # -- admission ------------------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="pcp-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                conn = self.listener.accept(timeout_s=0.2)
            except TimeoutError:
                continue
            except OSError:
                if self._closing.is_set():
                    return
                log.warning("accept failed", exc_info=True)
                continue
            threading.Thread(target=self._admit, args=(conn,), daemon=True).start()

    def _admit(self, conn: Connection) -> None:
        try:
            link = self._handshake(conn)
            if link is not None:
                self._joined.put(link)
                if self._closing.is_set():  # joined while closing: close() may have missed it
                    self._stop_joined()
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
        try:
            compiled = self.program_for(backend, hello.arch)
        except CompileError as error:
            self._refuse(conn, f"the shepherd cannot compile for this worker: {error}")
            return None
        index = self._reserve_index()
        conn.send(Welcome(index, auth.shepherd_proof(self.secret, challenge, proof.nonce)))
        link = WorkerLink(index, conn, hello)
        try:
            self._send_setup(link, backend, compiled)
        except BaseException:
            self._release_index(index)
            raise
        log.info("worker joined", worker=link.label, peer=conn.peer, name=hello.worker_name)
        return link

    def _reserve_index(self) -> int:
        with self._index_lock:
            index = next(i for i in range(len(self._reserved) + 1) if i not in self._reserved)
            self._reserved.add(index)
            return index

    def _release_index(self, index: int) -> None:
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
            "algorithm": self.algorithm,
            "driver": backend.driver,
            "batch_size": program.batch_size,
            "block_size": program.block_size,
            "steps_per_call": program.steps_per_call,
            "vocabulary": corpus.vocabulary,
            "param_specs": [(s.name, s.shape, s.dtype) for s in program.param_specs],
            "opt_specs": [(s.name, s.shape, s.dtype) for s in program.opt_specs],
        }
        params = self.setup.initial_params()
        opt_state = program.init_opt_state(params)
        token_dtype = np.uint8 if corpus.vocab_size <= 256 else np.int32
        tensors = [
            Tensor("vmfb", np.frombuffer(compiled.vmfb, dtype=np.uint8)),
            Tensor("tokens", corpus.train.astype(token_dtype)),
            *(Tensor(s.name, a) for s, a in zip(program.opt_specs, opt_state, strict=True)),
        ]
        self.setup_bytes += link.conn.send(Setup(compiled.sha256, json.dumps(settings), tensors))

    def wait_for_workers(self, count: int, timeout_s: float | None = None) -> None:
        """Block until `count` workers have joined (and received their program).

        Gives up after `timeout_s`, or as soon as `still_coming()` says no more will come
        (the one-command form's local workers have all exited).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(self.links) < count:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                link = self._joined.get(timeout=min(remaining or 1.0, 1.0))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise NotEnoughWorkers(
                        f"only {len(self.links)} of {count} workers joined in {timeout_s:.0f} s"
                    ) from None
                if not self.still_coming():
                    raise NotEnoughWorkers(
                        f"only {len(self.links)} of {count} workers joined and no more are "
                        "coming; see the worker logs in the run directory"
                    ) from None
                continue
            self.links[link.index] = link

    def admit_returning(self) -> None:
        """Take in workers that (re)joined since the last round."""
        while True:
            try:
                link = self._joined.get_nowait()
            except queue.Empty:
                return
            self.links[link.index] = link

    # -- rounds ---------------------------------------------------------------------------

    def run_round(
        self,
        round_index: int,
        params: list[np.ndarray],
        delta_sum: list[np.ndarray],
        make_assignment: Callable[[int], Assignment],
    ) -> RoundOutcome:
        """Send every worker the global params, sum their results into `delta_sum`.

        `make_assignment(worker_index)` gives each worker its round assignment.
        """
        self.admit_returning()
        if not self.links:
            raise RoundFailed("no workers are connected")
        for total in delta_sum:
            total.fill(0)
        specs = self.setup.program.param_specs
        tensors = [Tensor(s.name, p) for s, p in zip(specs, params, strict=True)]
        lock = threading.Lock()
        links = sorted(self.links.values(), key=lambda link: link.index)
        before = {link.index: (link.conn.bytes_sent, link.conn.bytes_received) for link in links}
        started = time.perf_counter()

        def exchange(link: WorkerLink) -> tuple[Result | None, int]:
            sink = _SummingSink(delta_sum, specs, lock)
            try:
                assignment = make_assignment(link.index)
                assignment.tensors = tensors
                link.conn.send(assignment)
                reply = link.conn.receive(sink)
            except (TransportError, OSError) as error:
                log.warning("worker lost", worker=link.label, round=round_index, error=str(error))
                return None, sink.added
            if isinstance(reply, Failure):
                log.warning("worker failed", worker=link.label, reason=reply.reason)
                return None, sink.added
            if not isinstance(reply, Result) or reply.round != round_index:
                log.warning("worker sent a bad result", worker=link.label)
                return None, sink.added
            return reply, sink.added  # its tensors went into the sum

        with ThreadPoolExecutor(max_workers=len(links)) as pool:
            replies = list(pool.map(exchange, links))
        seconds = time.perf_counter() - started

        results: dict[int, Result] = {}
        discarded = False
        for link, (result, added) in zip(links, replies, strict=True):
            if result is not None:
                results[link.index] = result
                continue
            discarded = discarded or added > 0  # a partial sum cannot be undone
            self._drop(link)
        sent = sum(link.conn.bytes_sent - before[link.index][0] for link in links)
        received = sum(link.conn.bytes_received - before[link.index][1] for link in links)
        if not results:
            raise RoundFailed(f"round {round_index}: no worker returned a result")
        return RoundOutcome(results, sent, received, seconds, discarded)

    def _drop(self, link: WorkerLink) -> None:
        link.conn.close()
        self.links.pop(link.index, None)
        self._release_index(link.index)

    def close(self, reason: str = "done") -> None:
        """Tell every worker to stop, those that joined too late for a round included,
        then close all connections and the listener."""
        self._stop_reason = reason
        self._closing.set()
        for link in list(self.links.values()):
            self._stop(link)
        self.links.clear()
        self._stop_joined()
        self.listener.close()

    def _stop_joined(self) -> None:
        """Stop the workers that joined but were not taken into a round yet."""
        while True:
            try:
                self._stop(self._joined.get_nowait())
            except queue.Empty:
                return

    def _stop(self, link: WorkerLink) -> None:
        with contextlib.suppress(TransportError, OSError):
            link.conn.send(Stop(self._stop_reason))
        link.conn.close()
