// The Node host's native crypto (npm/<platform>/relay_native.node, the package relay-node-<platform>) and the core's own verification in wasm
// give the same verdict, error kind included, on every external Ed25519 vector; the host's
// SHA-256 is SHA-256; and the core takes the host's verdicts when offered, its own when declined.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import { addon, hostCrypto } from '../src/native.js';
import { MemoryStorage } from '../src/storage.js';
import { Identity } from '../pkg/relay_wasm.js';
import { NET } from './helpers.js';

const VECTORS = process.env.RELAY_VECTORS ?? new URL('../../../shared/vectors/', import.meta.url).pathname;
const read = (rel) => JSON.parse(fs.readFileSync(`${VECTORS}/${rel}`, 'utf8'));
const hex = (s) => Buffer.from(s, 'hex');
const VALID = 0;

let instances = 0;
/** A fresh instance of the core module (its own memory of verified signatures). */
async function freshModule() {
  instances += 1;
  return import(`../pkg/relay_wasm.js?native-test=${instances}`);
}

const native = addon();
const own = await freshModule();

test('the native addon is built and loads (./x builds it beside the wasm module)', () => {
  assert.ok(native, 'the native crypto package for this platform did not load');
  assert.equal(typeof native.verifyEd25519, 'function');
  assert.equal(typeof native.sha256Into, 'function');
  assert.ok(hostCrypto(), 'hostCrypto() offers nothing');
});

/** Both paths on one input; returns the shared verdict. */
function sameVerdict(pk, msg, sig, what) {
  const host = native.verifyEd25519(pk, msg, sig);
  const core = own.verifyEd25519Own(pk, msg, sig);
  assert.equal(host, core, `${what}: host ${host}, core ${core}`);
  return host;
}

test('Wycheproof ed25519: host and core agree on all 151 cases, and with the expected result', () => {
  let n = 0;
  for (const group of read('wycheproof/ed25519_test.json').testGroups) {
    const pk = hex(group.publicKey.pk);
    for (const t of group.tests) {
      const v = sameVerdict(pk, hex(t.msg), hex(t.sig), `tcId ${t.tcId}`);
      assert.equal(v === VALID, t.result === 'valid', `tcId ${t.tcId}`);
      n += 1;
    }
  }
  assert.equal(n, 151);
});

test('RFC 8032 section 7.1: host and core accept each vector and reject it altered', () => {
  for (const t of read('rfc8032/rfc8032_ed25519_7.1.json').tests) {
    const [pk, msg, sig] = [hex(t.public_key), hex(t.message), hex(t.signature)];
    assert.equal(sameVerdict(pk, msg, sig, t.name), VALID, t.name);
    assert.equal(sameVerdict(pk, Buffer.concat([msg, Buffer.from([0])]), sig, t.name), 2, `${t.name} altered`);
  }
});

test('speccheck: host and core give the strict row (only case 3 verifies)', () => {
  const cases = read('ed25519-speccheck/cases.json');
  assert.equal(cases.length, 12);
  cases.forEach((c, i) => {
    const v = sameVerdict(hex(c.pub_key), hex(c.message), hex(c.signature), `case ${i}`);
    assert.equal(v === VALID, i === 3, `case ${i}`);
  });
});

test('the addon declines shapes the core never asks about (3), so the core decides them', () => {
  assert.equal(native.verifyEd25519(Buffer.alloc(31), Buffer.alloc(0), Buffer.alloc(64)), 3);
  assert.equal(native.verifyEd25519(Buffer.alloc(32), Buffer.alloc(0), Buffer.alloc(63)), 3);
  assert.equal(native.sha256Into(Buffer.alloc(1), new Uint8Array(31)), false);
});

test('the addon SHA-256 is SHA-256 (node:crypto) at every length up to 1 KiB', () => {
  const data = Buffer.from(Array.from({ length: 1024 }, (_, i) => (i * 31) % 251));
  const out = new Uint8Array(32);
  for (let len = 0; len <= data.length; len++) {
    const d = data.subarray(0, len);
    assert.equal(native.sha256Into(d, out), true);
    assert.equal(Buffer.from(out).toString('hex'), crypto.createHash('sha256').update(d).digest('hex'), `length ${len}`);
  }
});

/** account.register of a fresh identity through a core whose host crypto is `hc`. */
async function register(hc) {
  const mod = await freshModule();
  mod.setHostCrypto(hc);
  const core = new mod.RelayCore(JSON.stringify({ relay: 'https://relay.test', network: NET }), new MemoryStorage(), new Uint8Array(32).fill(7));
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const route = id.route(NET, 'https://relay.test', 1, Date.now());
  const r = (core.call('anonymous', '', null, 'account.register', Buffer.from(`{"route":${route},"certificate":${cert},"discoverable":true}`), Date.now()));
  return { status: r.status, body: JSON.parse(Buffer.from(r.body).toString()) };
}

