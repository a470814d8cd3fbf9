"""A private certificate authority and the certificates it signs, for the secured local broker.

Generated once into the deployment's state folder (never into the source tree):
``ca.pem`` is what clients trust (``kafka.ssl_cafile``), ``broker.pem`` holds the
broker's private key and certificate chain in the PEM layout Kafka reads with
``ssl.keystore.type=PEM``. Keys are written unencrypted but readable only by the
owner (0600): the folder is the secret, as with any local key store.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_DAYS = 825  # the longest lifetime mainstream TLS stacks accept for a leaf certificate
_LOCAL_NAMES = ("localhost",)
_LOCAL_ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class Issued:
    """A private key and the certificate for it, in PEM."""

    key_pem: bytes
    cert_pem: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "specstream local"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8 is the only private-key layout Kafka's PEM key store reads.
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=_VALID_DAYS)))


def new_ca(common_name: str = "specstream local CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(_name(common_name), _name(common_name), key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def issue(ca: Issued, common_name: str, *, server: bool) -> Issued:
    """A leaf certificate signed by ``ca``: for a server (valid for localhost, 127.0.0.1, ::1) or a client."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (_builder(_name(common_name), ca_cert.subject, key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if server:
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in _LOCAL_NAMES]
        names += [x509.IPAddress(ipaddress.ip_address(address)) for address in _LOCAL_ADDRESSES]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read (created so, never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
