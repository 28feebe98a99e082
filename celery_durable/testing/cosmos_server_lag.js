/*
 * Replica-lag mode of the Cosmos test server (issue 16), used by cosmos_server.js.
 *
 * Real Cosmos DB at Session consistency may serve a read from a replica that has not applied
 * the latest writes yet, unless the read carries a session token at least as new as the write.
 * This module emulates that for point reads and single-partition queries (the store's read,
 * read_many and query_partition):
 *
 *  - every successful write (create, upsert, replace, delete, a whole batch) gets the next LSN
 *    and answers `x-ms-session-token: 0:-1#<LSN>` (one range "0"; `version#globalLSN`);
 *  - with a lag of L ms, a read whose token is older than a document's last write (or that has
 *    no token) sees, for L ms after that write, the version before it (absent if it was just
 *    created, present again if it was just deleted); a read with a token >= the write's LSN
 *    sees the latest;
 *  - reads answer with the token they were sent (their own progress stays the caller's).
 *
 * Versions are kept only while some read could still be served them (L ms), so memory stays
 * bounded by the write rate. Cross-partition queries are not lagged.
 */
"use strict";

const TOKEN_HEADER = "x-ms-session-token";

function copy(body) {
  return body === null || body === undefined ? null : JSON.parse(JSON.stringify(body));
}

class ReplicaLag {
  constructor(lagMs) {
    this.lagMs = Math.max(0, Number(lagMs) || 0);
    this.lsn = 0;
    // "db/coll" -> pk (JSON) -> id -> [{lsn, at, body}] oldest first (body null: absent)
    this.history = new Map();
    this.staleReads = 0;
  }

  get active() {
    return this.lagMs > 0;
  }

  setLag(ms) {
    this.lagMs = Math.max(0, Number(ms) || 0);
    if (!this.active) this.history.clear();
  }

  token(lsn) {
    return `0:-1#${lsn}`;
  }

  // The newest global LSN named by the request's token; -1 without one.
  requestLsn(req) {
    const header = req.headers[TOKEN_HEADER];
    if (!header) return -1;
    let best = -1;
    for (const pair of String(header).split(",")) {
      const vector = pair.slice(pair.indexOf(":") + 1).split("#");
      const n = parseInt(vector.length > 1 ? vector[1] : vector[0], 10);
      if (!Number.isNaN(n) && n > best) best = n;
    }
    return best;
  }

  // Record one request's writes: `changes` is [{coll, pk, id, before, after}] (bodies or null).
  // Returns the request's LSN.
  recordWrites(changes) {
    this.lsn += 1;
    if (!this.active) return this.lsn;
    const now = Date.now();
    for (const c of changes) {
      let part = this.history.get(c.coll);
      if (!part) this.history.set(c.coll, (part = new Map()));
      let docs = part.get(c.pk);
      if (!docs) part.set(c.pk, (docs = new Map()));
      let versions = docs.get(c.id);
      if (!versions) docs.set(c.id, (versions = [{ lsn: 0, at: 0, body: copy(c.before) }]));
      versions.push({ lsn: this.lsn, at: now, body: copy(c.after) });
      this._prune(docs, c.id, now);
    }
    return this.lsn;
  }

  // Drop the versions no read can be served any more (older than the newest settled one).
  _prune(docs, id, now) {
    const versions = docs.get(id);
    let settled = 0;
    for (let i = versions.length - 1; i >= 0; i -= 1) {
      if (now - versions[i].at >= this.lagMs) {
        settled = i;
        break;
      }
    }
    if (settled > 0) versions.splice(0, settled);
    if (versions.length === 1 && now - versions[0].at >= this.lagMs) docs.delete(id);
  }

  sweep() {
    const now = Date.now();
    for (const part of this.history.values()) {
      for (const [pk, docs] of part) {
        for (const id of [...docs.keys()]) this._prune(docs, id, now);
        if (!docs.size) part.delete(pk);
      }
    }
  }

  // The version of one document a read with token LSN `reqLsn` is served (undefined: untracked).
  _visible(versions, reqLsn, now) {
    for (let i = versions.length - 1; i >= 0; i -= 1) {
      const v = versions[i];
      if (v.lsn <= reqLsn || now - v.at >= this.lagMs) {
        if (i < versions.length - 1) this.staleReads += 1;
        return v.body;
      }
    }
    return versions[0].body;
  }

  // A point read: the document as this read sees it (null: not found).
  visible(coll, pk, id, current, reqLsn) {
    if (!this.active) return current;
    const docs = (this.history.get(coll) || new Map()).get(pk);
    const versions = docs && docs.get(id);
    if (!versions) return current;
    return this._visible(versions, reqLsn, Date.now());
  }

  // A single-partition query's input: the partition's items as this read sees them.
  visibleItems(coll, pk, items, reqLsn) {
    if (!this.active) return items;
    const docs = (this.history.get(coll) || new Map()).get(pk);
    if (!docs || !docs.size) return items;
    const now = Date.now();
    const out = [];
    for (const item of items) {
      const versions = docs.get(item.id);
      if (!versions) out.push(item);
    }
    for (const versions of docs.values()) {
      const body = this._visible(versions, reqLsn, now);
      if (body) out.push(body);
    }
    return out;
  }
}

module.exports = { ReplicaLag, TOKEN_HEADER };
