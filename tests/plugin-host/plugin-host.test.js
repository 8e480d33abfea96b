// The plugin host (host.js, written from wit/relay.wit alone) drives the core component as
// transpiled by jco (pinned in package.json): register, session, self-delivery, an identical
// retry, a conflicting one, sync, status, bad input, metrics; and two such hosts deliver a
// message to each other over HTTP (the core's `send` events, key fetches and `fetched`), as two
// `relay` resources of one instance, each over its own store; a refused config is a typed error.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Identity } from '../../host-node/pkg/relay_wasm.js';
import { Store, startHost } from './host.js';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const COMPONENT = path.resolve(HERE, '../../target/component/relay_core.wasm');
const NET = 'dev';
const enc = new TextEncoder();
const dec = new TextDecoder();
const now = () => BigInt(Date.now());
const json = (reply) => JSON.parse(dec.decode(reply.body));
/** A typed timeline entry as the wire's JSON (its signed objects are canonical text). */
const wire = (e) => JSON.stringify({ envelope: JSON.parse(e.envelope), device_certificate: JSON.parse(e.deviceCertificate), key_box: JSON.parse(e.keyBox) });
/** The typed calls' refusal (jco throws a `result`'s error with it as `payload`). */
const refused = (code, status) => (e) => e.payload?.code === code && e.payload.status === status && typeof e.payload.error.message === 'string';

