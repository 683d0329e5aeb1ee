"""Fixtures: connected pairs on 127.0.0.1, a threaded send/receive, TLS certificates."""

import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pcp_capnp_tcp import connect, listen

from pcp_core.wire.messages import Message
from pcp_core.wire.transport import Connection, Listener, TensorSink, TransportOptions

Pair = tuple[Listener, Connection, Connection]  # listener, server side, client side


@pytest.fixture
def open_pair() -> Iterator[Callable[..., Pair]]:
    """Opens a listener and one connection to it; closes everything at the end."""
    opened: list[Listener | Connection] = []

    def make(
        server: TransportOptions | None = None, client: TransportOptions | None = None
    ) -> Pair:
        listener = listen("127.0.0.1", 0, server or TransportOptions(timeout_s=10))
        opened.append(listener)
        with ThreadPoolExecutor(1) as pool:  # both sides take part in a TLS handshake
            accepted = pool.submit(listener.accept, 10)
            client_side = connect(*listener.address, client or TransportOptions(timeout_s=10))
            opened.append(client_side)
            server_side = accepted.result()
        opened.append(server_side)
        return listener, server_side, client_side

    yield make
    for thing in reversed(opened):
        thing.close()


def transfer(
    sender: Connection, receiver: Connection, message: Message, sink: TensorSink | None = None
) -> tuple[Message, int]:
    """Sends in a thread while receiving here (big frames do not fit in socket buffers)."""
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(sender.send, message)
        received = receiver.receive(sink)
        return received, sending.result()


@pytest.fixture(name="transfer")
def transfer_fixture() -> Callable[..., tuple[Message, int]]:
    return transfer


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two self-signed certificates for localhost/127.0.0.1: `a.pem`/`a.key`, `b.pem`/`b.key`."""
    folder = tmp_path_factory.mktemp("tls")
    for name in ("a", "b"):
        _self_signed(folder / f"{name}.pem", folder / f"{name}.key")
    return folder


def _self_signed(cert: Path, key: Path) -> None:
    try:
        _self_signed_with_cryptography(cert, key)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl CLI is available")
        command = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1"
        san = "subjectAltName=DNS:localhost,IP:127.0.0.1"
        files = ["-keyout", str(key), "-out", str(cert)]
        subprocess.run(
            [*command.split(), "-subj", "/CN=localhost", "-addext", san, *files],
            check=True,
            capture_output=True,
        )


def _self_signed_with_cryptography(cert: Path, key: Path) -> None:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
