"""Provisioning: what an admitted worker is served, after its Welcome and before it
trains (`pcp_core.shepherd.admission` lets it in).

Its program is built once per kind of worker (backend, architecture, device count) and
shared by every worker of that kind; its Setup carries the program, the run's settings,
the initial inner state and its data (a text corpus's tokens, or the manifest of its
share of a prepared dataset's shards); then it asks for the shards it does not have,
each sent at most once, and says Ready (or why it cannot load them).
"""

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import structlog

from pcp_core.backends import Artifact, Backend, MultiDeviceRuntime
from pcp_core.data.text import CharCorpus
from pcp_core.program.training import TrainingSetup
from pcp_core.shepherd.builds import Builds
from pcp_core.shepherd.links import WorkerLink
from pcp_core.wire.messages import (
    RunSettings,
    Setup,
    ShardRequest,
    Tensor,
    WorkerSettings,
)
from pcp_core.wire.shard_transfer import (
    assign_shards,
    serve_shard,
    training_shards,
    worker_manifest,
)

log = structlog.get_logger(__name__)


@dataclass
class Provisioning:
    """The programs, Setups and shards a run's workers are served."""

    setup: TrainingSetup
    settings: RunSettings  # what every worker is told about the run
    builds: Builds = field(default_factory=Builds)  # a build runs inside `builds.running()`
    setup_bytes: int = 0
    shard_bytes: int = 0  # the shards served to workers that did not have them
    shards_fetched: dict[int, list[str]] = field(default_factory=dict)  # by worker index
    _programs: dict[tuple[str, str, int], "Future[Artifact]"] = field(default_factory=dict)
    _compile_lock: threading.Lock = field(default_factory=threading.Lock)
    _shared: list[Tensor] | None = None
    _text_tokens: Tensor | None = None
    _shared_lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self, link: WorkerLink, backend: Backend, devices: int) -> object:
        """Build (or wait for) the worker's program, send its Setup, then the shards it
        asks for: returns the message that ends that, a Ready where all went well."""
        with self.builds.running():
            artifact = self.program_for(backend, link.hello.arch, devices)
            assigned = self.send_setup(link, artifact)
        loaded = link.conn.receive()  # loading may take a while (XLA compiles): heartbeats
        while isinstance(loaded, ShardRequest):
            # each of its shards once: a worker cannot make it send a shard twice
            self._serve_shard(link, loaded, assigned)
            assigned.pop(loaded.name)
            loaded = link.conn.receive()
        return loaded

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
                if devices > 1:  # only a multi_device runtime takes it (admission checks)
                    several = cast(MultiDeviceRuntime, runtime)
                    program.set_result(several.build(program_in, backend, arch, devices))
                else:
                    program.set_result(runtime.build(program_in, backend, arch))
            except BaseException as error:
                program.set_exception(error)
        return program.result()

    def send_setup(self, link: WorkerLink, artifact: Artifact) -> dict[str, Path]:
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
