"""The shepherd–worker protocol as transport-independent messages.

A transport plugin turns these into bytes. Scalars and text are metadata; every
array, including the VMFB and the token stream, is a `Tensor` that travels as raw
little-endian bytes after the metadata.

A session: worker → Hello; shepherd → Challenge; worker → Proof; shepherd → Welcome
(or Reject); shepherd → Setup (program, data, optimizer state); then per round
shepherd → Assignment (global params), worker → Result (pseudo-gradient); finally
shepherd → Stop.
"""

from dataclasses import dataclass, field

import numpy as np

PROTOCOL_VERSION = 1


@dataclass
class Tensor:
    name: str
    array: np.ndarray


@dataclass
class Hello:
    worker_name: str
    backend: str
    arch: str
    iree_runtime_version: str
    device: str = ""


@dataclass
class Challenge:
    nonce: bytes


@dataclass
class Proof:
    mac: bytes  # HMAC(secret, shepherd's nonce + worker's nonce)
    nonce: bytes  # the worker's nonce, so it can check the shepherd knows the secret too


@dataclass
class Welcome:
    worker_index: int
    mac: bytes  # HMAC(secret, worker's nonce + shepherd's nonce)


@dataclass
class Reject:
    reason: str


@dataclass
class Setup:
    """Everything a worker needs once: program, run settings, data, inner-optimizer state."""

    vmfb_sha256: str
    settings_json: str  # run settings (batch, block, steps per call, specs): small metadata
    tensors: list[Tensor] = field(default_factory=list)  # "vmfb", "tokens", opt state


@dataclass
class Assignment:
    round: int
    inner_steps: int
    shard_index: int
    shard_count: int
    seed: int
    tensors: list[Tensor] = field(default_factory=list)  # global params


@dataclass
class Result:
    round: int
    losses: list[float]
    compute_s: float
    tensors: list[Tensor] = field(default_factory=list)  # pseudo-gradient θ_global − θ_local


@dataclass
class Stop:
    reason: str = "done"


@dataclass
class Failure:
    """A worker reports that it could not do what was asked (load, run, ...)."""

    reason: str


Message = (
    Hello | Challenge | Proof | Welcome | Reject | Setup | Assignment | Result | Stop | Failure
)
MESSAGE_TYPES: tuple[type, ...] = (
    Hello,
    Challenge,
    Proof,
    Welcome,
    Reject,
    Setup,
    Assignment,
    Result,
    Stop,
    Failure,
)


def tensors_of(message: object) -> list[Tensor]:
    return list(getattr(message, "tensors", []))
