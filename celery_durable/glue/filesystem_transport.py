"""kombu's ``filesystem://`` transport with atomic writes.

Select it with ``broker_transport = "celery_durable.contrib.filesystem:Transport"``.

kombu 5.7's filesystem transport writes a message by opening its final ``*.msg`` name and then
writing, while a consumer moves and reads ``*.msg`` files without taking the writer's lock. A
consumer polling at that moment reads an empty file: ``json.JSONDecodeError`` escapes
``drain_events``, the worker process exits and the message is gone. The same holds for the
exchange table in ``control_folder``, created empty before it is filled.

Here a message is written under a name consumers ignore and renamed into place
(``os.replace`` is atomic on POSIX and Windows), and a missing exchange table is created
already holding ``[]``. Celery selects it with ``broker_transport`` while the URL stays
``filesystem://``.
"""

from __future__ import annotations

import os
import threading
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

__all__ = ["Channel", "Transport", "stop_waiting"]

#: set while a worker of this process stops (the pytest plugin's ``durable_worker``): a consumer
#: waiting for a message returns at once instead of after Celery's 2 s ``drain_events`` timeout
_STOPPING = threading.Event()


def stop_waiting(stopping: bool = True) -> None:
    """Let (``True``) or stop letting consumers of this process return from waiting at once."""
    if stopping:
        _STOPPING.set()
    else:
        _STOPPING.clear()


class Channel(filesystem.Channel):  # type: ignore[misc]
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # not "<queue>.msg": consumers skip it
        try:
            with open(partial, "wb") as fh:
                fh.write(str_to_bytes(dumps(payload)))  # type: ignore[no-untyped-call]
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        table = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        if not table.exists():
            self.control_folder.mkdir(parents=True, exist_ok=True)
            tmp = table.with_name(f".{table.name}.{uuid.uuid4().hex}.tmp")
            tmp.write_text("[]")
            try:
                os.link(tmp, table)  # create-if-absent, already valid JSON
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        super()._queue_bind(exchange, routing_key, pattern, queue)  # type: ignore[no-untyped-call]


class Transport(filesystem.Transport):  # type: ignore[misc]
    Channel = Channel

    @property
    def default_connection_params(self) -> dict[str, Any]:
        # no default hostname: a folder needs none, and kombu's 'localhost' default logs "No
        # hostname was supplied" at WARNING for every connection of a filesystem:// URL
        return {"port": self.default_port}

    def drain_events(self, connection: Any, timeout: Any = None, **kwargs: Any) -> Any:
        """kombu's loop (poll, then sleep ``polling_interval``), with a sleep that
        :func:`stop_waiting` cuts short: a stopping worker's loop sees its shutdown at once."""
        cycle: Any = self.cycle
        started = monotonic()
        interval = self.polling_interval
        if timeout and interval and interval > timeout:
            interval = timeout
        while True:
            try:
                cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                if _STOPPING.is_set() or (timeout is not None and monotonic() - started >= timeout):
                    raise TimeoutError() from None
                if interval is not None:
                    _STOPPING.wait(interval)
