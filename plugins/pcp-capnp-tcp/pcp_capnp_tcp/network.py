"""Listening and connecting over TCP, optionally TLS, with TCP_NODELAY on.

On both sides the TLS handshake runs on a connection's first send or receive, in the
thread that uses it: a client that never finishes its handshake holds up only its own
connection, never `accept`. A failed handshake is a TransportError there.

TLS is on for a listener when options.tls_cert and tls_key are set; it then also
requires client certificates signed by options.tls_ca if that is set. A connecting
side uses TLS when options.tls_ca is set, verifies the listener against it (host
name included), and presents tls_cert/tls_key if those are set too.
"""

import functools
import socket
import ssl
import time
from collections.abc import Callable

import structlog

from pcp_capnp_tcp.connection import CapnpConnection
from pcp_core.wire.transport import TransportError, TransportOptions

log = structlog.get_logger(__name__)

CONNECT_RETRY_S = 10.0  # the shepherd may still be starting when a worker connects
HANDSHAKE_TIMEOUT_S = 30.0  # so a silent client cannot hold up `accept` when no timeout is set


class TcpListener:
    """A `pcp_core.wire.transport.Listener` on a bound TCP socket."""

    def __init__(
        self, sock: socket.socket, options: TransportOptions, tls: ssl.SSLContext | None
    ) -> None:
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self._sock = sock
        self._options = options
        self._tls = tls

    def accept(self, timeout_s: float | None = None) -> CapnpConnection:
        """The next connection; TimeoutError if none came in time.

        With TLS on, the connection's TLS handshake runs on its first send or receive (a
        failed one is a TransportError there), so one slow client cannot delay the next.
        """
        self._sock.settimeout(timeout_s)
        try:
            sock, address = self._sock.accept()
        except TimeoutError:
            raise TimeoutError(f"no connection to {self.address} within {timeout_s} s") from None
        peer = _peer_name(address)
        handshake = None
        if self._tls is not None:
            handshake = functools.partial(_handshake, self._tls, peer=peer, server_side=True)
        log.debug("accepted", peer=peer, tls=self._tls is not None)
        return _connection(sock, peer, self._options, handshake)

    def close(self) -> None:
        self._sock.close()


def listen(host: str, port: int, options: TransportOptions) -> TcpListener:
    """Listen on host:port (port 0 picks a free one, see `.address`)."""
    tls = _server_context(options)  # configuration errors surface before binding
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return TcpListener(socket.create_server((host, port), family=family), options, tls)


def connect(
    host: str, port: int, options: TransportOptions, retry_s: float = CONNECT_RETRY_S
) -> CapnpConnection:
    """Connect to a listener, retrying refused connections for up to `retry_s` seconds."""
    tls = _client_context(options)  # configuration errors surface before any waiting
    deadline = time.monotonic() + retry_s
    delay = 0.05
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=options.timeout_s)
            break
        except ConnectionRefusedError as error:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransportError(
                    f"could not connect to {host}:{port} within {retry_s} s: {error}"
                ) from error
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, 1.0)
        except OSError as error:
            raise TransportError(f"could not connect to {host}:{port}: {error}") from error
    peer = _peer_name((host, port))
    handshake = None
    if tls is not None:
        handshake = functools.partial(
            _handshake, tls, peer=peer, server_side=False, server_hostname=host
        )
    log.debug("connected", peer=peer, tls=tls is not None)
    return _connection(sock, peer, options, handshake)


def _connection(
    sock: socket.socket,
    peer: str,
    options: TransportOptions,
    handshake: Callable[[socket.socket], socket.socket] | None,
) -> CapnpConnection:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(options.timeout_s)
    return CapnpConnection(sock, peer, options, handshake)


def _handshake(
    context: ssl.SSLContext,
    sock: socket.socket,
    *,
    peer: str,
    server_side: bool,
    server_hostname: str | None = None,
) -> ssl.SSLSocket:
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        return context.wrap_socket(sock, server_side=server_side, server_hostname=server_hostname)
    except OSError as error:  # ssl.SSLError, a timeout or a reset
        sock.close()
        raise TransportError(f"TLS handshake with {peer} failed: {error}") from error


def _server_context(options: TransportOptions) -> ssl.SSLContext | None:
    if options.tls_cert is None and options.tls_key is None:
        return None
    if options.tls_cert is None or options.tls_key is None:
        raise ValueError("TLS needs both tls_cert and tls_key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(options.tls_cert, options.tls_key)
    if options.tls_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=options.tls_ca)
    return context


def _client_context(options: TransportOptions) -> ssl.SSLContext | None:
    if options.tls_ca is None:
        if options.tls_cert is not None:
            raise ValueError("a TLS client needs tls_ca to verify the listener")
        return None
    context = ssl.create_default_context(cafile=options.tls_ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if options.tls_cert is not None:
        context.load_cert_chain(options.tls_cert, options.tls_key)
    return context


def _peer_name(address: tuple) -> str:
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
