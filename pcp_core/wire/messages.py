"""The shepherd–worker protocol as transport-independent messages.

A transport plugin turns these into bytes. Scalars and text are metadata; every
array, including the VMFB and the token stream, is a `Tensor` that travels as raw
little-endian bytes after the metadata.

A session: worker → Hello; shepherd → Challenge; worker → Proof; shepherd → Welcome
(or Reject); shepherd → Setup (program, data or the data shards assigned to the worker,
optimizer state); a worker without those shards on its disk asks for each with a
ShardRequest and gets it as ShardData chunks; worker → Ready once the program is loaded
(or Failure); then per round
shepherd → Assignment (global params), worker → Result (losses and the pseudo-gradient's
norm, no tensors), shepherd → Fetch (or Discard), worker → Delta (the pseudo-gradient);
where the run pushes deltas (`RunSettings.push_deltas`) each Delta follows its Result
unasked and a Discard is the only answer; finally shepherd → Stop. After the Welcome
both sides send a Heartbeat every
`Welcome.heartbeat_s` while they have nothing else to say, so each can tell a silent
peer from a busy one. Every message after the Welcome, in both directions, is followed by
a Seal that authenticates it (`pcp_core.wire.channel`).
"""

from dataclasses import dataclass, field

import numpy as np

# The settings of a Setup, in their own module; plugins import them from here
# (docs/plugins.md: `pcp_core.wire.messages.RunSettings`), as the worker does `Spec`.
from pcp_core.wire.run_settings import RunSettings as RunSettings
from pcp_core.wire.run_settings import Spec as Spec
from pcp_core.wire.run_settings import WorkerSettings as WorkerSettings

# 6: a Result says where the worker's time went; a run may overlap rounds
# 7: a pseudo-gradient may cross encoded (RunSettings.codec); a Result says how long that took
# 8: a round may be a time budget (Assignment.budget_s)
# 9: a seal covers a tensor's bytes as the digests of its chunks (pcp_core.wire.channel)
# 10: a budgeted round says where the run's learning-rate schedule stands
#     (Assignment.schedule_step)
# 11: deltas may follow their Results unasked (RunSettings.push_deltas), and a Result may
#     come before its Assignment (RunSettings.ahead, Result.ahead, Assignment.continues)
# 12: an encoded tensor's framing carries its shape (pcp_core.codecs); a Hello names the
#     worker's own credential (pcp_core.wire.credentials)
# 13: spot checks (RunSettings.audited): a Result commits to the state its round started
#     from (Result.state_digest); the shepherd may ask for it (Audit -> AuditState)
# 14: codecs with options and decaying error feedback (RunSettings.codec_options,
#     codec_down_options, feedback_decay)
PROTOCOL_VERSION = 14


@dataclass
class Tensor:
    name: str
    array: np.ndarray


@dataclass
class Hello:
    worker_name: str
    backend: str
    arch: str
    runtime: str  # JSON: what its backend's runtime reports (versions, platform)
    device: str = ""
    previous_index: int = -1  # the index it had before a restart (its state is for that)
    credential: str = ""  # the serial of its own credential; "" under a shared secret


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
    heartbeat_s: float = 5.0  # both sides send a Heartbeat at least this often


@dataclass
class Reject:
    reason: str


@dataclass
class Setup:
    """Everything a worker needs once: program, run settings, data, inner-optimizer state."""

    artifact_kind: str  # the backend runtime's kind: "iree-vmfb", "xla-export"
    artifact_sha256: str
    settings_json: str  # a WorkerSettings, as JSON
    # "artifact", the opt state, and "tokens" for a text corpus (a prepared dataset's
    # shards are named in the settings instead, and fetched one by one)
    tensors: list[Tensor] = field(default_factory=list)


@dataclass
class ShardRequest:
    """A worker asks for one of the data shards its Setup assigned it."""

    name: str


@dataclass
class ShardData:
    """One chunk of a requested shard: its bytes from `offset`, `size` bytes in all."""

    name: str
    offset: int
    size: int
    tensors: list[Tensor] = field(default_factory=list)  # "bytes": uint8


