"""TLS between the controller and its agents, and between agents: settings and contexts.

What flows: `TlsConfig` (three PEM file paths: this process's certificate, its key, the
cluster's CA) in, a `ClusterTls` (one server and one client `ssl.SSLContext`) out; the
transport (`runtime/transport.py`) wraps a connection in it before any frame is sent, so the
cluster token's proof and every frame after it travel encrypted. Both ends present a
certificate (mutual TLS) and accept only certificates the cluster CA signed: the CA is the
cluster's own, so any certificate it signed is a member of the cluster; host names are
therefore not checked (agents of a StatefulSet or a Ray cluster are reached by addresses
that are rarely in a certificate). Owned by the runtime; the agent CLI, the launchers and
the controller hand a `TlsConfig` down.
"""

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from surge.errors import SurgeError


@dataclass(frozen=True)
class TlsConfig:
    """PEM files of one member of a cluster (the controller or an agent)."""

    cert_path: Path
    """This process's certificate (signed by the cluster CA)."""
    key_path: Path
    """Its private key (unencrypted PEM)."""
    ca_path: Path
    """The cluster CA's certificate: peers must present a certificate it signed."""

    @classmethod
    def from_options(
        cls, cert: Path | str | None, key: Path | str | None, ca: Path | str | None
    ) -> "TlsConfig | None":
        """The setting from `--tls-cert/--tls-key/--tls-ca` (or a config file's `tls_*`):
        None when none is given; all three or an error naming the missing ones."""
        given = {"--tls-cert": cert, "--tls-key": key, "--tls-ca": ca}
        if all(v is None for v in given.values()):
            return None
        missing = [flag for flag, v in given.items() if v is None]
        if missing:
            names = ", ".join(missing)
            raise SurgeError(f"TLS needs --tls-cert, --tls-key and --tls-ca; missing {names}")
        assert cert is not None and key is not None and ca is not None
        return cls(Path(cert), Path(key), Path(ca))

    def load(self) -> "ClusterTls":
        """Both contexts; a missing, unreadable or invalid file is one `SurgeError` naming it."""
        for flag, path in (
            ("--tls-cert", self.cert_path),
            ("--tls-key", self.key_path),
            ("--tls-ca", self.ca_path),
        ):
            if not path.is_file():
                raise SurgeError(f"{flag} {path} does not exist; give a PEM file")
            try:
                path.open("rb").close()
            except OSError as e:
                raise SurgeError(f"{flag} {path} cannot be read ({e.strerror})") from None
        return ClusterTls(
            server=self._context(ssl.Purpose.CLIENT_AUTH),
            client=self._context(ssl.Purpose.SERVER_AUTH),
        )

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        side = (
            ssl.PROTOCOL_TLS_SERVER
            if purpose is ssl.Purpose.CLIENT_AUTH
            else ssl.PROTOCOL_TLS_CLIENT
        )
        ctx = ssl.SSLContext(side)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False  # the cluster CA vouches for membership (module docstring)
        ctx.verify_mode = ssl.CERT_REQUIRED  # both ends: mutual TLS
        try:
            ctx.load_cert_chain(self.cert_path, self.key_path)
        except (ssl.SSLError, ValueError) as e:
            raise SurgeError(
                f"--tls-cert {self.cert_path} / --tls-key {self.key_path} are not a PEM "
                f"certificate and its key: {e}"
            ) from None
        try:
            ctx.load_verify_locations(cafile=self.ca_path)
        except (ssl.SSLError, ValueError) as e:
            raise SurgeError(f"--tls-ca {self.ca_path} is not a PEM CA certificate: {e}") from None
        return ctx

    def argv(self) -> list[str]:
        """The `surge node run` flags that give an agent these files."""
        return [
            "--tls-cert",
            str(self.cert_path),
            "--tls-key",
            str(self.key_path),
            "--tls-ca",
            str(self.ca_path),
        ]


@dataclass(frozen=True)
class ClusterTls:
    """The two sides of one member's TLS: accepting connections and making them."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plain_allowed(host: str, tls: TlsConfig | None, allow_plain: bool, fix: str) -> None:
    """Frames in clear only on loopback or when asked for: an agent listening on `host`
    without TLS is one `SurgeError` unless `allow_plain` (`fix` names the setting that
    allows it)."""
    if tls is None and not allow_plain and not is_loopback(host):
        raise SurgeError(
            f"{host} is not loopback and TLS is off: frames (model bytes, prompts) would "
            f"cross the network in clear; give --tls-cert/--tls-key/--tls-ca (`surge node "
            f"certs` makes them), or {fix} to allow it"
        )
