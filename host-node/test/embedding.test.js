import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';
import { createRelay, MemoryStorage, SqliteStorage } from '../src/index.js';
import { Identity, RelayCore } from '../pkg/relay_wasm.js';
import { NET, register, message, texts, as, eventually } from './helpers.js';
import { answered } from '../src/kit/outcome.js';

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

test("the seed's four methods as typed calls: records as the WIT has them, a refusal thrown with its Failure, and a trap as internal", async () => {
  const relay = await createRelay({ relay: 'http://127.0.0.1:1' });
  const alice = register(relay);
  const bob = register(relay);
  const notes = [];
  relay.on('notify', (n) => notes.push(n));
  const m = message(alice, bob, 'typed', true);
  const id = JSON.parse(m).envelope.message_id;
  const sent = relay.send(as(alice), m);
  assert.deepEqual(
    { messageId: sent.messageId, from: sent.from, to: sent.to, status: sent.status },
    { messageId: id, from: alice.id.accountId(), to: bob.id.accountId(), status: 'target-accepted' },
  );
  assert.ok(sent.deadline > sent.acceptedAt && sent.targetAcceptedAt >= sent.acceptedAt);
  assert.ok(notes.some((n) => n.account === bob.id.accountId()), 'the events were carried out');
  assert.deepEqual(relay.status(as(alice), id), sent);
  // The same answer as the JSON one, field for field.
  const json = relay.call(as(alice), 'message.delivery.status', { message_id: id }).body;
  assert.deepEqual([json.accepted_at, json.deadline, json.target_accepted_at], [sent.acceptedAt, sent.deadline, sent.targetAcceptedAt]);
  const page = relay.sync(as(bob), 0, 10);
  assert.deepEqual(page.entries.map((e) => [e.seq, e.kind]), [[1, 'received']]);
  const wire = (e) => JSON.stringify({ envelope: JSON.parse(e.envelope), device_certificate: JSON.parse(e.deviceCertificate), key_box: JSON.parse(e.keyBox) });
  assert.deepEqual(page.entries.map((e) => bob.id.openEntry(wire(e))), ['typed']);
  assert.equal(page.hasMore, false);
  // A refusal: thrown with the protocol's code, status and error object; nothing committed.
  const refused = (code, status) => (e) => e.payload?.code === code && e.payload.status === status && e.payload.error.code === code.replaceAll('-', '_');
  assert.throws(() => relay.status(as(alice), JSON.parse(message(alice, bob, 'never sent')).envelope.message_id), refused('not-found', 404));
  assert.throws(() => relay.status(as(alice), 'not an id'), refused('invalid-params', 400));
  assert.throws(() => relay.sync({ kind: 'anonymous' }), refused('unauthenticated', 401));
  assert.throws(() => relay.send(as(alice), '{"envelope":'), refused('invalid-params', 400));
  // A trap: the internal refusal, and a fresh instance goes on.
  const real = relay.core.inner.send.bind(relay.core.inner);
  relay.core.inner.send = () => {
    throw new WebAssembly.RuntimeError('unreachable');
  };
  assert.throws(() => relay.send(as(alice), message(alice, bob, 'lost')), refused('internal', 500));
  assert.notEqual(relay.core.inner.send, real);
  assert.equal(relay.send(as(alice), message(alice, bob, 'after')).status, 'target-accepted');
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
  assert.notEqual(relay.core.inner.call, real);
  assert.equal(relay.core.traps, 1);
  const ok = relay.call(as(alice), 'message.send', message(alice, bob, 'after the trap'));
  assert.equal(ok.body.status, 'target_accepted', JSON.stringify(ok.body));
  assert.deepEqual(texts(bob), ['after the trap']);
  await relay.close();
});

test('relay requests from a relay whose key is unknown are parked in the core: one fetch, then each its own answer; a trap answers the parked uncommitted', async () => {
  const relay = await createRelay({ relay: 'http://127.0.0.1:1' });
  // Relay requests signed by a relay whose key this one has not fetched.
  const peer = await createRelay({ relay: 'http://127.0.0.1:9' });
  const body = `{"account":"${'A'.repeat(43)}"}`;
  const request = () => {
    const h = JSON.parse(peer.core.inner.signRequest('route.get', 'http://127.0.0.1:1', body, Date.now()));
    const headers = `relay-id\n${h.relay_id}\nrelay-timestamp\n${h.timestamp}\nrelay-nonce\n${h.nonce}\nrelay-signature\n${h.signature}\n`;
    return relay.handle({ admin: false, method: 'POST', path: '/relay/v1/route.get', query: '', headers, body: new TextEncoder().encode(body), origin: null });
  };
  // The peer's key document, served by a GET the test holds until all three requests wait.
  const gets = [];
  let release;
  const held = new Promise((ok) => (release = ok));
  relay.parking.host.getKey = async (k) => {
    gets.push(k.url);
    await held;
    return answered(200, new TextEncoder().encode(peer.core.wellKnown()));
  };
  const answers = [request(), request(), request()];
  await eventually(() => relay.core.inner.parked() === 3);
  assert.deepEqual(gets, ['http://127.0.0.1:9/.well-known/relay'], 'one fetch for every request waiting for that key');
  release();
  const seen = (await Promise.all(answers)).map((r) => [r.status, JSON.parse(Buffer.from(r.body).toString()).error?.code]);
  // Authenticated: route.get answers (no route here), not 401.
  assert.deepEqual(seen, [[404, 'not_found'], [404, 'not_found'], [404, 'not_found']]);
  assert.equal(relay.core.inner.parked(), 0);
  // A request parked when the core traps is answered as uncommitted (nothing was accepted).
  const other = await createRelay({ relay: 'http://127.0.0.1:8' });
  relay.parking.host.getKey = () => new Promise(() => {});
  const h = JSON.parse(other.core.inner.signRequest('route.get', 'http://127.0.0.1:1', body, Date.now()));
  const headers = `relay-id\n${h.relay_id}\nrelay-timestamp\n${h.timestamp}\nrelay-nonce\n${h.nonce}\nrelay-signature\n${h.signature}\n`;
  const waiting = relay.handle({ admin: false, method: 'POST', path: '/relay/v1/route.get', query: '', headers, body: new TextEncoder().encode(body), origin: null });
  await eventually(() => relay.core.inner.parked() === 1);
  trapNext(relay, 'tick');
  relay.core.tick(Date.now());
  const lost = await waiting;
  assert.equal(lost.status, 500);
  assert.equal(JSON.parse(Buffer.from(lost.body).toString()).error.code, 'internal');
  await relay.close();
  await peer.close();
  await other.close();
});

