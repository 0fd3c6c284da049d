"""The certificate that closes the local SeaweedFS's gRPC ports (seaweedfs.py) to everyone else.

weed guards gRPC with mutual TLS only: each of its servers asks every client for a certificate
signed by the configured CA, and its own clients present one. One self-signed certificate is
both here (weed's clients check the chain, not the name): made anew, with a new key, at each
start, readable by us alone, so nobody who cannot read the store's directory can speak to it.

The `cryptography` package makes it (extra `seaweedfs`): no `openssl` binary needed.
"""

from __future__ import annotations

import datetime
import ipaddress

# Longer than any run of `arkvory dev`; a new one comes with every start anyway.
VALIDITY = datetime.timedelta(days=365)
# Clock steps between us and weed (the same machine) must not make it "not yet valid".
BACKDATE = datetime.timedelta(hours=1)
COMMON_NAME = "arkvory-local-seaweedfs"


def available() -> bool:
    """Whether the `cryptography` package is there to make the certificate."""
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def new_grpc_identity() -> tuple[str, str]:
    """(certificate, private key) in PEM: a new key and a self-signed certificate for it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        # Its own CA (weed's `grpc.ca`), and the leaf every server and client presents.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()
