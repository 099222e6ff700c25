"""A development certificate authority and certificates (``llmfleet certs``, and the tests).

For production use your organisation's CA; these are for a local cluster and CI: an RSA-2048 CA and
leaf certificates valid for the given DNS names and IP addresses, usable as server and client
certificates (mutual TLS)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    cert: Path
    key: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(k: rsa.RSAPrivateKey) -> bytes:
    return k.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmfleet"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def make_ca(days: int = 365) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("llmfleet development CA"))
        .issuer_name(_name("llmfleet development CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_leaf(
    ca_key: rsa.RSAPrivateKey, ca: x509.Certificate, hosts: list[str], days: int = 365
) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    if not hosts:
        raise ValueError("hosts: give at least one DNS name or IP address")
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def write_dev_certs(out: Path, hosts: list[str], days: int = 365, name: str = "server") -> CertFiles:
    """``out/ca.pem``, ``out/{name}.pem`` and ``out/{name}-key.pem`` (a new CA unless ``ca.pem`` and
    ``ca-key.pem`` exist there, so more leaves can be signed by the same CA)."""
    out.mkdir(parents=True, exist_ok=True)
    ca_path, ca_key_path = out / "ca.pem", out / "ca-key.pem"
    if ca_path.exists() and ca_key_path.exists():
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        assert isinstance(ca_key, rsa.RSAPrivateKey)
    else:
        ca_key, ca = make_ca(days)
        _write(ca_key_path, _pem_key(ca_key), private=True)
        _write(ca_path, ca.public_bytes(serialization.Encoding.PEM))
    key, cert = make_leaf(ca_key, ca, hosts, days)
    return CertFiles(
        ca_path,
        _write(out / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM)),
        _write(out / f"{name}-key.pem", _pem_key(key), private=True),
    )
