"""A cluster CA and its members' certificates, made with the `openssl` command.

What flows: a directory and member names in; out, `ca.pem`/`ca.key` (the cluster CA) and
`<member>.pem`/`<member>.key` per member, each certificate signed by the CA for both TLS
roles (an agent accepts connections and makes them). `surge node certs` calls this; the
files are what `--tls-cert/--tls-key/--tls-ca` take (`runtime/security/tls.py`). Keys are written
readable by their owner only. Owned by the runtime; the openssl CLI does the cryptography
(no Python dependency for it).
"""

import os
import shutil
import subprocess
from pathlib import Path

from surge.errors import SurgeError

CURVE = "prime256v1"
"""P-256 keys: small, fast handshakes, accepted everywhere."""


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise SurgeError("making certificates needs the openssl command: install openssl")
    out = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["failed"])[-1]
        raise SurgeError(f"openssl {args[0]} failed: {last}")


def _key_args(key: str) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", f"ec_paramgen_curve:{CURVE}", "-nodes", "-keyout", key]


def make_ca(out_dir: Path, days: int = 365) -> tuple[Path, Path]:
    """A new cluster CA in `out_dir`: (ca.pem, ca.key)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", *_key_args("ca.key"), "-out", "ca.pem", "-days", str(days),
        "-subj", "/CN=surge cluster CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=out_dir,
    )  # fmt: skip
    os.chmod(out_dir / "ca.key", 0o600)
    return out_dir / "ca.pem", out_dir / "ca.key"


def make_member(out_dir: Path, name: str, days: int = 365) -> tuple[Path, Path]:
    """A certificate and key for member `name`, signed by the CA in `out_dir`:
    (<name>.pem, <name>.key)."""
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise SurgeError(f"a member name is letters, digits, '-', '_' or '.' (got {name!r})")
    if not (out_dir / "ca.pem").is_file() or not (out_dir / "ca.key").is_file():
        raise SurgeError(f"{out_dir} holds no cluster CA (ca.pem, ca.key): make one first")
    ext = out_dir / f"{name}.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        f"subjectAltName=DNS:{name}\n"
    )
    try:
        _openssl("req", "-new", *_key_args(f"{name}.key"), "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=out_dir)  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", str(days), "-extfile", ext.name,
            cwd=out_dir,
        )  # fmt: skip
    finally:
        ext.unlink(missing_ok=True)
        (out_dir / f"{name}.csr").unlink(missing_ok=True)
    os.chmod(out_dir / f"{name}.key", 0o600)
    return out_dir / f"{name}.pem", out_dir / f"{name}.key"
