"""What a shepherd and a worker refuse: wrong secrets, malformed frames, a tampered program.

The shepherd is a real `pcp shepherd`; the bad peers are a `pcp worker` with another
secret and raw sockets. The worker is a real `pcp worker` facing a fake shepherd played
by this test through the transport itself.
"""

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pcp_capnp_tcp import header, listen
from pcp_capnp_tcp.connection import MAGIC, PREFIX

from pcp_core.shepherd.admission import MAX_UNPROVEN
from pcp_core.testing import install_fake_plugin
from pcp_core.wire import auth
from pcp_core.wire.channel import SealedConnection, session_keys
from pcp_core.wire.messages import (
    PROTOCOL_VERSION,
    Challenge,
    Failure,
    Hello,
    Proof,
    Setup,
    Tensor,
    Welcome,
)
from pcp_core.wire.transport import TransportOptions

EXIT_REFUSED = 3


def closed_by_peer(raw: socket.socket) -> bool:
    """Whether the other end closed the connection (EOF or reset) without sending anything."""
    try:
        return raw.recv(1) == b""
    except ConnectionResetError:
        return True


def send_raw(address: tuple[str, int], data: bytes) -> socket.socket:
    raw = socket.create_connection(address, timeout=30)
    raw.sendall(data)
    return raw


