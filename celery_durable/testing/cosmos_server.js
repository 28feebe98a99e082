#!/usr/bin/env node
/*
 * Cosmos DB test server for celery_durable: @vercel/cosmosdb-server 1.0.1 behind a small
 * wrapper that makes it behave like real Azure Cosmos DB where our store relies on it, plus
 * fault injection and outage control. Started by celery_durable/testing/cosmos_server.py.
 *
 *   node cosmos_server.js --package-dir DIR [--host 127.0.0.1] [--port 0] [--control-port 0]
 *                         [--parent-pid PID] [--replica-lag-ms 0]
 *
 * DIR holds node_modules/@vercel/cosmosdb-server. With --parent-pid the server exits when that
 * process is gone (no orphans when a test run is killed). When ready it prints one line
 * `READY {"port": P, "controlPort": C}`. The data port speaks HTTPS (the package's bundled
 * self-signed cert) with HTTP keep-alive; the package's own CLI closes every connection after one
 * request, which makes TLS handshakes dominate (~15x slower).
 *
 * Deviations of the package from real Cosmos, and where each is handled
 * (proved by tests/stores/test_cosmos_server.py):
 *
 *  1. Point read of a missing item answers 500 (TypeError in read-document.js).
 *     FIXED HERE: readDocument() looks the item up in the header's partition and answers 404
 *     NotFound when it is absent.
 *  2. Partition key path "/_partitionKey" is treated as "partition by id" (and point reads on
 *     such a container always answer 404: an off-by-one key check in read-document.js).
 *     FIXED HERE: Documents.prototype._getPartitionKeyPath is patched to use the path as
 *     given; readDocument() replaces the package's handler. (The store uses "/pk" anyway.)
 *  3. Transactional batch: ops other than Create look the item up with the id as partition
 *     key (the Python SDK sends the key only in the request header) and fail; a failed batch
 *     leaves the earlier ops applied.
 *     FIXED HERE: batchDocuments() runs every op against the header's partition key, checks
 *     each body's key against it, applies all-or-nothing (undo log + rollback) and answers
 *     207 with the failing op's status and 424 for the others, like Cosmos. The 100-op and
 *     2 MB payload limits are enforced.
 *  4. A query sent with a partition key header but without the key in WHERE answers 400;
 *     with the key in WHERE it silently runs over every partition.
 *     FIXED HERE: queryDocuments() runs a query that carries a partition key header over
 *     that partition's items only (the store also puts the key in WHERE).
 *     A cross-partition query evaluates every item of the container (0.75 ms each: 45 s over
 *     60,000, where Cosmos answers from its index): ADDED HERE, its top-level equalities
 *     ("c.f = @p", "c.pk IN (...)", AND only) pick the items the query engine then sees.
 *  5. TTL (container defaultTtl / item ttl) is ignored.
 *     FIXED HERE: sweepTtl() deletes expired items (before requests, at most every 50 ms,
 *     and on a 1 s timer). The store does not rely on TTL.
 *  6. replace_container drops every document of the container.
 *     FIXED HERE: replaceCollection() moves the items over to the replaced container object.
 *  7. OFFSET/LIMIT, DISTINCT and GROUP BY do not parse (400).
 *     NOT FIXED (query parser): the store never uses them (TOP, ORDER BY, VALUE, STARTSWITH
 *     only); a test checks the store's SQL and that the deviation is still there.
 *  8. Items larger than 2 MB are accepted.
 *     FIXED HERE: writes of items over 2 MiB answer 413, like Cosmos (the store checks first).
 *  9. The package's CLI closes every connection: we start the server ourselves with keep-alive.
 * 10. No session tokens, every read sees the latest write.
 *     ADDED HERE (cosmos_server_lag.js): writes answer x-ms-session-token; --replica-lag-ms L
 *     (or POST /replica-lag) makes reads without a fresh enough token see the previous version
 *     of a document for L ms after a write, like a lagging replica at Session consistency.
 *
 * Control API (plain HTTP on --control-port, 127.0.0.1 only):
 *   GET  /health            {"ok": true, "port": P, "paused": false}
 *   POST /faults            {"status": 429, "count": 3, "retryAfterMs": 100, "match": "/docs",
 *                            "delayMs": 0, "drop": false}: the next `count` data requests whose
 *                            "METHOD[_QUERY|_UPSERT|_BATCH] /path" matches the regex `match`
 *                            answer `status` (429 carries x-ms-retry-after-ms), or are delayed,
 *                            or have their connection dropped without an answer.
 *   DELETE /faults          clear pending faults
 *   GET  /stats             {"total", "ops": {"read": n, ...}, "queryDocs", "queryScanned", "faults"}
 *                           (queryScanned: the items the query engine evaluated) (requests by
 *                           operation, documents returned by queries, injected faults);
 *                           DELETE /stats resets them
 *   POST /pause, /resume    stop listening and cut every connection / listen again (same port,
 *                           data kept: an outage window)
 *   POST /outage            {"seconds": 1.5}: pause now, resume after `seconds`
 *   POST /replica-lag       {"ms": 300}: the replica lag (0: off); GET /stats has "staleReads"
 */
