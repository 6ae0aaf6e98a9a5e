"""What stands in front of a node reached by ``E2B_DOMAIN``: a TLS terminator for ``api.<domain>`` and
``*.<domain>`` with a test CA's certificate (an Ingress with a wildcard certificate, in a cluster), reached
through an HTTP ``CONNECT`` proxy so that no name has to resolve (the client hands the proxy the host name, and
the proxy sends every one of the domain's names to the node, as wildcard DNS would), or on a port of its own
for clients that resolve the domain's names to it themselves (``direct_port``; e2b 1.x's data plane ignores
proxies: tests/e2b_sdk/wildcard_dns).

The Host header crosses untouched, as through an Ingress: the node routes by it. Run in a thread of the test
process; ``TlsFront(node_url, domain)`` as a context manager gives the proxy's URL and the CA's file.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
import threading
import urllib.parse
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def issue(directory: Path, domain: str) -> tuple[Path, Path, Path]:
    """A test CA, and a certificate it signs for ``api.<domain>`` and ``*.<domain>``: (CA, certificate, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("sandboxd test CA"))
        .issuer_name(_name("sandboxd test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"*.{domain}"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{domain}")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


class TlsFront:
    """The CONNECT proxy and TLS terminator in one: ``CONNECT <name>.<domain>:443`` is answered 200, TLS is
    terminated with the wildcard certificate, and the plain HTTP inside goes to the node as it came."""

    def __init__(self, node_url: str, domain: str, directory: Path) -> None:
        parsed = urllib.parse.urlsplit(node_url)
        self.backend = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.domain = domain
        self.ca, cert, key = issue(directory, domain)
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(cert, key)
        self.tunnels: list[str] = []  # the names clients asked for, in order
        # The same terminator for clients that resolve the domain's names here themselves (``direct_port``: a
        # resolver in the client maps them to it, as wildcard DNS would): the names they asked for by SNI.
        self.direct = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.direct.load_cert_chain(cert, key)
        self.direct.sni_callback = self._named
        self.direct_port = 0
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._direct_server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> TlsFront:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", 0), self.loop
        ).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._direct_server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._terminated, "127.0.0.1", 0, ssl=self.direct), self.loop
        ).result(10)
        self.direct_port = self._direct_server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _close(self) -> None:
        for server in (self._server, self._direct_server):
            if server is not None:
                server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            host, _, port = target.rpartition(":")
            if method != "CONNECT" or port != "443" or not (host == self.domain or host.endswith("." + self.domain)):
                writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                return
            self.tunnels.append(host)
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self.tls)
            up_reader, up_writer = await asyncio.open_connection(*self.backend)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _named(self, _sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        self.tunnels.append(name or "")

    async def _terminated(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A client of ``direct_port``: TLS already terminated; the plain HTTP inside goes to the node."""
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.backend)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, ssl.SSLError):
            with contextlib.suppress(Exception):
                writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