/** The component transpiled by jco into a fresh directory. */
function transpile() {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-jco-'));
  const jco = path.join(HERE, 'node_modules/@bytecodealliance/jco/dist/jco.js');
  const r = spawnSync(process.execPath, [jco, 'transpile', COMPONENT, '-o', out, '--name', 'relay', '--instantiation', 'async'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return out;
}

async function freePort() {
  const s = net.createServer();
  await new Promise((ok) => s.listen(0, '127.0.0.1', ok));
  const port = s.address().port;
  await new Promise((ok) => s.close(ok));
  return port;
}

/** A relay on the plugin host. */
const start = (out, relay) => startHost({ out, config: { relay, network: NET, policies: {}, started_at: Date.now() }, seed: crypto.randomBytes(32) });

/** An account with one device on `h`, through `call`; its session caller. */
function account(h, url) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const anonymous = { tag: 'anonymous' };
  const reg = h.relay.call(anonymous, undefined, 'account.register', enc.encode(`{"route":${id.route(NET, url, 1, Date.now())},"certificate":${cert},"discoverable":true}`), now());
  assert.equal(reg.status, 200, dec.decode(reg.body));
  const open = h.relay.call(anonymous, undefined, 'session.open', enc.encode(id.sessionOpen(NET, url, Date.now())), now());
  assert.equal(open.status, 200, dec.decode(open.body));
  return { id, cert, caller: { tag: 'session', val: json(open).session } };
}

test('the plugin host is under 200 lines and uses nothing of ours: the WIT is its only guide', () => {
  const text = fs.readFileSync(path.join(HERE, 'host.js'), 'utf8');
  assert.ok(text.split('\n').length < 200, 'under 200 lines');
  const imports = [...text.matchAll(/^import .* from '([^']+)';$/gm)].map((m) => m[1]);
  assert.deepEqual(imports.filter((m) => !m.startsWith('node:')), [], 'only Node built-ins (the component comes in as jco output)');
});

test('a plugin host from the WIT alone: send, retry, conflict, sync, status, bad input, metrics', async () => {
  const out = transpile();
  const url = 'http://127.0.0.1:1';
  const h = await start(out, url);
  try {
    const alice = account(h, url);
    // Self-delivery through the typed `send`: accepted at once, and Alice's account is notified.
    const params = alice.id.message(NET, alice.id.accountId(), `[${alice.cert}]`, 'note to self', Date.now(), false);
    const sent = h.relay.send(alice.caller, enc.encode(params), now());
    assert.equal(sent.status.status, 'target-accepted');
    assert.equal(sent.status.from, alice.id.accountId());
    assert.ok(sent.status.deadline > sent.status.acceptedAt, 'the source names its deadline');
    h.run(sent.events);
    assert.ok(h.notes.some((n) => n.account === alice.id.accountId()), 'the notify event was carried out');
    // The identical retry: the same result, no second entry.
    const again = h.relay.send(alice.caller, enc.encode(params), now());
    assert.deepEqual(again.status, sent.status);
    // The same message id with other content: state_conflict, nothing committed.
    const messageId = JSON.parse(params).envelope.message_id;
    const other = alice.id.message(NET, alice.id.accountId(), `[${alice.cert}]`, 'something else', Date.now(), false, messageId);
    assert.throws(() => h.relay.send(alice.caller, enc.encode(other), now()), (e) => refused('state-conflict', 409)(e) && e.payload.error.code === 'state_conflict');
    // sync and status through their typed exports.
    const synced = h.relay.sync(alice.caller, 0n, undefined, now());
    assert.deepEqual(synced.entries.map((e) => [e.seq, e.kind]), [[1n, 'self-delivery']]);
    assert.deepEqual(synced.entries.map((e) => alice.id.openEntry(wire(e))), ['note to self']);
    assert.equal(synced.hasMore, false);
    const status = h.relay.status(alice.caller, messageId, now());
    assert.deepEqual(status.status, sent.status);
    const unsent = JSON.parse(alice.id.message(NET, alice.id.accountId(), `[${alice.cert}]`, 'never sent', Date.now(), false)).envelope.message_id;
    assert.throws(() => h.relay.status(alice.caller, unsent, now()), refused('not-found', 404));
    // Bad input: invalid_params, and the store is as it was.
    const keys = h.store.size;
    const bad = h.relay.call({ tag: 'anonymous' }, undefined, 'account.register', enc.encode('{"route":'), now());
    assert.equal(bad.status, 400);
    assert.equal(bad.error, 'invalid-params');
    assert.equal(h.store.size, keys, 'nothing written');
    // Metrics, at the host's clock.
    assert.match(h.relay.metrics(now()), /^relay_\w+/m);
    // A config the core refuses: `open` throws the WIT's typed error, and opens nothing.
    const Relay = h.core.relay.Relay;
    assert.ok(h.relay instanceof Relay, 'the relay is an instance of the exported resource');
    const badConfig = (e) => e.payload?.tag === 'bad-config' && /relay seed/.test(e.payload.val);
    assert.throws(() => Relay.open(new Store(new Map()), JSON.stringify({ relay: url, network: NET }), new Uint8Array(3), undefined), badConfig);
  } finally {
    await h.close();
    fs.rmSync(out, { recursive: true, force: true });
  }
});

test('two relays of one instance deliver a message to each other over HTTP', async () => {
  const out = transpile();
  const [pa, pb] = [await freePort(), await freePort()];
  const [ua, ub] = [`http://127.0.0.1:${pa}`, `http://127.0.0.1:${pb}`];
  const [a, b] = [await start(out, ua), await start(out, ub)];
  const servers = [await a.serve(pa), await b.serve(pb)];
  try {
    // Two relays of one instance (the WIT's `relay` is a resource), each over its own store.
    assert.equal(a.core, b.core, 'one instance of the component');
    assert.notEqual(a.store, b.store);
    const alice = account(a, ua);
    const bob = account(b, ub);
    const params = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'across', Date.now(), false);
    // Bob's signed route, published at Alice's relay (as a contact card hands it over).
    const pub = a.relay.call({ tag: 'anonymous' }, undefined, 'route.publish', enc.encode(`{"route":${bob.id.route(NET, ub, 1, Date.now())}}`), now());
    assert.equal(pub.status, 200, dec.decode(pub.body));
    const sent = a.relay.send(alice.caller, enc.encode(params), now());
    assert.equal(sent.status.status, 'delivering');
    a.run(sent.events);
    const id = JSON.parse(params).envelope.message_id;
    for (let i = 0; i < 100 && a.relay.status(alice.caller, id, now()).status.status !== 'target-accepted'; i += 1) {
      await new Promise((r) => setTimeout(r, 50));
    }
    const done = a.relay.status(alice.caller, id, now()).status;
    assert.equal(done.status, 'target-accepted');
    assert.ok(done.targetAcceptedAt >= done.acceptedAt, "the destination's acceptance time");
    const synced = b.relay.sync(bob.caller, 0n, 10, now());
    assert.deepEqual(synced.entries.map((e) => [e.kind, bob.id.openEntry(wire(e))]), [['received', 'across']]);
    // What Bob's relay stored is in Bob's store only: Alice's never held Bob's timeline.
    assert.throws(() => a.relay.sync(bob.caller, 0n, 10, now()), refused('unauthenticated', 401));
  } finally {
    for (const s of servers) s.close();
    await a.close();
    await b.close();
    fs.rmSync(out, { recursive: true, force: true });
  }
});
