"""``celery -A tests.apps.beat_mid_publish beat``: beat SIGTERMs itself in the middle of a publish.

Once ``$TEST_BEAT_ARM_AFTER`` messages went out, the next socket read of a Redis reply (the
``LPUSH`` of a beat entry) sends this process SIGTERM first: the signal handler then runs exactly
where a supervisor's SIGTERM lands about one time in seven on a busy beat.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import redis._parsers.socket as redis_socket
from kombu.transport import redis as kombu_redis

from celery_durable import Durable
from tests.apps._common import env_app

# the scans sent as tasks (durable_scans_in_beat=False): a beat that publishes all the time
app = env_app(
    "beat_mid_publish", durable_clock_interval=0.05, durable_recovery_interval=0.05, durable_scans_in_beat=False
)
durable = Durable(app)

_ARM_AFTER = int(os.environ.get("TEST_BEAT_ARM_AFTER", "3"))
_state = {"puts": 0, "fired": False}
_put = kombu_redis.Channel._put
_read = redis_socket.SocketBuffer._read_from_socket


def _counting_put(self: Any, *args: Any, **kwargs: Any) -> Any:
    _state["puts"] += 1
    return _put(self, *args, **kwargs)


class _SignallingSocket:
    """The socket, but its next ``recv`` first sends this process SIGTERM: the handler runs inside
    redis-py's ``try`` around ``recv``, as when the signal interrupts a blocking read."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def recv(self, size: int) -> bytes:
        os.kill(os.getpid(), signal.SIGTERM)
        return bytes(self._sock.recv(size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _read_then_signal(self: Any, *args: Any, **kwargs: Any) -> Any:
    if _state["puts"] >= _ARM_AFTER and not _state["fired"]:
        _state["fired"] = True
        sys.__stderr__.write("test: SIGTERM sent mid-publish\n")  # type: ignore[union-attr]
        sys.__stderr__.flush()  # type: ignore[union-attr]
        self._sock = _SignallingSocket(self._sock)
    return _read(self, *args, **kwargs)


kombu_redis.Channel._put = _counting_put  # type: ignore[method-assign]
redis_socket.SocketBuffer._read_from_socket = _read_then_signal  # type: ignore[method-assign]