"use strict";

const fs = require("fs");
const http = require("http");
const https = require("https");
const path = require("path");
const crypto = require("crypto");
const { Readable } = require("stream");

function parseArgs(argv) {
  const out = { host: "127.0.0.1", port: 0, controlPort: 0, packageDir: null, parentPid: 0, replicaLagMs: 0 };
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    if (a === "--host") out.host = argv[(i += 1)];
    else if (a === "--port") out.port = parseInt(argv[(i += 1)], 10);
    else if (a === "--control-port") out.controlPort = parseInt(argv[(i += 1)], 10);
    else if (a === "--package-dir") out.packageDir = argv[(i += 1)];
    else if (a === "--parent-pid") out.parentPid = parseInt(argv[(i += 1)], 10);
    else if (a === "--replica-lag-ms") out.replicaLagMs = parseInt(argv[(i += 1)], 10);
    else throw new Error(`unknown argument ${a}`);
  }
  if (!out.packageDir) throw new Error("--package-dir is required");
  return out;
}

const args = parseArgs(process.argv.slice(2));
const pkgRoot = path.join(args.packageDir, "node_modules", "@vercel", "cosmosdb-server");
const lib = (name) => {
  const mod = require(path.join(pkgRoot, "lib", name));
  return mod.default !== undefined ? mod.default : mod;
};

const Account = lib("account");
const Documents = lib("account/documents");
const routes = lib("routes");
const readItems = lib("handler/_read-items");
const documentOperations = require(path.join(pkgRoot, "lib", "handler", "_document-operations"));
const { patchOperation } = require(path.join(pkgRoot, "lib", "handler", "_patch-operations"));
const getValue = lib("utils/get-value");
const trueHeader = lib("true-header");
const Items = lib("account/items");

// --- a partition index: a single-partition query costs what its partition holds -----------------
// Items keep one Map of every item; a query scoped to a partition filtered it whole. Like Cosmos,
// which reads only the physical partition of the key, keep the items' ids per partition key value.
function partitionOf(items, data) {
  return JSON.stringify(getValue(items._getPartitionKeyPath(), data));
}
function byPartition(items) {
  let index = items._byPartition;
  if (!index || items._byPartitionSize !== items._data.size) {
    // first use, or items moved in by other means (replaceCollection): rebuild once
    index = new Map();
    for (const [rid, item] of items._data) {
      const key = partitionOf(items, item.read());
      if (!index.has(key)) index.set(key, new Set());
      index.get(key).add(rid);
    }
    items._byPartition = index;
    items._byPartitionSize = items._data.size;
  }
  return index;
}
const originalSet = Items.prototype._set;
Items.prototype._set = function set(data) {
  const had = this._data.has(data._rid);
  const out = originalSet.call(this, data);
  if (this._byPartition && !had && this._byPartitionSize + 1 === this._data.size) {
    const key = partitionOf(this, data);
    if (!this._byPartition.has(key)) this._byPartition.set(key, new Set());
    this._byPartition.get(key).add(data._rid);
    this._byPartitionSize = this._data.size;
  }
  return out;
};
const originalDelete = Items.prototype.delete;
Items.prototype.delete = function del(idOrRid, partition) {
  const data = this._item("/id", idOrRid, partition).read();
  const out = originalDelete.call(this, idOrRid, partition);
  if (data && this._byPartition && this._byPartitionSize - 1 === this._data.size) {
    const rids = this._byPartition.get(partitionOf(this, data));
    if (rids) rids.delete(data._rid);
    this._byPartitionSize = this._data.size;
  }
  return out;
};
function partitionItems(items, value) {
  const rids = byPartition(items).get(JSON.stringify(value));
  if (!rids) return [];
  const out = [];
  for (const rid of rids) {
    const item = items._data.get(rid);
    if (item) out.push(item.read());
  }
  return out;
}
const getPartitionFromHeader = lib("utils/get-partition-from-header");
const { parsePartitionKey } = require(path.join(pkgRoot, "lib", "utils", "get-partition-from-header"));