/** Makes the relay's current core instance trap on its next call of `method`, as a Rust panic would. */
function trapNext(relay, method) {
  relay.core.inner[method] = () => {
    throw new WebAssembly.RuntimeError('unreachable');
  };
}

test('a trap during a tick leaves a timer armed: a delivery waiting for its retry goes on without any request', async () => {
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', policies: { retry_initial: 50, retry_max: 100 } });
  const alice = register(relay);
  // Bob's home relay is a port nobody listens on: every attempt fails and is retried by the timer.
  const bob = new Identity();
  const far = { id: bob, cert: bob.certificate(NET, 'send,sync,manage', Date.now() - 1000) };
  const pub = relay.call({ kind: 'anonymous' }, 'route.publish', `{"route":${bob.route(NET, 'http://127.0.0.1:9', 1, Date.now())}}`);
  assert.equal(pub.status, 200, JSON.stringify(pub.body));
  let attempts = 0;
  const exchange = relay.exchange.bind(relay);
  relay.exchange = (...a) => {
    attempts += 1;
    return exchange(...a);
  };
  const sent = relay.call(as(alice), 'message.send', message(alice, far, 'retried'));
  assert.equal(sent.body.status, 'delivering', JSON.stringify(sent.body));
  await eventually(() => attempts >= 1);
  trapNext(relay, 'tick');
  await eventually(() => relay.core.traps === 1);
  const after = attempts;
  await eventually(() => attempts >= after + 2, 5000);
  await relay.close();
});

test('recovery from a trap drops the trapped instance: its glue and wasm memory are garbage', async () => {
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc');
  const relay = await createRelay({ relay: 'http://127.0.0.1:1' });
  const alice = register(relay);
  const bob = register(relay);
  const old = { mod: new WeakRef(relay.core.mod), inner: new WeakRef(relay.core.inner) };
  for (let i = 1; i <= 3; i++) {
    trapNext(relay, 'call');
    assert.equal(relay.call(as(alice), 'message.send', message(alice, bob, 'lost')).body.error.code, 'internal');
    assert.equal(relay.core.traps, i);
  }
  // A WeakRef holds its target until the current job ends: collect between turns.
  for (let i = 0; i < 20 && (old.mod.deref() || old.inner.deref()); i++) {
    await new Promise((resolve) => setImmediate(resolve));
    gc();
  }
  assert.equal(old.mod.deref(), undefined, 'the trapped module instance is still reachable');
  assert.equal(old.inner.deref(), undefined, 'the trapped core object is still reachable');
  assert.equal(relay.call(as(alice), 'message.send', message(alice, bob, 'kept')).body.status, 'target_accepted');
  assert.deepEqual(texts(bob), ['kept']);
  await relay.close();
});

test('a tick whose storage is busy, and a next wake-up that cannot be read, leave a timer armed', async () => {
  const inner = new MemoryStorage();
  let busyScans = 0;
  let busyMet = 0;
  const busy = {
    get: (k) => inner.get(k),
    scan: (s, e, l) => {
      if (busyScans > 0) {
        busyScans -= 1;
        busyMet += 1;
        throw new Error('SQLITE_BUSY');
      }
      return inner.scan(s, e, l);
    },
    commit: (w) => inner.commit(w),
  };
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', storage: busy, policies: { retry_initial: 50, retry_max: 100 } });
  const alice = register(relay);
  const bob = new Identity();
  const far = { id: bob, cert: bob.certificate(NET, 'send,sync,manage', Date.now() - 1000) };
  const pub = relay.call({ kind: 'anonymous' }, 'route.publish', `{"route":${bob.route(NET, 'http://127.0.0.1:9', 1, Date.now())}}`);
  assert.equal(pub.status, 200, JSON.stringify(pub.body));
  let attempts = 0;
  const exchange = relay.exchange.bind(relay);
  relay.exchange = (...a) => {
    attempts += 1;
    return exchange(...a);
  };
  const sent = relay.call(as(alice), 'message.send', message(alice, far, 'retried'));
  assert.equal(sent.body.status, 'delivering', JSON.stringify(sent.body));
  await eventually(() => attempts >= 1);
  // The next tick's read and the next-wake read after it both meet a busy store.
  const tick = relay.core.tick.bind(relay.core);
  let armed = true;
  relay.core.tick = (now) => {
    if (armed) {
      armed = false;
      busyScans = 2;
    }
    return tick(now);
  };
  await eventually(() => busyMet >= 2);
  const after = attempts;
  await eventually(() => attempts >= after + 2, 5000);
  await relay.close();
});
