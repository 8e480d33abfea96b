// Group commit in the Node host: reads see the open group, the disk sees it only after flush,
// answers wait for the flush, and a failed flush undoes the whole group.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MemoryStorage, SqliteStorage } from '../src/storage.js';
import { createRelay } from '../src/index.js';
import { register, message, as, texts } from './helpers.js';

const b = (s) => Buffer.from(s);

test('an open group is read through and reaches the database only at flush', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-group-'));
  // Not exclusive: a second connection looks at what reached the disk.
  const s = new SqliteStorage(path.join(dir, 'db.sqlite'), { exclusive: false });
  s.commit([[b('a'), b('1')], [b('c'), b('3')]]);
  s.begin();
  s.commit([[b('b'), b('2')], [b('c'), null]]);
  assert.equal(Buffer.from(s.get(b('b'))).toString(), '2');
  assert.equal(s.get(b('c')), null);
  assert.deepEqual(s.scan(b('a'), b('z'), 2).map(([k]) => Buffer.from(k).toString()), ['a', 'b']);
  const other = new SqliteStorage(path.join(dir, 'db.sqlite'), { exclusive: false });
  assert.equal(other.get(b('b')), null, 'nothing on disk before flush');
  s.flush();
  assert.equal(Buffer.from(other.get(b('b'))).toString(), '2');
  assert.equal(other.get(b('c')), null);
  other.close();
  s.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a group reads each key from the database once and sees its own writes over it', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-group-'));
  const s = new SqliteStorage(path.join(dir, 'db.sqlite'));
  s.commit([[b('a'), b('1')]]);
  const get = s.getStmt.get.bind(s.getStmt);
  let reads = 0;
  s.getStmt.get = (k) => {
    reads += 1;
    return get(k);
  };
  s.begin();
  for (let i = 0; i < 3; i++) {
    assert.equal(Buffer.from(s.get(b('a'))).toString(), '1');
    assert.equal(s.get(b('missing')), null);
  }
  assert.equal(reads, 2, 'one database read per key, absent keys included');
  s.commit([[b('a'), b('2')], [b('missing'), b('3')]]);
  assert.equal(Buffer.from(s.get(b('a'))).toString(), '2');
  assert.equal(Buffer.from(s.get(b('missing'))).toString(), '3');
  s.flush();
  s.begin();
  assert.equal(Buffer.from(s.get(b('a'))).toString(), '2');
  assert.equal(reads, 3, 'a new group forgets what the last one read');
  s.flush();
  s.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('grouped calls answer after one commit, and a failed commit answers internal for all', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-group-'));
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', data: dir, policies: { send_rate: 0 } });
  const alice = register(relay);
  const bob = register(relay);
  const ok = await Promise.all([1, 2, 3].map((i) => relay.callGrouped(as(alice), 'message.send', message(alice, bob, `m${i}`))));
  assert.deepEqual(ok.map((r) => r.status), [200, 200, 200]);
  assert.deepEqual(texts(bob).sort(), ['m1', 'm2', 'm3']);
  const tx = relay.storage.tx;
  relay.storage.tx = () => {
    throw new Error('disk full');
  };
  const failed = await Promise.all([4, 5].map((i) => relay.callGrouped(as(alice), 'message.send', message(alice, bob, `m${i}`))));
  relay.storage.tx = tx;
  assert.deepEqual(failed.map((r) => r.status), [500, 500]);
  assert.deepEqual(texts(bob).sort(), ['m1', 'm2', 'm3'], 'the failed group left nothing');
  await relay.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('reads through an open group agree with a plain ordered store, deletes and limits included', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-group-'));
  const s = new SqliteStorage(path.join(dir, 'db.sqlite'));
  const model = new MemoryStorage();
  let seed = 7;
  const rnd = (n) => {
    // xorshift32: deterministic, so a failure replays.
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return (seed >>> 0) % n;
  };
  // Keys share prefixes and include bytes above 0x7f, so order is byte order, not text order.
  const key = () => Buffer.from([0x61 + rnd(3), rnd(2) ? 0xe9 : 0x2f, 0x30 + rnd(10)]);
  const rows = (r) => r.map(([k, v]) => `${Buffer.from(k).toString('hex')}=${v === null ? '-' : Buffer.from(v).toString()}`);
  let multiRow = 0;
  for (let round = 0; round < 40; round++) {
    s.begin();
    for (let op = 0; op < 25; op++) {
      const writes = [[key(), rnd(4) === 0 ? null : Buffer.from(`v${round}.${op}`)]];
      s.commit(writes);
      model.commit(writes);
      const [a, b] = [key(), key()].sort(Buffer.compare);
      const limit = 1 + rnd(6);
      const want = rows(model.scan(a, b, limit));
      assert.deepEqual(rows(s.scan(a, b, limit)), want, `scan ${a.toString('hex')}..${b.toString('hex')} limit ${limit}`);
      if (want.length > 1) multiRow += 1;
      const k = key();
      const got = s.get(k);
      const stored = model.get(k);
      assert.equal(got === null ? null : Buffer.from(got).toString(), stored === null ? null : Buffer.from(stored).toString());
    }
    s.flush();
  }
  assert.ok(multiRow > 100, `only ${multiRow} scans returned more than one row`);
  s.close();
  fs.rmSync(dir, { recursive: true, force: true });
});