const handlers = {
  readDocument: lib("handler/read-document"),
  createDocument: lib("handler/create-document"),
  upsertDocument: lib("handler/upsert-document"),
  replaceDocument: lib("handler/replace-document"),
  deleteDocument: lib("handler/delete-document"),
  queryDocuments: lib("handler/query-documents"),
  batchDocuments: lib("handler/batch-documents"),
  replaceCollection: lib("handler/replace-collection"),
};

const MAX_ITEM_BYTES = 2 * 1024 * 1024;
const { ReplicaLag, TOKEN_HEADER } = require(path.join(__dirname, "cosmos_server_lag.js"));
const lag = new ReplicaLag(args.replicaLagMs);
const MAX_BATCH_OPS = 100;

// --- deviation 2: honour the partition key path as given --------------------------------
Documents.prototype._getPartitionKeyPath = function getPartitionKeyPath() {
  const [first] = this._partitionKeyPath;
  return first ? first.slice(1).split("/") : ["id"];
};

// --- helpers ---------------------------------------------------------------------------------

// The handlers read the body from `req` themselves; we read it first (size limits, stats), so
// give them a stream that replays it.
function replayRequest(req, body) {
  const copy = Readable.from([body], { objectMode: false });
  copy.headers = req.headers;
  copy.method = req.method;
  copy.url = req.url;
  return copy;
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

function parseJson(buf) {
  try {
    return { value: JSON.parse(buf.toString("utf8")) };
  } catch (err) {
    return { error: err };
  }
}

// The value of the x-ms-documentdb-partitionkey header: ["v"] -> "v"; [{}] (PartitionKey.None)
// -> undefined. Throws on a malformed header.
function headerPartitionValue(header) {
  const parsed = JSON.parse(header);
  const v = Array.isArray(parsed) ? parsed[0] : parsed;
  if (v !== null && typeof v === "object") return undefined;
  return v;
}

function itemBytes(item) {
  return Buffer.byteLength(JSON.stringify(item), "utf8");
}

function tooLarge(res) {
  res.statusCode = 413;
  return { code: "RequestEntityTooLarge", message: "Request size is too large" };
}

function notFound(res) {
  res.statusCode = 404;
  return { code: "NotFound", message: "Entity with the specified id does not exist in the system." };
}

// --- deviation 1: 404 for a missing item ------------------------------------------------------
// (The package's handler also compares the item's key paths with an off-by-one loop that
// rejects every read on a "/_partitionKey" container; the partitioned lookup makes it moot.)
async function readDocument(account, req, res, params) {
  const collection = account.database(params.dbId).collection(params.collId);
  const props = collection.read();
  if (!props) return notFound(res);
  const header = getPartitionFromHeader(req);
  const paths = (props.partitionKey || {}).paths || [];
  if (header === undefined && paths.length && !trueHeader(req, "x-ms-documentdb-query-enablecrosspartition")) {
    res.statusCode = 400;
    return { code: "BadRequest", message: "PartitionKey value must be supplied for this operation." };
  }
  let result;
  try {
    result = documentOperations.readOperation(collection, {
      partitionKey: header === undefined ? JSON.stringify(params.docId) : header,
      id: params.docId,
    });
  } catch (err) {
    res.statusCode = 400;
    return { code: "BadRequest", message: err.message };
  }
  if (header !== undefined && lag.active) {
    // deviation 10: a lagging replica may serve an older version (or none)
    const current = result.statusCode === 404 ? null : result.body;
    const seen = lag.visible(`${params.dbId}/${params.collId}`, pkKey(header), params.docId, current, lag.requestLsn(req));
    result = seen ? { statusCode: 200, body: seen } : { statusCode: 404 };
  }
  if (result.statusCode === 404) return notFound(res);
  res.statusCode = result.statusCode;
  return result.body;
}

// --- deviation 8: item size limit ------------------------------------------------------------
function sizeChecked(original) {
  return async (account, req, res, params) => {
    if (req.parsedBody !== undefined && itemBytes(req.parsedBody) > MAX_ITEM_BYTES) return tooLarge(res);
    return original(account, req, res, params);
  };
}

// --- deviation 3: atomic transactional batch --------------------------------------------------
async function batchDocuments(account, req, res, params) {
  const collection = account.database(params.dbId).collection(params.collId);
  if (!collection.read()) return notFound(res);
  const ops = req.parsedBody;
  if (!Array.isArray(ops) || ops.length === 0) {
    res.statusCode = 400;
    return { code: "BadRequest", message: "Batch request has no operations" };
  }
  if (ops.length > MAX_BATCH_OPS) {
    res.statusCode = 400;
    return { code: "BadRequest", message: `Batch request has more operations than what is supported (${MAX_BATCH_OPS})` };
  }
  if (req.rawBody.length > MAX_ITEM_BYTES) return tooLarge(res);
  const header = getPartitionFromHeader(req);
  let pkValue;
  try {
    pkValue = headerPartitionValue(header);
  } catch (err) {
    res.statusCode = 400;
    return { code: "BadRequest", message: "A transactional batch needs a valid partition key header" };
  }
  const items = collection.documents;
  const keyPath = items._getPartitionKeyPath();
  const lookupKey = (id) => parsePartitionKey(header, id);
  const undo = new Map(); // id -> the item before the batch touched it (null: absent)
  const results = [];
  let failure = null;
  for (let i = 0; i < ops.length && !failure; i += 1) {
    const input = { ...ops[i], partitionKey: header };
    const id = input.id || (input.resourceBody && input.resourceBody.id);
    let result;
    if (input.resourceBody && input.operationType !== "Patch" && getValue(keyPath, input.resourceBody) !== pkValue) {
      result = { statusCode: 400, body: { message: "Partition key in the item does not match the batch's" } };
    } else if (input.resourceBody && itemBytes(input.resourceBody) > MAX_ITEM_BYTES) {
      result = { statusCode: 413, body: { message: "Request size is too large" } };
    } else {
      if (id && !undo.has(id)) undo.set(id, items._item("/id", id, lookupKey(id)).read() || null);
      switch (input.operationType) {
        case "Create":
          result = documentOperations.createOperation(collection, input);
          break;
        case "Upsert":
          result = documentOperations.upsertOperation(collection, input);
          break;
        case "Read":
          result = documentOperations.readOperation(collection, input);
          break;
        case "Delete":
          result = documentOperations.deleteOperation(collection, input);
          break;
        case "Replace":
          result = documentOperations.replaceOperation(collection, input);
          break;
        case "Patch":
          result = patchOperation(collection, {
            id: input.id,
            partitionKey: header,
            ifMatch: input.ifMatch,
            operations: (input.resourceBody || {}).operations || [],
            condition: (input.resourceBody || {}).condition,
          });
          break;
        default:
          result = { statusCode: 400, body: { message: `Operation type '${input.operationType}' is not supported` } };
      }
    }
    if (result.statusCode >= 400) failure = { index: i, result };
    else {
      results.push({
        statusCode: result.statusCode,
        requestCharge: 1,
        eTag: result.body ? result.body._etag : undefined,
        resourceBody: result.body,
      });
    }
  }
  if (!failure) return results;
  // roll back in reverse order of first touch
  for (const [id, before] of [...undo.entries()].reverse()) {
    const key = lookupKey(id);
    if (items._item("/id", id, key).read()) items.delete(id, key);
    if (before) items._set(before);
  }
  res.statusCode = 207; // Cosmos answers a failed transactional batch with Multi-Status
  return ops.map((_, i) =>
    i === failure.index
      ? { statusCode: failure.result.statusCode, requestCharge: 0, message: (failure.result.body || {}).message }
      : { statusCode: 424, requestCharge: 0 }
  );
}

// --- deviation 4: queries scoped by the partition key header ---------------------------------
// A cross-partition query's top-level equalities ("c.f = @p", "c.f IN (@a, @b)", joined by AND
// only): [field, Set of JSON values] pairs every result must match. Like the index Cosmos
// answers such a query from, they let the query engine (0.75 ms per document) see only the
// documents that can match, not the whole container; the full query still runs on those.
function equalities(query, parameters) {
  if (typeof query !== "string" || /\b(OR|NOT|JOIN|EXISTS)\b|\(\s*SELECT\b/i.test(query)) return null;
  const values = new Map((parameters || []).map((p) => [p.name, JSON.stringify(p.value)]));
  const found = [];
  for (const m of query.matchAll(/\bc\.([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(@[A-Za-z0-9_]+)/g)) {
    if (values.has(m[2])) found.push([m[1], new Set([values.get(m[2])])]);
  }
  for (const m of query.matchAll(/\bc\.([A-Za-z_][A-Za-z0-9_]*)\s+IN\s*\(([^)]*)\)/gi)) {
    const names = m[2].split(",").map((n) => n.trim());
    if (names.length && names.every((n) => values.has(n))) found.push([m[1], new Set(names.map((n) => values.get(n)))]);
  }
  return found.length ? found : null;
}

async function queryDocuments(account, req, res, params) {
  const collection = account.database(params.dbId).collection(params.collId);
  const header = getPartitionFromHeader(req);
  const cross = trueHeader(req, "x-ms-documentdb-query-enablecrosspartition");
  const narrowed = cross ? equalities((req.parsedBody || {}).query, (req.parsedBody || {}).parameters) : null;
  if ((header === undefined && !cross) || (cross && narrowed === null) || !collection.read()) {
    if (collection.read()) stats.queryScanned += collection.documents._data.size; // every item
    return handlers.queryDocuments(account, req, res, params);
  }
  return readItems(req, res, "Documents", async ({ continuation, maxItemCount }) => {
    const body = req.parsedBody || {};
    if (!body.query) {
      res.statusCode = 400;
      return { message: "missing query" };
    }
    const items = collection.documents;
    let data;
    if (cross) {
      const keyPath = items._getPartitionKeyPath();
      const onKey = narrowed.find(([f]) => keyPath.length === 1 && keyPath[0] === f);
      const candidates = onKey
        ? [...onKey[1]].flatMap((v) => partitionItems(items, JSON.parse(v))) // "c.pk IN (...)": those partitions
        : [...items._data.values()].map((it) => it.read());
      data = candidates.filter(
        (d) => d && narrowed.every(([f, allowed]) => d[f] !== undefined && allowed.has(JSON.stringify(d[f])))
      );
    } else {
      let value;
      try {
        value = headerPartitionValue(header);
      } catch (err) {
        res.statusCode = 400;
        return { code: "BadRequest", message: err.message };
      }
      const keyPath = items._getPartitionKeyPath();
      const latest = partitionItems(items, value).filter((d) => d && getValue(keyPath, d) === value);
      data = lag.visibleItems(`${params.dbId}/${params.collId}`, JSON.stringify(value), latest, lag.requestLsn(req));
    }
    stats.queryScanned += data.length;
    const props = collection.read();
    const compositeIndexes = (props.indexingPolicy ? props.indexingPolicy.compositeIndexes : null) || [];
    try {
      return items._getQuery(body.query).exec(data, {
        parameters: body.parameters,
        udf: items._userDefinedFunctions(),
        maxItemCount,
        continuation,
        compositeIndexes,
      });
    } catch (err) {
      if (err.name === "SyntaxError") throw err; // _read-items turns it into a 400
      res.statusCode = 400;
      return { code: "BadRequest", message: err.message };
    }
  });
}

// --- deviation 6: replace_container keeps the items ------------------------------------------
async function replaceCollection(account, req, res, params) {
  const database = account.database(params.dbId);
  const before = database.collection(params.collId);
  const existed = Boolean(before.read());
  const out = await handlers.replaceCollection(account, req, res, params);
  const after = database.collection(params.collId);
  if (existed && after !== before && after.read() && res.statusCode < 400) {
    for (const key of ["documents", "userDefinedFunctions", "partitionKeyRanges"]) {
      after[key] = before[key];
      after[key]._parent = after;
    }
  }
  return out;
}

// --- deviation 5: TTL --------------------------------------------------------------------------
let lastSweep = 0;
function sweepTtl(account) {
  lastSweep = Date.now();
  const now = lastSweep / 1000;
  for (const db of account.databases._data.values()) {
    if (!db.read()) continue;
    for (const coll of db.collections._data.values()) {
      const props = coll.read();
      if (!props || props.defaultTtl === undefined || props.defaultTtl === null) continue;
      const items = coll.documents;
      for (const it of [...items._data.values()]) {
        const d = it.read();
        if (!d) continue;
        const ttl = d.ttl !== undefined && d.ttl !== null ? d.ttl : props.defaultTtl;
        if (typeof ttl === "number" && ttl > 0 && d._ts + ttl <= now) items.delete(d.id, items._getPartition(d));
      }
    }
  }
}

// --- deviation 10: session tokens and replica lag (cosmos_server_lag.js) ---------------------
function pkKey(header) {
  try {
    return JSON.stringify(headerPartitionValue(header));
  } catch (err) {
    return undefined;
  }
}

// The documents a write request may change, with their versions before it.
function snapshotWrites(req, params, name) {
  if (!["create", "upsert", "replace", "delete", "batch"].includes(name) || !account) return null;
  const collection = account.database(params.dbId).collection(params.collId);
  const header = getPartitionFromHeader(req);
  if (header === undefined || !collection.read()) return null;
  const body = req.parsedBody || {};
  let ids;
  if (name === "batch") ids = (Array.isArray(body) ? body : []).map((op) => op.id || (op.resourceBody || {}).id);
  else ids = [name === "create" || name === "upsert" ? body.id : params.docId];
  const read = (id) => collection.documents._item("/id", id, parsePartitionKey(header, id)).read() || null;
  const docs = [...new Set(ids.filter((id) => typeof id === "string"))].map((id) => ({ id, before: read(id) }));
  return { coll: `${params.dbId}/${params.collId}`, pk: pkKey(header), docs, read };
}

// Writes answer the token of their LSN; a write that lost (404, 409, 412, or a failed batch:
// 207) the newest LSN, which covers what it lost against (Cosmos answers those with the token
// of the version that won: a read with it is not served the version the write was based on);
// reads echo the token they were sent.
function sessionToken(req, res, writes) {
  if (writes) {
    if ([404, 409, 412, 207].includes(res.statusCode)) {
      res.setHeader(TOKEN_HEADER, lag.token(lag.lsn));
      return;
    }
    if (res.statusCode >= 300) return;
    const changes = writes.docs.map((d) => ({ coll: writes.coll, pk: writes.pk, id: d.id, before: d.before, after: writes.read(d.id) }));
    res.setHeader(TOKEN_HEADER, lag.token(lag.recordWrites(changes)));
  } else if (req.headers[TOKEN_HEADER] && res.statusCode < 300) {
    res.setHeader(TOKEN_HEADER, String(req.headers[TOKEN_HEADER]));
  }
}

// --- request handling --------------------------------------------------------------------------
const overrides = new Map([
  [handlers.readDocument, readDocument],
  [handlers.batchDocuments, batchDocuments],
  [handlers.queryDocuments, queryDocuments],
  [handlers.replaceCollection, replaceCollection],
  [handlers.createDocument, sizeChecked(handlers.createDocument)],
  [handlers.upsertDocument, sizeChecked(handlers.upsertDocument)],
  [handlers.replaceDocument, sizeChecked(handlers.replaceDocument)],
]);
const opNames = new Map([
  [handlers.readDocument, "read"],
  [handlers.createDocument, "create"],
  [handlers.upsertDocument, "upsert"],
  [handlers.replaceDocument, "replace"],
  [handlers.deleteDocument, "delete"],
  [handlers.queryDocuments, "query"],
  [handlers.batchDocuments, "batch"],
]);

const stats = { total: 0, ops: {}, queryDocs: 0, queryScanned: 0, faults: 0 };
let faults = [];

function label(req) {
  let suffix = "";
  if (req.method === "POST") {
    if (trueHeader(req, "x-ms-documentdb-isquery") || req.headers["content-type"] === "application/query+json") suffix = "_QUERY";
    else if (trueHeader(req, "x-ms-documentdb-is-upsert")) suffix = "_UPSERT";
    else if (trueHeader(req, "x-ms-cosmos-is-batch-request")) suffix = "_BATCH";
  }
  return `${req.method}${suffix} ${req.url.split("?")[0]}`;
}

function takeFault(req) {
  const text = label(req);
  for (let i = 0; i < faults.length; i += 1) {
    const f = faults[i];
    if (f.regex.test(text)) {
      f.count -= 1;
      if (f.count <= 0) faults.splice(i, 1);
      return f;
    }
  }
  return null;
}

function sendFault(req, res, fault) {
  if (fault.drop) {
    req.socket.destroy();
    return;
  }
  const codes = { 408: "RequestTimeout", 429: "TooManyRequests", 449: "RetryWith", 500: "InternalServerError", 503: "ServiceUnavailable" };
  res.statusCode = fault.status;
  res.setHeader("content-type", "application/json");
  res.setHeader("x-ms-activity-id", crypto.randomUUID());
  res.setHeader("x-ms-request-charge", "0");
  if (fault.status === 429) {
    res.setHeader("x-ms-retry-after-ms", String(fault.retryAfterMs));
    res.setHeader("x-ms-substatus", "3200");
  }
  res.end(JSON.stringify({ code: codes[fault.status] || "Error", message: `injected fault ${fault.status}` }));
}

function handleRequest(req, res) {
  {
    (async () => {
      const raw = await readBody(req);
      stats.total += 1;
      const fault = takeFault(req);
      if (fault) {
        stats.faults += 1;
        if (fault.delayMs) await new Promise((r) => setTimeout(r, fault.delayMs));
        if (fault.status || fault.drop) {
          sendFault(req, res, fault);
          return;
        }
      }
      if (Date.now() - lastSweep >= 50) sweepTtl(account);
      const r = replayRequest(req, raw);
      r.rawBody = raw;
      if (raw.length && (req.headers["content-type"] || "").includes("json")) {
        const parsed = parseJson(raw);
        if (!parsed.error) r.parsedBody = parsed.value;
      }
      const route = routes(r);
      let body;
      if (route) {
        const [params, handler] = route;
        const name = opNames.get(handler) || "other";
        stats.ops[name] = (stats.ops[name] || 0) + 1;
        const writes = snapshotWrites(r, params, name);
        try {
          body = await (overrides.get(handler) || handler)(account, r, res, params);
        } catch (err) {
          console.error(err);
          body = { message: err.message };
          res.statusCode = 500;
        }
        sessionToken(r, res, writes);
        if (name === "query" && body && typeof body._count === "number") stats.queryDocs += body._count;
        if (res.statusCode > 399 && body && !body.message) body.message = "";
      } else {
        res.statusCode = 400;
        body = { message: "no route" };
      }
      if (body && body._etag) res.setHeader("etag", body._etag);
      res.setHeader("content-type", "application/json");
      res.setHeader("content-location", `https://${req.headers.host}${req.url}`);
      res.setHeader("connection", "keep-alive");
      res.setHeader("x-ms-activity-id", crypto.randomUUID());
      res.setHeader("x-ms-request-charge", "1");
      if (req.headers["a-im"] && res.statusCode === 200) {
        if (req.headers["if-none-match"]) res.statusCode = 304;
        res.setHeader("etag", "1");
      }
      res.end(JSON.stringify(body));
    })().catch((err) => {
      console.error(err);
      if (!res.writableEnded) {
        res.statusCode = 500;
        res.end("");
      }
    });
  }
}

// --- servers -------------------------------------------------------------------------------------
const tlsOptions = {
  cert: fs.readFileSync(path.join(pkgRoot, "cert.pem")),
  key: fs.readFileSync(path.join(pkgRoot, "key.pem")),
  minVersion: "TLSv1.2",
  keepAlive: true,
};

let account = null;
let dataServer = null;
let dataPort = args.port;
const sockets = new Set();
let paused = false;

function listenData() {
  return new Promise((resolve, reject) => {
    const server = https.createServer(tlsOptions, handleRequest);
    server.keepAliveTimeout = 60000;
    server.on("connection", (s) => {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
    });
    server.once("error", reject);
    server.listen(dataPort, args.host, () => {
      dataPort = server.address().port;
      if (!account) account = new Account(args.host, dataPort);
      dataServer = server;
      paused = false;
      resolve();
    });
  });
}

function pauseData() {
  return new Promise((resolve) => {
    if (!dataServer) {
      resolve();
      return;
    }
    const server = dataServer;
    dataServer = null;
    paused = true;
    server.close(() => resolve());
    for (const s of sockets) s.destroy();
    sockets.clear();
  });
}

function controlHandler(req, res) {
  (async () => {
    const raw = await readBody(req);
    const body = raw.length ? JSON.parse(raw.toString("utf8")) : {};
    const reply = (code, obj) => {
      res.statusCode = code;
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(obj));
    };
    const route = `${req.method} ${req.url.split("?")[0]}`;
    switch (route) {
      case "GET /health":
        return reply(200, { ok: true, port: dataPort, paused, replicaLagMs: lag.lagMs });
      case "POST /faults":
        faults.push({
          status: body.status || 0,
          count: body.count === undefined ? 1 : body.count,
          retryAfterMs: body.retryAfterMs === undefined ? 100 : body.retryAfterMs,
          regex: new RegExp(body.match || "/docs"),
          delayMs: body.delayMs || 0,
          drop: Boolean(body.drop),
        });
        return reply(200, { ok: true, pending: faults.length });
      case "DELETE /faults":
        faults = [];
        return reply(200, { ok: true });
      case "GET /stats":
        return reply(200, { ...stats, staleReads: lag.staleReads });
      case "DELETE /stats":
        stats.total = 0;
        stats.ops = {};
        stats.queryDocs = 0;
        stats.queryScanned = 0;
        stats.faults = 0;
        lag.staleReads = 0;
        return reply(200, { ok: true });
      case "POST /replica-lag":
        lag.setLag(body.ms);
        return reply(200, { ok: true, ms: lag.lagMs });
      case "POST /pause":
        await pauseData();
        return reply(200, { ok: true });
      case "POST /resume":
        if (!dataServer) await listenData();
        return reply(200, { ok: true, port: dataPort });
      case "POST /outage": {
        await pauseData();
        const ms = Math.max(0, (body.seconds || 0) * 1000);
        setTimeout(() => {
          if (!dataServer) listenData().catch((err) => console.error(err));
        }, ms);
        return reply(200, { ok: true });
      }
      default:
        return reply(404, { message: `no control route ${route}` });
    }
  })().catch((err) => {
    res.statusCode = 500;
    res.end(JSON.stringify({ message: String(err && err.message) }));
  });
}

async function main() {
  await listenData();
  const control = http.createServer(controlHandler);
  await new Promise((resolve, reject) => {
    control.once("error", reject);
    control.listen(args.controlPort, "127.0.0.1", resolve);
  });
  setInterval(() => {
    if (account) sweepTtl(account);
    lag.sweep();
  }, 1000).unref();
  process.stdout.write(`READY ${JSON.stringify({ port: dataPort, controlPort: control.address().port })}\n`);
  if (args.parentPid) {
    setInterval(() => {
      try {
        process.kill(args.parentPid, 0);
      } catch (err) {
        process.exit(0); // our parent died without stopping us
      }
    }, 1000);
  }
  const stop = () => process.exit(0);
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
