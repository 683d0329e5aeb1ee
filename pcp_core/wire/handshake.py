"""The join handshake, both halves: the worker's (`join`) and the shepherd's (`prove`,
then `Proven.welcome`).

    worker                                  shepherd
    Hello (name, backend, arch, ...)   ->
                                       <-   Challenge (a nonce), or Reject
    Proof (its HMAC, its own nonce)    ->
                                       <-   Welcome (index, the shepherd's HMAC,
                                            heartbeat interval), or Reject

Both sides prove they know the secret (`pcp_core.wire.auth`). Until the worker has, the
shepherd reads its frames under `PRE_AUTH_FRAME_BYTES`. Between the proof and the
Welcome the shepherd decides whether it serves the worker (`pcp_core.shepherd.admission`),
and refuses it with a Reject if not. The Welcome is the last message in the clear: the
session's keys are derived from the secret, both nonces, the Hello and the Welcome, and
every later message is sealed under them (`pcp_core.wire.channel`), the Setup first
(`pcp_core.shepherd.provisioning`, `pcp_core.worker.joining`).
"""

from dataclasses import dataclass

from pcp_core.wire import auth
from pcp_core.wire.channel import SealedConnection, session_keys
from pcp_core.wire.messages import Challenge, Hello, Proof, Reject, Welcome
from pcp_core.wire.transport import Connection

PRE_AUTH_FRAME_BYTES = 64 * 2**10  # a Hello or a Proof is a few hundred bytes


class JoinRefused(RuntimeError):
    """The shepherd refused this worker, or failed to prove it knows the secret."""


class Refusal(Exception):
    """Why the shepherd refuses a joining peer: what its Reject says."""


# -- the worker's half --------------------------------------------------------------------


def join(conn: Connection, hello: Hello, secret: bytes | None) -> tuple[Welcome, SealedConnection]:
    """The handshake; returns the Welcome (index, heartbeat interval) and the connection
    as the authenticated channel every later message travels on."""
    conn.send(hello)
    challenge = conn.receive()
    if isinstance(challenge, Reject):
        raise JoinRefused(challenge.reason)
    if not isinstance(challenge, Challenge):
        raise JoinRefused(f"expected a challenge, got {type(challenge).__name__}")
    if secret is None:
        raise JoinRefused("the shepherd requires a shared secret: use --token-file or PCP_TOKEN")
    own_nonce = auth.nonce()
    conn.send(Proof(auth.worker_proof(secret, challenge.nonce, own_nonce), own_nonce))
    answer = conn.receive()
    if isinstance(answer, Reject):
        raise JoinRefused(answer.reason)
    if not isinstance(answer, Welcome):
        raise JoinRefused(f"expected a welcome, got {type(answer).__name__}")
    if not auth.matches(auth.shepherd_proof(secret, challenge.nonce, own_nonce), answer.mac):
        raise JoinRefused("the shepherd did not prove it knows the shared secret")
    keys = session_keys(secret, challenge.nonce, own_nonce, hello, answer)
    return answer, SealedConnection(conn, keys.worker_to_shepherd, keys.shepherd_to_worker)


# -- the shepherd's half ------------------------------------------------------------------


@dataclass(frozen=True)
class Proven:
    """A peer that proved it knows the secret of the name its Hello gives."""

    hello: Hello
    secret: bytes
    challenge: bytes  # the shepherd's nonce
    nonce: bytes  # the worker's

    def welcome(
        self, conn: Connection, index: int, heartbeat_s: float
    ) -> tuple[Welcome, SealedConnection]:
        """The Welcome that admits it as worker `index`, for the caller to send on `conn`
        (the last message in the clear), and `conn` sealed for every message after it."""
        mac = auth.shepherd_proof(self.secret, self.challenge, self.nonce)
        welcome = Welcome(index, mac, heartbeat_s)
        keys = session_keys(self.secret, self.challenge, self.nonce, self.hello, welcome)
        return welcome, SealedConnection(conn, keys.shepherd_to_worker, keys.worker_to_shepherd)


def prove(conn: Connection, keys: auth.Keys) -> Proven:
    """Read the peer's Hello, challenge it, check its Proof; Refusal (for the caller to
    send as a Reject) where it is no Hello, names no credential `keys` know, or fails."""
    hello = conn.receive(max_frame_bytes=PRE_AUTH_FRAME_BYTES)
    if not isinstance(hello, Hello):
        raise Refusal(f"expected Hello, got {type(hello).__name__}")
    try:
        secret = keys.secret_for(hello.worker_name, hello.credential)
    except auth.AuthError as error:
        raise Refusal(f"authentication failed: {error}") from None
    challenge = auth.nonce()
    conn.send(Challenge(challenge))
    proof = conn.receive(max_frame_bytes=PRE_AUTH_FRAME_BYTES)
    if not isinstance(proof, Proof) or not auth.matches(
        auth.worker_proof(secret, challenge, proof.nonce), proof.mac
    ):
        raise Refusal("authentication failed: wrong or missing secret")
    return Proven(hello, secret, challenge, proof.nonce)
