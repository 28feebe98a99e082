"""Celery's message signing (``app.setup_security()``, the ``auth`` serializer) with real
``celery worker`` processes: every message of the library (the drive, an activity and its retry, a
durable timer, an effect and its retry; eagerly run activities too) is signed, so a worker that
accepts only ``auth`` runs a workflow to its end (before, they were sent as JSON and refused).

The key and the self-signed certificate are made here (``cryptography``); the client runs in a
subprocess too, since ``setup_security()`` changes kombu's serializers for its whole process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.eager_logs import eager_steps
from tests.plugins.workers import REPO, WorkerFactory, broker_url, wait_until

pytestmark = pytest.mark.worker

x509 = pytest.importorskip("cryptography.x509")

CLIENT = """
import json, sys
from tests.apps.signed import flow
h = flow.start(sys.argv[1], 4, _workflow_id=sys.argv[1])
print(json.dumps({"id": h.id, "result": h.result(timeout=90)}))
"""


def _keys(folder: Path) -> None:
    """A throwaway RSA key and its self-signed certificate: ``key.pem``, ``cert.pem``."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "celery-durable-test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    pem = serialization.PrivateFormat.TraditionalOpenSSL
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, pem, serialization.NoEncryption()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@pytest.mark.parametrize("eager", [0, 5], ids=["delivered", "eager"])
def test_a_workflow_runs_with_signed_messages_only(tmp_path: Path, worker_factory: WorkerFactory, eager: int) -> None:
    keys = tmp_path / "keys"
    _keys(keys)
    url, opts = broker_url("redis", tmp_path)
    marks = tmp_path / "marks"
    worker_factory.env.update(
        TEST_BROKER_URL=url,
        TEST_BROKER_OPTIONS=json.dumps(opts),
        TEST_QUEUE=f"q-{uuid.uuid4().hex[:10]}",
        DURABLE_STORE_URL=f"sqlite:///{tmp_path / 'durable.db'}",
        TEST_SECURITY_DIR=str(keys),
        TEST_MARKS_DIR=str(marks),
        TEST_EAGER_ACTIVITIES=str(eager),
    )
    worker = worker_factory.start(app="tests.apps.signed", pool="solo", concurrency=1)
    wid = f"signed-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ) | worker_factory.env
    client = subprocess.run(
        [sys.executable, "-c", CLIENT, wid], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    log = worker.log()
    assert "ContentDisallowed" not in log and "Refusing to deserialize" not in log, log[-4000:]
    assert client.returncode == 0, f"{client.stderr[-3000:]}\nworker log:\n{log[-4000:]}"
    assert json.loads(client.stdout.strip().splitlines()[-1]) == {"id": wid, "result": 51}
    assert len((marks / f"flaky-{wid}").read_text().splitlines()) == 2  # the retry was delivered

    def noted() -> bool:
        return (marks / f"note-{wid}").exists()

    wait_until(noted, timeout=60, what="the effect's second attempt")
    if eager:
        assert eager_steps(worker, wid), "no activity ran eagerly"
