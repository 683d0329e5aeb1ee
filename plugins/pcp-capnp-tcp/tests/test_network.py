"""Listening, connecting (with retries), accept timeouts and TLS."""

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pcp_capnp_tcp import connect, listen

from pcp_core.wire.auth import SharedSecret
from pcp_core.wire.messages import Assignment, Stop, Tensor
from pcp_core.wire.transport import TransportError, TransportOptions


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_listener_reports_real_port_and_accept_times_out() -> None:
    listener = listen("127.0.0.1", 0, TransportOptions())
    assert listener.address[0] == "127.0.0.1" and listener.address[1] > 0
    with pytest.raises(TimeoutError):
        listener.accept(timeout_s=0.05)
    listener.close()


def test_connect_retries_until_the_listener_is_up(transfer) -> None:
    port = free_port()
    started: list = []

    def listen_later() -> None:
        time.sleep(0.5)
        started.append(listen("127.0.0.1", port, TransportOptions()))

    thread = threading.Thread(target=listen_later)
    thread.start()
    client = connect("127.0.0.1", port, TransportOptions())
    thread.join()
    server = started[0].accept(10)
    assert transfer(client, server, Stop())[0] == Stop()
    for thing in (client, server, started[0]):
        thing.close()


def test_connect_gives_up_after_retrying() -> None:
    """It raises (rather than retrying for ever) and names the retry time it was given."""
    with pytest.raises(TransportError, match=r"could not connect to .* within 0\.3 s"):
        connect("127.0.0.1", free_port(), TransportOptions(), retry_s=0.3)


def mutual_tls(folder, cert: str) -> TransportOptions:
    """Options that present `cert` and trust only certificate `a`."""
    return TransportOptions(
        timeout_s=10,
        tls_cert=folder / f"{cert}.pem",
        tls_key=folder / f"{cert}.key",
        tls_ca=folder / "a.pem",
    )


def test_tls_round_trip(open_pair, transfer, tls_dir) -> None:
    _, server, client = open_pair(mutual_tls(tls_dir, "a"), mutual_tls(tls_dir, "a"))
    params = [Tensor("w", np.arange(300_000, dtype=np.float32)), Tensor("s", np.array(2))]
    received, _ = transfer(server, client, Assignment(4, 10, 0, 2, 99, params))
    np.testing.assert_array_equal(received.tensors[0].array, params[0].array)
    assert received.round == 4 and received.tensors[1].array == 2
    assert transfer(client, server, Stop())[0] == Stop()
    assert (server.bytes_sent, client.bytes_sent) == (client.bytes_received, server.bytes_received)


def accept_failing(listener) -> tuple[threading.Thread, list[Exception]]:
    """Accepts one connection in a thread, collecting the error it is expected to fail with."""
    errors: list[Exception] = []

    def accept() -> None:
        try:
            listener.accept(10).receive()
        except TransportError as error:
            errors.append(error)

    thread = threading.Thread(target=accept)
    thread.start()
    return thread, errors


def test_tls_client_rejects_an_untrusted_listener(tls_dir) -> None:
    listener = listen("127.0.0.1", 0, mutual_tls(tls_dir, "b"))
    thread, errors = accept_failing(listener)
    with pytest.raises(TransportError, match=r"TLS handshake with .* failed"):
        connect(*listener.address, mutual_tls(tls_dir, "a")).send(Stop())  # on first use
    thread.join()
    assert errors
    listener.close()


def test_tls_listener_requires_a_client_certificate(tls_dir) -> None:
    listener = listen("127.0.0.1", 0, mutual_tls(tls_dir, "a"))
    thread, errors = accept_failing(listener)
    without_cert = TransportOptions(timeout_s=10, tls_ca=tls_dir / "a.pem")
    with pytest.raises(TransportError):
        connect(*listener.address, without_cert).receive()  # TLS 1.3 may report it on first use
    thread.join()
    assert "TLS handshake" in str(errors[0])
    listener.close()


def test_an_idle_tls_client_holds_up_no_one(tls_dir, transfer) -> None:
    """The TLS handshake runs on a connection's first use, not in `accept`: a client that
    connects and says nothing delays neither the next accept nor the next client."""
    listener = listen("127.0.0.1", 0, mutual_tls(tls_dir, "a"))
    idle = socket.create_connection(listener.address)
    try:
        idle_side = listener.accept(5)  # handshaking here would wait 30 s, then fail
        with ThreadPoolExecutor(1) as pool:
            accepted = pool.submit(listener.accept, 5)
            client = connect(*listener.address, mutual_tls(tls_dir, "a"))
            server = accepted.result()
        assert transfer(client, server, Stop())[0] == Stop()
        for conn in (client, server, idle_side):
            conn.close()
    finally:
        idle.close()
        listener.close()


def test_a_failed_tls_handshake_is_one_line_in_the_shepherds_log(tls_dir) -> None:
    """A client that does not speak TLS costs the shepherd one warning, no traceback (the
    handshake used to fail in `accept`, logged with its whole stack)."""
    from types import SimpleNamespace

    from structlog.testing import capture_logs

    from pcp_core.shepherd.admission import Admission

    listener = listen("127.0.0.1", 0, mutual_tls(tls_dir, "a"))
    admission = Admission(SimpleNamespace(), listener, SharedSecret(b"secret"), None, {}, 1.0)  # type: ignore[arg-type]
    with capture_logs() as logs:
        admission.start()
        try:
            with socket.create_connection(listener.address) as raw:
                raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                raw.settimeout(10)
                with contextlib.suppress(OSError):
                    raw.recv(1)  # the shepherd closes it
            deadline = time.monotonic() + 10
            while not any(r["event"] == "join failed" for r in logs):
                assert time.monotonic() < deadline, logs
                time.sleep(0.05)
        finally:
            admission.closing.set()
            listener.close()
    failed = [r for r in logs if r["event"] == "join failed"]
    assert len(failed) == 1 and "TLS handshake" in failed[0]["error"], logs
    assert not any("exc_info" in r or r["log_level"] == "error" for r in logs), logs
