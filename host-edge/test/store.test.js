// The Durable Object store's memory of what its database holds: only committed writes are
// remembered, a rolled-back transaction leaves it as it was, and it is bounded.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SqlStore, READ_MEMORY } from '../../host-node/src/edge/store.js';

/** A stand-in for `ctx.storage.sql` over a Map, with transactions, counting its reads. */
class FakeSql {
  constructor() {
    /** @type {Map<string, ArrayBuffer>} */
    this.rows = new Map();
    /** @type {Map<string, ArrayBuffer> | null} the rows as they were when the transaction began */
    this.before = null;
    this.reads = 0;
  }

  begin() {
    this.before = new Map(this.rows);
  }

  end(commit) {
    if (!commit) this.rows = this.before;
    this.before = null;
  }

  exec(query, ...args) {
    const hex = (k) => Buffer.from(k).toString('hex');
    const out = [];
    if (query.startsWith('SELECT v FROM kv WHERE k = ?')) {
      this.reads += 1;
      const v = this.rows.get(hex(args[0]));
      if (v) out.push([v]);
    } else if (query.startsWith('INSERT OR REPLACE INTO kv')) {
      for (let i = 0; i < args.length; i += 2) this.rows.set(hex(args[i]), args[i + 1].slice().buffer);
    } else if (query.startsWith('DELETE FROM kv')) {
      for (const k of args) this.rows.delete(hex(k));
    }
    return { raw: () => ({ toArray: () => out }) };
  }
}

const bytes = (s) => new TextEncoder().encode(s);
const text = (b) => (b === null ? null : new TextDecoder().decode(b));

test('the store answers reads from what committed, and a rolled-back transaction leaves its memory as it was', () => {
  const sql = new FakeSql();
  const store = new SqlStore(/** @type {any} */ (sql));
  // Committed: read back from memory, no query.
  sql.begin();
  store.commit([[bytes('a'), bytes('1')], [bytes('b'), bytes('2')]]);
  sql.end(true);
  store.settled(true);
  const reads = sql.reads;
  assert.equal(text(store.get(bytes('a'))), '1');
  assert.equal(sql.reads, reads, 'a committed write is read from memory');
  // Rolled back: neither the new value of a nor the delete of b is remembered.
  sql.begin();
  store.commit([[bytes('a'), bytes('9')], [bytes('b'), null]]);
  assert.equal(text(store.get(bytes('a'))), '9', 'the transaction reads its own writes');
  assert.equal(store.get(bytes('b')), null);
  sql.end(false);
  store.settled(false);
  assert.equal(text(store.get(bytes('a'))), '1');
  assert.equal(text(store.get(bytes('b'))), '2');
  // An absent key is remembered as absent once read.
  assert.equal(store.get(bytes('c')), null);
  const after = sql.reads;
  assert.equal(store.get(bytes('c')), null);
  assert.equal(sql.reads, after);
});

test('the store remembers at most READ_MEMORY keys', () => {
  const sql = new FakeSql();
  const store = new SqlStore(/** @type {any} */ (sql));
  for (let i = 0; i < READ_MEMORY + 100; i += 1) store.get(bytes(`k${i}`));
  assert.equal(store.known.size, READ_MEMORY);
  // The oldest went first.
  const reads = sql.reads;
  store.get(bytes('k0'));
  assert.equal(sql.reads, reads + 1);
});
