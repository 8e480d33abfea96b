import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRelay, MemoryStorage, SqliteStorage } from '../src/index.js';
import { register, message, texts, as } from './helpers.js';

async function localDelivery(storage, opts = {}) {
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', storage, ...opts });
  const alice = register(relay);
  const bob = register(relay);
  const notes = [];
  relay.on('notify', (n) => notes.push(n));
  const r = relay.call(as(alice), 'message.send', message(alice, bob, 'hello in-process', true));
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.status, 'target_accepted');
  assert.deepEqual(texts(bob), ['hello in-process']);
  assert.deepEqual(texts(alice), ['hello in-process'], 'sent record with sender_boxes');
  assert.ok(notes.some((n) => n.account === bob.id.accountId() && n.latest_seq === 1));
  const status = relay.call(as(alice), 'message.delivery.status', { message_id: JSON.parse(message(alice, bob, 'x')).envelope.message_id });
  assert.equal(status.body.error.code, 'not_found');
  await relay.close();
}

test('embedding API with the in-memory storage', async () => {
  await localDelivery('memory');
});

test('embedding API with SQLite (better-sqlite3), surviving a reopen', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-'));
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', data: dir });
  const alice = register(relay);
  const bob = register(relay);
  const m = message(alice, bob, 'durable');
  assert.equal(relay.call(as(alice), 'message.send', m).body.status, 'target_accepted');
  await relay.close();
  const again = await createRelay({ relay: 'http://127.0.0.1:1', data: dir });
  bob.relay = again;
  alice.relay = again;
  assert.deepEqual(texts(bob), ['durable']);
  const retry = again.call(as(alice), 'message.send', m);
  assert.equal(retry.body.status, 'target_accepted', 'idempotent across a restart');
  assert.deepEqual(texts(bob), ['durable'], 'no duplicate');
  assert.equal(JSON.parse(again.wellKnown()).relay_key, JSON.parse(relay.wellKnown()).relay_key, 'the relay key persists');
  await again.close();
  fs.rmSync(dir, { recursive: true });
});

test('a second relay on the same data directory is refused while the first runs', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-'));
  const first = await createRelay({ relay: 'http://127.0.0.1:1', data: dir });
  await assert.rejects(createRelay({ relay: 'http://127.0.0.1:1', data: dir }), /another relay/);
  await first.close();
  const again = await createRelay({ relay: 'http://127.0.0.1:1', data: dir });
  await again.close();
  fs.rmSync(dir, { recursive: true });
});

test('embedding API with a custom storage object', async () => {
  const inner = new MemoryStorage();
  let commits = 0;
  const custom = {
    get: (k) => inner.get(k),
    scan: (s, e, l) => inner.scan(s, e, l),
    commit: (w) => {
      commits += 1;
      inner.commit(w);
    },
  };
  await localDelivery(custom);
  assert.ok(commits > 0 && inner.size > 0);
});

test('a storage failure answers internal and commits nothing', async () => {
  const inner = new MemoryStorage();
  let fail = false;
  const flaky = {
    get: (k) => inner.get(k),
    scan: (s, e, l) => inner.scan(s, e, l),
    commit: (w) => {
      if (fail) throw new Error('disk full');
      inner.commit(w);
    },
  };
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', storage: flaky });
  const alice = register(relay);
  const bob = register(relay);
  const before = inner.size;
  fail = true;
  const r = relay.call(as(alice), 'message.send', message(alice, bob, 'lost?'));
  assert.equal(r.status, 500);
  assert.equal(r.body.error.code, 'internal');
  assert.equal(inner.size, before, 'nothing half-written');
  fail = false;
  assert.deepEqual(texts(bob), []);
  await relay.close();
});

test('a trap inside wasm answers internal and the relay goes on with a fresh instance', async () => {
  const relay = await createRelay({ relay: 'http://127.0.0.1:1' });
  const alice = register(relay);
  const bob = register(relay);
  const real = relay.core.inner.call.bind(relay.core.inner);
  relay.core.inner.call = () => {
    throw new WebAssembly.RuntimeError('unreachable');
  };
  const r = relay.call(as(alice), 'message.send', message(alice, bob, 'x'));
  assert.equal(r.status, 500);
  assert.equal(r.body.error.code, 'internal');
  await relay.core.ready();
  assert.notEqual(relay.core.inner.call, real);
  assert.equal(relay.core.traps, 1);
  const ok = relay.call(as(alice), 'message.send', message(alice, bob, 'after the trap'));
  assert.equal(ok.body.status, 'target_accepted', JSON.stringify(ok.body));
  assert.deepEqual(texts(bob), ['after the trap']);
  await relay.close();
});