def hello_frame(version: int, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A well-formed Hello frame that claims protocol `version`."""
    with monkeypatch.context() as patch:
        patch.setattr(header, "PROTOCOL_VERSION", version)
        encoded = header.encode(Hello("intruder", "cpu", "generic", "0"), [])
    return PREFIX.pack(MAGIC, len(encoded), 0) + encoded


def test_shepherd_rejects_bad_peers_then_runs(
    e2e: Any,
    tiny: tuple[str, ...],
    token_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each bad peer is refused and cut off; good workers joining afterwards finish the run."""
    out = tmp_path / "run"
    run = ("--steps", "60", "--inner-steps", "10", "--eval-every", "0", "--out", str(out))
    shepherd, address = e2e.shepherd(
        *("--backend", "cpu", "--workers", "2"), *("--token-file", str(token_file), *run, *tiny)
    )
    port = int(address.rpartition(":")[2])
    worker_args = ("worker", "--connect", address, "--backend", "cpu", "--restarts", "0")

    # (a) a worker with another secret
    wrong_token = tmp_path / "wrong-token"
    wrong_token.write_text("not-the-secret\n")
    wrong_token.chmod(0o600)  # a token file open to others is refused before it is tried
    intruder = e2e.pcp("intruder", *worker_args, "--token-file", str(wrong_token))
    assert intruder.wait(120) == EXIT_REFUSED, intruder.output()
    assert "refused" in intruder.err() and "authentication failed" in intruder.err()

    # (b) garbage, (c) an absurd payload length, (d) another protocol version
    shepherd_address = ("127.0.0.1", port)
    bad_frames = {
        "garbage": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "oversized": PREFIX.pack(MAGIC, 64, 2**62) + bytes(64),
        "version": hello_frame(PROTOCOL_VERSION + 1, monkeypatch),
    }
    for name, data in bad_frames.items():
        with send_raw(shepherd_address, data) as raw:
            assert closed_by_peer(raw), f"the shepherd kept the {name} connection open"

    token = ("--token-file", str(token_file))
    workers = [e2e.pcp(f"worker-{i}", *worker_args, *token) for i in range(2)]
    assert shepherd.wait(300) == 0, shepherd.output()[-4000:]
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
    records = e2e.metrics(out)
    assert [r["workers"] for r in records] == [2] * 6

    log = shepherd.err()
    assert "authentication failed: wrong or missing secret" in log
    assert "does not speak PCP capnp-tcp" in log
    assert f"frame of {PREFIX.size + 64 + 2**62} bytes is over the limit" in log
    assert f"peer speaks PCP protocol version {PROTOCOL_VERSION + 1}" in log
    assert log.count("join failed") == 3, log


class FakeShepherd:
    """This test as a shepherd: the real handshake over the real transport, by hand."""

    def __init__(self) -> None:
        self.listener = listen("127.0.0.1", 0, TransportOptions(timeout_s=60))
        self.address = "{}:{}".format(*self.listener.address)

    def admit(self, secret: bytes, proof_secret: bytes) -> Any:
        """Accept one worker, check its proof of `secret`, answer with a proof of `proof_secret`."""
        conn = self.listener.accept(120)
        hello = conn.receive()
        assert isinstance(hello, Hello) and hello.backend == "cpu"
        challenge = auth.nonce()
        conn.send(Challenge(challenge))
        proof = conn.receive()
        assert isinstance(proof, Proof)
        assert auth.matches(auth.worker_proof(secret, challenge, proof.nonce), proof.mac)
        welcome = Welcome(0, auth.shepherd_proof(proof_secret, challenge, proof.nonce))
        conn.send(welcome)
        keys = session_keys(secret, challenge, proof.nonce, hello, welcome)
        return SealedConnection(conn, keys.shepherd_to_worker, keys.worker_to_shepherd)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def fake_shepherd() -> Any:
    shepherd = FakeShepherd()
    yield shepherd
    shepherd.close()


def test_worker_refuses_tampered_program(e2e: Any, token_file: Path, fake_shepherd: Any) -> None:
    """A VMFB whose bytes do not match the announced hash is never loaded."""
    secret = token_file.read_text().strip().encode()
    args = ("--backend", "cpu", "--token-file", str(token_file), "--restarts", "0")
    worker = e2e.pcp("worker", "worker", "--connect", fake_shepherd.address, *args)
    conn = fake_shepherd.admit(secret, secret)

    program = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    tampered = program.copy()
    tampered[2048] ^= 0x01
    announced = hashlib.sha256(program.tobytes()).hexdigest()
    tensors = [Tensor("artifact", tampered), Tensor("tokens", np.zeros(1000, np.uint8))]
    conn.send(Setup("iree-vmfb", announced, json.dumps({}), tensors))
    reply = conn.receive()
    assert isinstance(reply, Failure), reply
    assert "hash mismatch" in reply.reason and announced[:16] in reply.reason
    assert worker.wait(60) == EXIT_REFUSED, worker.output()
    assert "refused" in worker.err() and "hash mismatch" in worker.err()
    conn.close()


def test_worker_refuses_shepherd_without_the_secret(
    e2e: Any, token_file: Path, fake_shepherd: Any
) -> None:
    """The proof goes both ways: a shepherd that cannot prove the secret gets nothing more."""
    secret = token_file.read_text().strip().encode()
    args = ("--backend", "cpu", "--token-file", str(token_file), "--restarts", "0")
    worker = e2e.pcp("worker", "worker", "--connect", fake_shepherd.address, *args)
    conn = fake_shepherd.admit(secret, b"a guess")
    assert worker.wait(60) == EXIT_REFUSED, worker.output()
    assert "did not prove it knows the shared secret" in worker.err()
    conn.close()


UNCOMPILABLE = """
from pcp_core import hookimpl
from pcp_core.backends import Backend
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5

@hookimpl
def pcp_register_backends(register):
    register(Backend(name="uncompilable", default_arch="generic",
                     runtime=IreeRuntime(target="llvm-cpu", driver="local-task",
                                         extra_flags=("--iree-no-such-flag",))))
"""


def test_worker_the_shepherd_cannot_compile_for_is_refused(
    tmp_path: Path, tiny: tuple[str, ...]
) -> None:
    """A failed compile refuses the worker with the reason (no crash loop, no long wait)."""
    site = tmp_path / "site"
    install_fake_plugin(site, "pcp-uncompilable", "pcp_uncompilable", UNCOMPILABLE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "pcp_core",
        "train",
        "--algorithm",
        "diloco",
        "--worker-backends",
        "uncompilable",
        "--steps",
        "10",
        "--inner-steps",
        "10",
        "--out",
        str(out),
        *tiny,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "0 of 1 workers connected and no more are coming" in result.stderr
    worker_log = (out / "worker-0.log").read_text()
    assert "refused: the shepherd cannot compile for this worker" in worker_log
    assert "no-such-flag" in worker_log
    assert "restarting" not in result.stderr


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


FLOOD_MEMORY_BOUND = 64 * 2**20  # what 400 unproven connections may add to the shepherd
# threads they may add: one each served and its join-deadline timer, and a margin
FLOOD_THREAD_BOUND = 2 * MAX_UNPROVEN + 16


def thread_count(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads for {pid}")


def test_a_flood_of_idle_and_dripping_connections(
    e2e: Any,
    tiny: tuple[str, ...],
    token_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 connections that say nothing and 200 that drip a frame a byte at a time, held
    open while a real worker joins: the shepherd's memory stays within the bound, the
    worker gets in and the run finishes. (Before the pre-join limits, each connection
    announcing a large header made the shepherd allocate it: 64 MiB apiece.)"""
    shepherd, address = e2e.shepherd(
        *("--backend", "cpu", "--workers", "1"),
        *("--steps", "20", "--inner-steps", "10", "--eval-every", "0"),
        *("--token-file", str(token_file), "--out", str(tmp_path / "run"), *tiny),
    )
    port = int(address.rpartition(":")[2])
    before, threads_before = resident_bytes(shepherd.pid), thread_count(shepherd.pid)
    threads = threads_before
    # half drip a Hello, half a frame whose prefix announces a 60 MiB header
    frames = [hello_frame(PROTOCOL_VERSION, monkeypatch), PREFIX.pack(MAGIC, 60 * 2**20, 0)]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    dripping = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    peak, worker = before, None

    def drip(step: int) -> None:  # a byte on each dripping connection
        for index, sock in enumerate(dripping):
            frame = frames[index % 2]
            with contextlib.suppress(OSError):  # closed by the shepherd: it may
                sock.send(frame[step % len(frame) : step % len(frame) + 1])

    try:
        for step in range(40):  # 2 s of the flood alone
            drip(step)
            peak = max(peak, resident_bytes(shepherd.pid))
            threads = max(threads, thread_count(shepherd.pid))
            time.sleep(0.05)
        worker = e2e.pcp(  # then a real worker, the flood still held open
            "worker",
            *("worker", "--connect", address, "--backend", "cpu"),
            *("--token-file", str(token_file), "--restarts", "0"),
        )
        started = time.monotonic()
        for step in range(40, 6000):
            drip(step)
            if "joined" in worker.err() or worker.process.poll() is not None:
                break
            time.sleep(0.05)
        assert "joined" in worker.err(), worker.output()[-3000:]
        print(f"the worker joined {time.monotonic() - started:.1f} s after it started")
    finally:
        for sock in idle + dripping:
            sock.close()
    assert shepherd.wait(300) == 0, shepherd.output()[-3000:]
    assert worker.wait(60) == 0, worker.output()[-3000:]
    grown = peak - before
    print(f"shepherd resident memory {before / 2**20:.0f} MiB, flood +{grown / 2**20:.1f} MiB")
    assert grown < FLOOD_MEMORY_BOUND, f"the flood grew the shepherd by {grown / 2**20:.0f} MiB"
    assert "too many unproven connections" in shepherd.err()
    grown_threads = threads - threads_before
    assert grown_threads <= FLOOD_THREAD_BOUND, f"the flood added {grown_threads} threads"


def test_a_worker_the_shepherd_does_not_serve_is_told_why(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path
) -> None:
    shepherd, address = e2e.shepherd(
        *("--backend", "cpu", "--workers", "1", "--serve", "cuda:sm_80"),
        *("--join-timeout", "30", "--token-file", str(token_file)),
        *("--out", str(tmp_path / "run"), *tiny),
    )
    worker = e2e.pcp(
        "worker",
        *("worker", "--connect", address, "--backend", "cpu", "--restarts", "0"),
        *("--token-file", str(token_file)),
    )
    assert worker.wait(120) == EXIT_REFUSED, worker.output()
    assert "this shepherd serves only cuda:sm_80, not cpu:" in worker.err()
    shepherd.process.terminate()