@dataclass
class Ready:
    """The worker loaded the Setup's program (compiled it, where its runtime compiles)
    and can take rounds: the shepherd counts it in a round only from now on."""


# A budgeted round runs at most this many times its nominal inner steps.
BUDGET_STEPS_FACTOR = 4


@dataclass
class Assignment:
    """A round for a worker: `inner_steps` steps from the global parameters, or, with a
    `budget_s`, as many calls as fit in that many seconds (at least one, at most
    BUDGET_STEPS_FACTOR × inner_steps), so that unequal workers report together."""

    round: int
    inner_steps: int
    shard_index: int
    shard_count: int
    seed: int
    tensors: list[Tensor] = field(default_factory=list)  # global params
    attempt: int = 0  # a retried round has the same round and a new attempt
    budget_s: float = 0.0  # 0: exactly inner_steps
    # a budgeted round's place in the run's schedule, in steps (the leading worker's steps
    # so far); -1: round × inner_steps
    schedule_step: int = -1
    # the worker's last result was accepted and it holds the global parameters but for
    # the ones sent: a result it computed ahead of this Assignment counts (RunSettings.ahead)
    continues: bool = False

    def most_steps(self) -> int:
        """The most inner steps a worker may run (and report) for this round."""
        return self.inner_steps * (BUDGET_STEPS_FACTOR if self.budget_s > 0 else 1)


@dataclass
class Result:
    """A finished round, without its tensors: the shepherd decides whether to fetch them."""

    round: int
    attempt: int
    losses: list[float]
    compute_s: float  # in its inner steps
    norm: float  # ‖θ_global − θ_local‖, checked against the tensors when they arrive
    # since its previous Result: seconds blocked waiting for the shepherd (its Fetch, the
    # next Assignment with its parameters) and sending (that Result, its Delta)
    waited_s: float = 0.0
    sent_s: float = 0.0
    encode_s: float = 0.0  # encoding its pseudo-gradient (RunSettings.codec)
    # computed before its Assignment arrived, from the worker's own parameters: counts
    # only if that Assignment `continues` (RunSettings.ahead)
    ahead: bool = False
    # in an audited run, the digest of the state the round started from
    # (`pcp_core.worker.audits.state_digest`); "" otherwise
    state_digest: str = ""


@dataclass
class Fetch:
    """The shepherd wants the pseudo-gradient of a Result."""

    round: int
    attempt: int


@dataclass
class Discard:
    """The shepherd refuses a Result (or is done with the round without it)."""

    round: int
    attempt: int
    reason: str


@dataclass
class Audit:
    """A spot check: the shepherd wants the state a fetched result's round started from."""

    round: int
    attempt: int


@dataclass
class AuditState:
    """The state a round started from (`pcp_core.worker.audits.state_tensors`), whose digest its
    Result committed to."""

    round: int
    attempt: int
    tensors: list[Tensor] = field(default_factory=list)


@dataclass
class Delta:
    round: int
    attempt: int
    tensors: list[Tensor] = field(default_factory=list)  # pseudo-gradient θ_global − θ_local


@dataclass
class Heartbeat:
    """Nothing to say, but alive."""


@dataclass
class Seal:
    """Authenticates the message just before it (see `pcp_core.wire.channel`)."""

    mac: bytes  # HMAC-SHA256 under the direction's session key


@dataclass
class Stop:
    reason: str = "done"


@dataclass
class Failure:
    """A worker reports that it could not do what was asked (load, run, ...)."""

    reason: str


Message = (
    Hello
    | Challenge
    | Proof
    | Welcome
    | Reject
    | Setup
    | ShardRequest
    | ShardData
    | Ready
    | Assignment
    | Result
    | Fetch
    | Discard
    | Delta
    | Audit
    | AuditState
    | Heartbeat
    | Seal
    | Stop
    | Failure
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
    Fetch,
    Discard,
    Delta,
    Heartbeat,
    Seal,
    Ready,
    ShardRequest,
    ShardData,
    Audit,
    AuditState,
)


def tensors_of(message: object) -> list[Tensor]:
    return list(getattr(message, "tensors", []))
