"""Azure Cosmos DB (NoSQL API) backend: one container, partition key path ``/pk``.

URL::

    cosmos://ACCOUNT.documents.azure.com/?database=DB&container=C
    cosmos://127.0.0.1:8081/?database=DB&container=C&verify=false     (emulator / test server)

The key comes from the ``key=`` option, else the ``DURABLE_COSMOS_KEY`` environment variable,
else ``key=`` in the URL (accepted, but redacted from ``repr``); an Azure AD credential can be
passed as ``credential=``. The key is never logged nor put in an error message. Other query
parameters / keyword options: ``verify`` (TLS verification, default true; ``false`` also silences
urllib3's warning for that host), ``create`` (create database and container if missing, default
true), ``discovery`` (endpoint discovery for multi-region accounts, default true),
``consistency`` (e.g. ``Session``), ``deadline`` (s, default 10: the absolute time one store call
may take, the SDK's and our retries included; keep it below a third of ``durable_lease_ttl``),
``timeout`` / ``read_timeout`` (connect / socket read timeout of one HTTP attempt, s; both capped
by what is left of the deadline), ``retries`` (our retries of transient failures, default 3),
``throttle_retries`` / ``throttle_max_wait`` (the SDK's 429 retries, honouring
``x-ms-retry-after-ms``; defaults 9 and 20 s, the wait capped by the deadline), ``due_bucket`` (s,
default 60) and ``due_shards`` (default 4; both the same in every process), ``throughput`` /
``autoscale_max`` (RU/s of a container the store creates; see ``provision.py``).

**Provisioning.** ``create=true`` creates the container with the recommended indexing policy
(:data:`~.provision.INDEXING_POLICY`); in production create it with
``docs/azure/cosmos.bicep`` and use ``create=false``. Either way the container is checked on first
use (partition key ``/pk`` version 2, the indexes the store's queries need): a mismatch is a
:class:`ConfigurationError` saying what to change.

**Documents.** The partition key path is ``/pk`` (works on real Cosmos and on the test server;
``/_partitionKey`` is special-cased by both). Ids outside ``[A-Za-z0-9_.:@=+,;!$()*-]`` (Cosmos
forbids ``/ \\ ? #``) are stored as ``~`` + base64url with the caller's id kept in ``_oid``;
callers always see their own id. Our etag is the server's etag plus, for due documents, the
reference of the index entry covering that version (see below); treat it as opaque.

**Errors.** SDK errors are translated here: 409/412 → :class:`ConflictError` (create answers
``None`` on 409), 413 → :class:`DocumentTooLarge`, 429 after the SDK's retries →
:class:`Throttled`, 401/403 → :class:`ConfigurationError`, 408/449/5xx and connection failures →
:class:`StoreUnavailable`. Transient failures are retried (bounded, exponential) only where a
retry cannot double-apply: reads, queries and idempotent writes always; ``create``, etag
replaces, deletes and batches only when the request provably did not run (connection refused,
503, 449). The SDK's connection retries are turned off so outages surface quickly.

**Due index** (:meth:`CosmosStore.scan_due`). A cross-partition query over every document would
cost in proportion to history, so due documents are indexed by small *entry* documents in per-kind
time-bucket partitions ``_due:{kind}:{floor(at/60)}:{shard}`` (``_due:{kind}:late:{shard}`` when
already overdue at write time; the shard is a hash of the document's partition key, so one busy
minute is spread over ``due_shards`` logical partitions, each capped at 10,000 RU/s by Azure). A
write of a due document first upserts its entry, then writes the document recording the entry as
``_dx``; an etag replace may instead keep its predecessor's entry when that is of the same kind, no
later than the new due time and still in the future (``DueIndex.trusted``), so heartbeats pushing a
lease forward cost no extra write; and a document created in a batch may take the entry another op
of that batch lets go of (``DueIndex.handoffs``: a step commit settles one marker and creates the
next, which writes no entry). An entry is relied on by one document at a time: its target, or the
one it was handed to last, which a scan looks up (one single-partition query) when the target does
not rely on it. A scan reads the ``late`` partition and the buckets (each with
one query naming its shards) from a per-kind low-water mark (doc ``_due:{kind}``/``lwm``, cached
in-process) up to ``now``, point-reads the entries' documents (a few in parallel), reports the due
ones, keeps entries a not-yet-due document still relies on and deletes the others with an etag
condition (``DueIndex.verdict``: an entry is only garbage once its document was written after it,
or after two minutes, so a writer's in-flight entry is never taken). Entries due but unhandled for
ten minutes move to ``late`` so the mark can pass old buckets; the mark lags the clock by two
minutes (clock skew, write latency). Runs of empty buckets (long downtime, a fresh scanner) are
skipped with one cross-partition query over entries only. A scan thus costs a few queries plus one
read per due or stale entry, whatever the history.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.cosmos import ContainerProxy, CosmosClient, PartitionKey
from azure.cosmos import exceptions as cx

from celery_durable.errors import ConfigurationError, ConflictError, DocumentTooLarge, DurableError, StoreUnavailable
from celery_durable.stores.base import Doc, Op, PartitionRead, Store, doc_size, encode_doc
from celery_durable.stores.cosmos.config import CallDeadline, DeadlineExceeded, Secret, end_sdk_threads, parse_url
from celery_durable.stores.cosmos.due import CosmosDueScan
from celery_durable.stores.cosmos.errors import NOT_APPLIED, TRANSIENT, sdk_race, translate
from celery_durable.stores.cosmos.index import (
    DUE_REF,
    LET_GO,
    MAX_ID_LENGTH,
    ORIGINAL_ID,
    SYSTEM_KEYS,
    DueIndex,
    encode_id,
    make_etag,
    split_etag,
)
from celery_durable.stores.cosmos.listing import CosmosListing
from celery_durable.stores.cosmos.provision import (
    INDEXING_POLICY,
    PARTITION_KEY_PATH,
    check_container,
    throughput_option,
)
from celery_durable.stores.cosmos.read import CosmosReads
from celery_durable.stores.cosmos.search import CosmosSearch
from celery_durable.stores.cosmos.session import CosmosSessions, SessionTokens

__all__ = ["CosmosStore", "from_url"]

T = TypeVar("T")

_PAGE = 1000  # items per page when a query has to page


class CosmosStore(CosmosSessions, CosmosReads, CosmosListing, CosmosSearch, CosmosDueScan, Store):
    """The storage contract on one Cosmos DB container (see the module docstring)."""

    #: a transactional batch never spans partitions: no Store.batch_with
    cross_partition = False

    def __init__(
        self,
        endpoint: str,
        database: str,
        container: str,
        *,
        key: str | None = None,
        credential: Any = None,
        verify: bool = True,
        create: bool = True,
        discovery: bool = True,
        consistency: str | None = None,
        timeout: float = 10.0,
        read_timeout: float | None = None,
        deadline: float = 10.0,
        retries: int = 3,
        throttle_retries: int = 9,
        throttle_max_wait: int = 20,
        due_bucket: float = 60.0,
        due_shards: int = 4,
        throughput: int | None = None,
        autoscale_max: int | None = None,
    ) -> None:
        if key is None and credential is None:
            raise ConfigurationError(
                "cosmos store needs a key (option key=, env DURABLE_COSMOS_KEY, or key= in the URL) or credential="
            )
        self.endpoint, self.database, self.container = endpoint, database, container
        self._secret = Secret(key) if key is not None else None
        self._credential = credential
        self._verify, self._create, self._discovery = verify, create, discovery
        self._consistency, self._timeout = consistency, timeout
        self.deadline = CallDeadline(deadline)
        self._read_timeout = deadline if read_timeout is None else read_timeout
        # the SDK sleeps between 429 retries: never longer in all than the deadline allows
        wait = max(1, min(throttle_max_wait, math.ceil(deadline)))
        self._retries, self._throttle = max(0, retries), (max(1, throttle_retries), wait)
        self._offer = throughput_option(throughput, autoscale_max)
        if isinstance(due_shards, bool) or not 1 <= due_shards <= 64:
            raise ConfigurationError(f"cosmos due_shards must be from 1 to 64, got {due_shards!r}")
        self.index = DueIndex(bucket=due_bucket, shards=due_shards)
        self._lock = threading.Lock()
        self._client: CosmosClient | None = None
        self._proxy: ContainerProxy | None = None
        self._pool: ThreadPoolExecutor | None = None  # parallel reads of scan_due
        self._lwm: dict[str, int] = {}
        self._sessions = SessionTokens()  # newest session token per partition (session.py)
        if not verify:
            # the user asked for no verification of this host: do not warn on every request
            host = re.escape(urlsplit(endpoint).hostname or "")
            warnings.filterwarnings("ignore", message=f"Unverified HTTPS request is being made to host '{host}'")

    def __repr__(self) -> str:
        return f"CosmosStore(endpoint={self.endpoint!r}, database={self.database!r}, container={self.container!r})"

    # --- connection ----------------------------------------------------------------------------

    def _container(self) -> ContainerProxy:
        proxy = self._proxy
        if proxy is not None:
            return proxy
        with self._lock:
            if self._proxy is None:
                self._proxy = self._call("connect", self._connect, idempotent=True)
            return self._proxy

    def _connect(self) -> ContainerProxy:
        client = self._new_client()
        try:
            proxy = self._open_container(client)
        except BaseException:
            client.close()
            raise
        self._client = client
        return proxy

    def _new_client(self) -> CosmosClient:
        """A client of the account as configured (the container is neither opened nor checked)."""
        throttle_retries, throttle_wait = self._throttle
        kwargs: dict[str, Any] = {
            "connection_verify": self._verify,
            "enable_endpoint_discovery": self._discovery,
            "retry_throttle_total": throttle_retries,
            "retry_throttle_backoff_max": throttle_wait,
            "retry_connect": 0,  # we retry connection failures ourselves, briefly
            "retry_read": 0,
            "connection_timeout": self._timeout,
            "read_timeout": self._read_timeout,
            "raw_request_hook": self.deadline.hook,  # caps every HTTP attempt by the call's deadline
            "user_agent_suffix": "celery-durable",
        }
        if self._consistency:
            kwargs["consistency_level"] = self._consistency
        credential = self._secret.get() if self._secret is not None else self._credential
        return CosmosClient(self.endpoint, credential=credential, **kwargs)

    def _open_container(self, client: CosmosClient) -> ContainerProxy:
        proxy = client.get_database_client(self.database).get_container_client(self.container)
        try:
            props = proxy.read()
        except cx.CosmosResourceNotFoundError as exc:
            if not self._create:
                raise ConfigurationError(
                    f"cosmos container {self.database!r}/{self.container!r} does not exist (and create=false)"
                ) from exc
            # concurrent first users race to create: the losers' 409 is fine
            with contextlib.suppress(cx.CosmosResourceExistsError):
                client.create_database(self.database)
            with contextlib.suppress(cx.CosmosResourceExistsError):
                client.get_database_client(self.database).create_container(
                    self.container,
                    partition_key=PartitionKey(path=PARTITION_KEY_PATH, version=2),
                    indexing_policy=INDEXING_POLICY,
                    offer_throughput=self._offer,
                )
            props = proxy.read()
        check_container(props, self.container)
        return proxy

    @property
    def last_request_charge(self) -> float | None:
        """Request units of this client's latest call (for tracing; approximate under threads)."""
        with contextlib.suppress(Exception):  # observability must never break a store call
            return float(self._container().client_connection.last_response_headers.get("x-ms-request-charge") or 0)
        return None

    def reopen(self) -> None:
        # after fork(): forget the inherited client (its sockets are the parent's; the SDK's and our
        # threads did not survive) without closing anything; the lock may have been held mid-fork
        self._lock = threading.Lock()
        self._sessions.after_fork()
        self._client, self._proxy, self._pool = None, None, None

    def close(self) -> None:
        with self._lock:
            client, pool, self._client, self._proxy, self._pool = self._client, self._pool, None, None, None
        if pool is not None:
            pool.shutdown(wait=False)
        if client is not None:
            with contextlib.suppress(Exception):  # no SDK thread left running: safe to fork after close
                end_sdk_threads(client, min(self.deadline.seconds, 5.0))
            with contextlib.suppress(Exception):
                client.close()

    # --- error translation and retries ----------------------------------------------------

    def _scrub(self, text: str) -> str:
        return self._secret.scrub(text) if self._secret is not None else text

    def _call(self, what: str, fn: Callable[[], T], *, idempotent: bool, doc: Doc | None = None) -> T:
        # connecting takes a few requests (account, container, maybe creating it), once per process
        with self.deadline.running(self.deadline.seconds * 3 if what == "connect" else None):
            return self._attempts(what, fn, idempotent=idempotent, doc=doc)

    def _attempts(self, what: str, fn: Callable[[], T], *, idempotent: bool, doc: Doc | None) -> T:
        attempt = 0
        while True:
            try:
                return fn()
            except DurableError:
                raise
            except Exception as exc:
                left = self.deadline.left() or 0.0
                if isinstance(exc, DeadlineExceeded) or left <= 0.01:
                    raise StoreUnavailable(
                        f"cosmos {what}: no answer within its deadline ({self.deadline.seconds:g} s a call)"
                        f" ({type(exc).__name__})"
                    ) from exc
                status = getattr(exc, "status_code", None)
                retry = (
                    status in NOT_APPLIED
                    or (idempotent and status in TRANSIENT)
                    or (status is None and isinstance(exc, ServiceRequestError))
                    or (status is None and idempotent and isinstance(exc, ServiceResponseError))
                    or (idempotent and sdk_race(exc))
                )
                if retry and attempt < self._retries:
                    time.sleep(min(2.0, 0.05 * 2**attempt, left / 2))
                    attempt += 1
                    continue
                raise self._translate(exc, what, doc) from exc

    def _translate(self, exc: Exception, what: str, doc: Doc | None) -> Exception:
        return translate(exc, what, doc, self._scrub, self.max_doc_bytes)

    # --- document mapping --------------------------------------------------------------------

    @staticmethod
    def _cosmos_id(doc_id: str) -> str:
        cid = encode_id(doc_id)
        if len(cid) > MAX_ID_LENGTH:
            raise ConfigurationError(f"id {doc_id[:80]!r}... is too long for Cosmos DB")
        return cid

    def _prepare(self, doc: Doc, base_etag: str | None, handed: list[Any] | None = None) -> tuple[Doc, list[Doc]]:
        """The body to send for ``doc`` and the index entries (due, search) to upsert first
        (``handed``: the due entry another op of its batch lets go of, for it to rely on)."""
        body, entries = self._prepare_due(doc, base_etag, handed)
        return body, entries + self._search_entries(doc, base_etag)

    def _prepare_due(self, doc: Doc, base_etag: str | None, handed: list[Any] | None) -> tuple[Doc, list[Doc]]:
        encode_doc(doc, self.max_doc_bytes)
        body = {k: v for k, v in doc.items() if k not in SYSTEM_KEYS}
        cid = self._cosmos_id(doc["id"])
        if cid != doc["id"]:
            body["id"], body[ORIGINAL_ID] = cid, doc["id"]
        prev = split_etag(base_etag)[1] if base_etag is not None else None
        ref, entry = self.index.cover(doc, prev, handed, time.time())
        if ref is None:  # not due
            if prev is not None:  # lets go of its entry: the scanner then knows this version is newer
                body[LET_GO] = prev
            return body, []
        body[DUE_REF] = ref
        return body, [] if entry is None else [entry]

    def _write_entries(self, entries: list[Doc]) -> None:
        for entry in entries:
            self._upsert_internal(entry)

    def _upsert_internal(self, doc: Doc) -> None:
        c = self._container()
        self._call(f"index {doc['pk']!r}", lambda: c.upsert_item(doc), idempotent=True)

    def _read_raw(self, pk: str, doc_id: str) -> Doc | None:
        c, cid = self._container(), self._cosmos_id(doc_id)

        def op() -> Doc | None:
            try:
                return dict(c.read_item(cid, partition_key=pk, **self._session_read(pk)))
            except cx.CosmosResourceNotFoundError:
                return None

        return self._call(f"read {pk!r}/{doc_id!r}", op, idempotent=True)

    def _query(self, what: str, sql: str, params: dict[str, Any], pk: str | None) -> Iterator[Doc]:
        for page in self._pages(what, sql, params, pk):
            yield from page

    def _pages(
        self, what: str, sql: str, params: dict[str, Any], pk: str | None, size: int = _PAGE
    ) -> Iterator[list[Any]]:
        """Lazily fetched result pages (a single-partition query when ``pk`` is given)."""
        c = self._container()
        parameters = [{"name": n, "value": v} for n, v in params.items()]
        scope: dict[str, Any] = {"partition_key": pk} if pk is not None else {"enable_cross_partition_query": True}
        scope.update(self._session_read(pk))
        pages = c.query_items(sql, parameters=parameters, max_item_count=size, **scope).by_page()
        end = object()

        def fetch() -> Any:
            page = next(pages, end)
            return end if page is end else [dict(i) if isinstance(i, dict) else i for i in cast(Iterator[Any], page)]

        while (page := self._call(what, fetch, idempotent=True)) is not end:
            yield page

    def _read_many(self, refs: list[tuple[str, str]], into: dict[tuple[str, str], Doc | None]) -> None:
        """Raw documents by ``(pk, id)`` into ``into`` (``None`` when missing).

        Point reads (1 RU each, the cheapest read in Cosmos), a few in parallel. (ReadMany would
        turn into one query per physical partition, which the test server runs over every item.)
        """
        refs = [r for r in dict.fromkeys(refs) if r not in into]
        if len(refs) <= 1:
            into.update({r: self._read_raw(*r) for r in refs})
            return
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="durable-cosmos-scan")
            pool = self._pool
        into.update(zip(refs, pool.map(lambda r: self._read_raw(*r), refs), strict=True))

    # --- the contract ----------------------------------------------------------------------------

    def read(self, pk: str, doc_id: str) -> Doc | None:
        raw = self._read_raw(pk, doc_id)
        return None if raw is None else self._out(raw)

    def create(self, doc: Doc) -> str | None:
        body, entries = self._prepare(doc, None)
        self._write_entries(entries)
        c = self._container()

        def op() -> str | None:
            try:
                raw = c.create_item(body, **self._session_write(doc["pk"]))
            except cx.CosmosResourceExistsError as exc:
                self._session_lost(doc["pk"], exc)
                return None  # first writer wins
            return make_etag(raw["_etag"], raw.get(DUE_REF))

        return self._search_written(
            doc, self._call(f"create {doc['pk']!r}/{doc['id']!r}", op, idempotent=False, doc=doc)
        )

    def replace(self, doc: Doc, if_match: str | None) -> str:
        body, entries = self._prepare(doc, if_match)
        self._write_entries(entries)
        c, cid, what = self._container(), body["id"], f"replace {doc['pk']!r}/{doc['id']!r}"
        conditional: dict[str, Any] = {}
        if if_match is not None:
            conditional = {"etag": split_etag(if_match)[0], "match_condition": MatchConditions.IfNotModified}

        def op() -> str:
            try:
                raw = c.replace_item(cid, body, **conditional, **self._session_write(doc["pk"]))
            except cx.CosmosResourceNotFoundError as exc:
                self._session_lost(doc["pk"], exc)
                raise ConflictError(f"cosmos {what}: the document does not exist") from exc
            except cx.CosmosAccessConditionFailedError as exc:
                self._session_lost(doc["pk"], exc)
                raise ConflictError(f"cosmos {what}: the document changed since it was read") from exc
            return make_etag(raw["_etag"], raw.get(DUE_REF))

        return self._search_written(doc, self._call(what, op, idempotent=if_match is None, doc=doc))

    def upsert(self, doc: Doc) -> str:
        body, entries = self._prepare(doc, None)
        self._write_entries(entries)
        c = self._container()

        def op() -> str:
            raw = c.upsert_item(body, **self._session_write(doc["pk"]))
            return make_etag(raw["_etag"], raw.get(DUE_REF))

        return self._search_written(
            doc, self._call(f"upsert {doc['pk']!r}/{doc['id']!r}", op, idempotent=True, doc=doc)
        )

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        c, cid, what = self._container(), self._cosmos_id(doc_id), f"delete {pk!r}/{doc_id!r}"
        conditional: dict[str, Any] = {}
        if if_match is not None:
            conditional = {"etag": split_etag(if_match)[0], "match_condition": MatchConditions.IfNotModified}

        def op() -> bool:
            try:
                c.delete_item(cid, partition_key=pk, **conditional, **self._session_write(pk))
            except cx.CosmosResourceNotFoundError as exc:
                self._session_lost(pk, exc)
                return False
            except cx.CosmosAccessConditionFailedError as exc:
                self._session_lost(pk, exc)
                raise ConflictError(f"cosmos {what}: the document changed since it was read") from exc
            return True

        # the index entries of a deleted document are dropped by the next scans
        return self._call(what, op, idempotent=False)

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        sql = "SELECT * FROM c WHERE c.pk = @pk"
        params: dict[str, Any] = {"@pk": pk}
        if since is not None:
            # _ts has one-second resolution: re-read the last seconds (the contract allows it)
            sql += " AND c._ts >= @ts"
            params["@ts"] = int(since) - 2
        docs, cursor = [], int(since or 0)
        for raw in self._query(f"query_partition {pk!r}", sql, params, pk):
            cursor = max(cursor, int(raw.get("_ts", 0)))
            docs.append(self._out(raw))
        return PartitionRead(docs=docs, cursor=cursor)

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        self._check_batch(pk, ops)
        if not ops:
            return []
        calls: list[tuple[Any, ...]] = []
        entries: list[Doc] = []
        handed = self.index.handoffs(
            [(op.kind, op.doc, split_etag(op.if_match)[1] if op.if_match else None) for op in ops], time.time()
        )
        for i, op in enumerate(ops):
            if op.kind == "delete":
                extra = {"if_match_etag": split_etag(op.if_match)[0]} if op.if_match is not None else {}
                calls.append(("delete", (self._cosmos_id(op.doc_id),), extra))
                continue
            assert op.doc is not None
            body, new = self._prepare(op.doc, op.if_match if op.kind == "replace" else None, handed.get(i))
            entries.extend(new)
            if op.kind == "replace":
                extra = {"if_match_etag": split_etag(op.if_match)[0]} if op.if_match is not None else {}
                calls.append(("replace", (body["id"], body), extra))
            else:
                calls.append((op.kind, (body,), {}))
        self._write_entries(entries)
        c, what = self._container(), f"batch {pk!r} ({len(ops)} ops)"

        def run() -> list[str | None]:
            try:
                results = c.execute_item_batch(calls, partition_key=pk, **self._session_write(pk))
            except cx.CosmosBatchOperationError as exc:
                i = exc.error_index or 0
                status = int(exc.status_code or 0)
                op = ops[i] if i < len(ops) else ops[0]
                if status == 413:
                    raise DocumentTooLarge(op.doc_id, doc_size(op.doc) if op.doc else -1, self.max_doc_bytes) from exc
                if status in (404, 409, 412):
                    self._session_lost(pk, exc)
                    reason = {404: "does not exist", 409: "exists", 412: "changed since it was read"}[status]
                    raise ConflictError(f"cosmos {what}: op {i} ({op.kind} {op.doc_id!r}): {reason}") from exc
                raise
            out: list[str | None] = []
            for op, res in zip(ops, results, strict=True):
                body = res.get("resourceBody") or {}
                etag = res.get("eTag") or body.get("_etag")
                out.append(None if op.kind == "delete" or etag is None else make_etag(etag, body.get(DUE_REF)))
            return out

        out = self._call(what, run, idempotent=False)
        for op, etag in zip(ops, out, strict=True):
            if op.doc is not None:  # a delete writes no document (and answers no etag)
                self._search_written(op.doc, etag)
        return out

    # --- scans (scan_due: due.py) ------------------------------------------------------

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        # cross-partition (operator tooling), in bounded pages up to the caller's limit
        sql = "SELECT VALUE c.pk FROM c WHERE c.id = 'exec' AND STARTSWITH(c.pk, @p) ORDER BY c.pk"
        out: list[str] = []
        for page in self._pages("scan_partitions", sql, {"@p": pk_prefix}, None, size=min(int(limit), _PAGE)):
            out += [str(v) for v in page][: int(limit) - len(out)]
            if len(out) >= limit:
                break
        return out


def from_url(url: str, **options: Any) -> CosmosStore:
    """``cosmos://host[:port]/?database=DB&container=C[&verify=false&...]`` (see the module docstring)."""
    endpoint, database, container, key, kwargs = parse_url(url, options)
    return CosmosStore(endpoint, database, container, key=key, **kwargs)