test('the core takes the host verdict: valid through the addon, mismatch refused, declined or throwing decided by the core', async () => {
  let calls = 0;
  const counted = (f) => (...a) => {
    calls += 1;
    return f(...a);
  };
  assert.equal((await register({ verifyEd25519: counted(native.verifyEd25519) })).status, 200);
  assert.ok(calls > 0, 'the addon was never asked');
  calls = 0;
  const refused = await register({ verifyEd25519: counted(() => 2) });
  assert.equal(refused.status, 400);
  assert.equal(refused.body.error.code, 'invalid_signature');
  assert.ok(calls > 0);
  calls = 0;
  assert.equal((await register({ verifyEd25519: counted(() => 3) })).status, 200, 'declined: the core verifies itself');
  assert.ok(calls > 0);
  const throwing = () => {
    throw new Error('host crypto failed');
  };
  assert.equal((await register({ verifyEd25519: throwing, sha256Into: throwing })).status, 200, 'a throwing host is declined');
  assert.equal((await register(null)).status, 200, 'no host crypto: the core alone');
});

test('pre-verification: an envelope verified ahead of the core has one digest, for message.send under its key and for message.deliver under its certificate', () => {
  const alice = new Identity();
  const bob = new Identity();
  const cert = alice.certificate(NET, 'send', Date.now() - 1000);
  const bobCert = bob.certificate(NET, 'send', Date.now() - 1000);
  const { envelope } = JSON.parse(alice.message(NET, bob.accountId(), `[${bobCert}]`, 'x', Date.now(), false));
  const key = Buffer.from(JSON.parse(cert).device_key, 'base64url');
  const params = JSON.stringify({ envelope, device_certificate: JSON.parse(cert) });
  const b = (t) => Buffer.from(t);
  const sent = native.preverifyDigest(key, b(params));
  assert.match(sent, /^[0-9a-f]{64}$/);
  assert.equal(native.preverifyDigest(Buffer.alloc(0), b(params)), sent, 'the same envelope, the same digest');
  const other = Buffer.from(JSON.parse(bobCert).device_key, 'base64url');
  assert.equal(native.preverifyDigest(other, b(params)), null, 'another key');
  assert.equal(native.preverifyDigest(Buffer.alloc(0), b(JSON.stringify({ envelope, device_certificate: JSON.parse(bobCert) }))), null, "another device's certificate");
  const forged = JSON.stringify({ envelope: { ...envelope, created_at: envelope.created_at + 1 }, device_certificate: JSON.parse(cert) });
  assert.equal(native.preverifyDigest(key, b(forged)), null, 'changed after signing');
  assert.equal(native.preverifyDigest(key, b('{"envelope":')), null, 'not JSON');
  // The memory: nothing is answered that was not remembered, and a closed memory answers nothing.
  const id = native.preverifyOpen();
  assert.notEqual(native.preverifyOpen(), id, 'each relay has its own memory');
  assert.equal(native.preverifyTake(id, key, b('relay-v1:message_envelope\n{}'), Buffer.alloc(64)), false, 'other bytes');
  native.preverifyClose(id);
  assert.equal(native.preverifyTake(id, key, b('relay-v1:message_envelope\n{}'), Buffer.alloc(64)), false);
});

test("ahead of the relay thread: the core's rules answer what needs no state, and name a message.send's session", () => {
  const id = native.preverifyOpen();
  const ask = (path, body, headers = '', admin = false) => native.aheadRequest(id, admin, 'POST', path, headers, Buffer.from(body), Date.now());
  assert.equal(ask('/v1/message.send', '{').status ?? null, null, 'no rules yet: everything goes to the core');
  native.aheadOpen(id, JSON.stringify({ relay: 'http://a.example', network: NET, policies: { max_request_bytes: 64 } }));
  const malformed = ask('/v1/message.send', '{');
  assert.equal(malformed.status, 400);
  assert.equal(JSON.parse(Buffer.from(malformed.body).toString()).error.code, 'invalid_params');
  assert.equal(malformed.headers['content-type'], 'application/json');
  assert.equal(ask('/v1/no/such', '{}').status, 404);
  assert.equal(ask('/v1/route.get', ' '.repeat(65)).status, 413);
  const send = ask('/v1/message.send', '{"envelope":{}}', 'authorization\nBearer tok\n');
  assert.equal(send.status ?? null, null, 'to the core');
  assert.equal(send.sending, 'tok');
  assert.equal(ask('/v1/message.send', '{"envelope":{}}').sending ?? null, null, 'anonymous: no session');
  assert.equal(native.aheadFrame(id, 'tok', '{"id":"1","method":"message.send","params":{}}'), true);
  assert.equal(native.aheadFrame(id, 'tok', '{"id":"1","method":"message.timeline.sync","params":{}}'), false);
  native.preverifyClose(id);
  assert.equal(ask('/v1/message.send', '{').status ?? null, null, 'closed: no rules');
});
