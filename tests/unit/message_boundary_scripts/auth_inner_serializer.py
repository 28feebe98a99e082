"""Run as a script (a subprocess: setup_security() changes kombu for the whole process): sends
one drive message on an app signed with ``auth`` over the inner serializer argv[1] and prints
what the signed body holds."""

import base64
import datetime
import sys
import tempfile
from pathlib import Path

from celery import Celery
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from kombu import Connection

from celery_durable import Durable


def keys(folder: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "adv-r2")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (folder / "key.pem").write_bytes(pem)
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def main(inner: str) -> None:
    folder = Path(tempfile.mkdtemp())
    keys(folder)
    app = Celery("adv-r2-auth", broker="memory://", set_as_current=False)
    app.conf.update(
        durable_store_url="memory://",
        task_serializer="auth",
        accept_content=["auth"],
        security_key=str(folder / "key.pem"),
        security_certificate=str(folder / "cert.pem"),
        security_cert_store=str(folder / "cert.pem"),
        security_digest="sha256",
    )
    app.setup_security(serializer=inner)
    durable = Durable(app)
    durable.engine.dispatcher.send_drive("e1")
    with Connection("memory://") as conn:
        message = conn.SimpleQueue("celery").get(timeout=2)
        raw = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        print("content_type", message.content_type)
        inner_body = base64.b64decode(raw)
        print("pickle inside" if b"application/x-python-serialize" in inner_body else "no pickle inside")


if __name__ == "__main__":
    main(sys.argv[1])
