import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createRelay, serve, RelayThread } from '../src/index.js';
import { Identity } from '../pkg/relay_wasm.js';
import { NET, post, eventually, freePort } from './helpers.js';

/** The two ways to serve: the relay on the transports' thread, or on a relay thread of its own. */
const MODES = ['in-process', 'relay thread'];

/** The calls that reached the relay's core. */
const coreCalls = async (relay) => (relay instanceof RelayThread ? (await relay.stats()).coreCalls : relay.coreCalls);

/** Starts a served relay on a free port; its id carries the port, so the port is chosen first. */
async function served(policies = {}, mode = 'in-process') {
  const probe = await freePort();
  const url = `http://127.0.0.1:${probe}`;
  const opts = { relay: url, policies };
  const relay = mode === 'relay thread' ? await RelayThread.start(opts) : await createRelay(opts);
  const srv = await serve(relay, { host: '127.0.0.1', port: probe });
  return { relay, srv, url };
}

async function registerHttp(url, discoverable = true) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const r = await post(`${url}/v1/account.register`, `{"route":${id.route(NET, url, 1, Date.now())},"certificate":${cert},"discoverable":${discoverable}}`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const s = await post(`${url}/v1/session.open`, id.sessionOpen(NET, url, Date.now()));
  assert.equal(s.status, 200, JSON.stringify(s.body));
  return { id, cert, url, session: s.body.session };
}

for (const mode of MODES) {
  test(`two Node relays deliver a message over HTTP (${mode})`, async () => {
    const a = await served({}, mode);
    const b = await served({}, mode);
    const alice = await registerHttp(a.url);
    const bob = await registerHttp(b.url);
    const pub = await post(`${a.url}/v1/route.publish`, `{"route":${bob.id.route(NET, b.url, 1, Date.now())}}`);
    assert.equal(pub.status, 200);
    const m = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'node to node', Date.now(), false);
    const sent = await post(`${a.url}/v1/message.send`, m, alice.session);
    assert.equal(sent.status, 200, JSON.stringify(sent.body));
    assert.equal(sent.body.status, 'delivering');
    const id = JSON.parse(m).envelope.message_id;
    const done = await eventually(async () => {
      const s = await post(`${a.url}/v1/message.delivery.status`, { message_id: id }, alice.session);
      return s.body.status === 'target_accepted' ? s : null;
    });
    assert.ok(done.body.target_accepted_at);
    const sync = await post(`${b.url}/v1/message.timeline.sync`, { after: 0 }, bob.session);
    assert.deepEqual(sync.body.entries.map((e) => bob.id.openEntry(JSON.stringify(e))), ['node to node']);
    await a.srv.close();
    await b.srv.close();
  });

  test(`a WebSocket client gets message.timeline.changed, then syncs the new entry (${mode})`, async () => {
    const a = await served({}, mode);
    const alice = await registerHttp(a.url);
    const bob = await registerHttp(a.url);
    const ws = new WebSocket(`${a.url.replace('http', 'ws')}/v1/ws`, { headers: { authorization: `Bearer ${bob.session}` } });
    const frames = [];
    ws.on('message', (d) => frames.push(JSON.parse(d.toString())));
    await new Promise((resolve, reject) => {
      ws.on('open', resolve);
      ws.on('error', reject);
    });
    const m = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'pushed', Date.now(), false);
    assert.equal((await post(`${a.url}/v1/message.send`, m, alice.session)).status, 200);
    const note = await eventually(() => frames.find((f) => f.method === 'message.timeline.changed'));
    assert.deepEqual(note.params, { account: bob.id.accountId(), latest_seq: 1 });
    ws.send(JSON.stringify({ id: 's1', method: 'message.timeline.sync', params: { after: 0 } }));
    const answer = await eventually(() => frames.find((f) => f.id === 's1'));
    assert.deepEqual(answer.result.entries.map((e) => bob.id.openEntry(JSON.stringify(e))), ['pushed']);
    ws.send('{"id":9,"method":"message.timeline.sync","params":{"after":1.0}}');
    const bad = await eventually(() => frames.find((f) => f.id === 9));
    assert.equal(bad.error.code, 'invalid_params', 'params reach the core exactly as sent');
    ws.close();
    await a.srv.close();
  });

  test(`a WebSocket is closed with the core's expiry close, 4401 session expired, when its session expires (${mode})`, async () => {
    const a = await served({ session_ttl: 1500 }, mode);
    const bob = await registerHttp(a.url);
    const ws = new WebSocket(`${a.url.replace('http', 'ws')}/v1/ws`, { headers: { authorization: `Bearer ${bob.session}` } });
    const closed = new Promise((resolve) => ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })));
    await new Promise((resolve, reject) => {
      ws.on('open', resolve);
      ws.on('error', reject);
    });
    assert.deepEqual(await closed, { code: 4401, reason: 'session expired' });
    await a.srv.close();
  });

  test(`a 4th anonymous call from one address within a minute gets 429 rate_limited with Retry-After; other calls go on (${mode})`, async () => {
    const a = await served({ anonymous_rate: 3 }, mode);
    // account.register and session.open are the address's first two anonymous calls.
    const alice = await registerHttp(a.url);
    const get = () => post(`${a.url}/v1/route.get`, { account: alice.id.accountId() });
    assert.equal((await get()).status, 200, 'the third');
    const res = await fetch(`${a.url}/v1/route.get`, { method: 'POST', body: JSON.stringify({ account: alice.id.accountId() }) });
    assert.equal(res.status, 429);
    assert.equal((await res.json()).error.code, 'rate_limited');
    const retry = Number(res.headers.get('retry-after'));
    assert.ok(Number.isInteger(retry) && retry >= 1 && retry <= 60, `Retry-After ${res.headers.get('retry-after')}`);
    // The relay still answers: a session's call, and its well-known document.
    const sync = await post(`${a.url}/v1/message.timeline.sync`, { after: 0 }, alice.session);
    assert.equal(sync.status, 200, JSON.stringify(sync.body));
    assert.equal((await fetch(`${a.url}/.well-known/relay`)).status, 200);
    await a.srv.close();
  });

  test(`oversize bodies get 413 and malformed JSON 400, before the core is called (${mode})`, async () => {
    const a = await served({ max_request_bytes: 1024 }, mode);
    const before = await coreCalls(a.relay);
    const big = await fetch(`${a.url}/v1/message.send`, { method: 'POST', body: 'x'.repeat(2048) });
    assert.equal(big.status, 413);
    assert.equal((await big.json()).error.code, 'payload_too_large');
    assert.equal(await coreCalls(a.relay), before, 'an oversize body never reaches the core');
    // Malformed JSON is the core's strict parser's to judge (before any method runs).
    for (const bad of ['{', '{"a":1,"a":2}', '["\\uD800"]', Buffer.from([0xff])]) {
      const r = await fetch(`${a.url}/v1/message.send`, { method: 'POST', body: bad });
      assert.equal(r.status, 400);
      assert.equal((await r.json()).error.code, 'invalid_params');
    }
    const unsigned = await fetch(`${a.url}/relay/v1/message.deliver`, { method: 'POST', body: '{}' });
    assert.equal(unsigned.status, 401);
    await a.srv.close();
  });
}

test("a relay thread answers a session's next envelope sent over a WebSocket from the main thread's verification", async () => {
  const a = await served({}, 'relay thread');
  const alice = await registerHttp(a.url);
  const bob = await registerHttp(a.url);
  const ws = new WebSocket(`${a.url.replace('http', 'ws')}/v1/ws`, { headers: { authorization: `Bearer ${alice.session}` } });
  await new Promise((resolve, reject) => {
    ws.on('open', resolve);
    ws.on('error', reject);
  });
  const answers = new Map();
  ws.on('message', (d) => {
    const f = JSON.parse(d.toString());
    if (f.id) answers.get(f.id)?.(f);
  });
  const send = (id, text) =>
    new Promise((resolve) => {
      answers.set(id, resolve);
      ws.send(JSON.stringify({ id, method: 'message.send', params: JSON.parse(alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, text, Date.now(), false)) }));
    });
  assert.equal((await send('1', 'one')).result?.status, 'target_accepted');
  assert.equal((await a.relay.stats()).preverified, 0, "the session's key is not known before its first send");
  assert.equal((await send('2', 'two')).result?.status, 'target_accepted');
  assert.equal((await a.relay.stats()).preverified, 1, 'the second envelope was verified on the main thread');
  ws.close();
  await a.srv.close();
});

test('a relay thread is not called for what the core answers without its state: no such endpoint, malformed or oversize bodies', async () => {
  const a = await served({ max_request_bytes: 1024 }, 'relay thread');
  const before = await coreCalls(a.relay);
  const malformed = await fetch(`${a.url}/v1/message.send`, { method: 'POST', body: '{"a":1,"a":2}' });
  assert.equal(malformed.status, 400);
  assert.equal((await malformed.json()).error.code, 'invalid_params');
  const nowhere = await fetch(`${a.url}/v1/no/such`, { method: 'POST', body: '{}' });
  assert.equal(nowhere.status, 404);
  assert.equal((await nowhere.json()).error.code, 'not_found');
  assert.equal(await coreCalls(a.relay), before, 'the relay thread never saw them');
  await a.srv.close();
});

test('a relay thread that stops drops the connections of its requests and says it is lost', async () => {
  const a = await served({}, 'relay thread');
  const lost = new Promise((resolve) => a.relay.once('lost', resolve));
  await a.relay.worker.terminate();
  assert.equal((await lost).code, 'RELAY_THREAD_LOST');
  await assert.rejects(fetch(`${a.url}/v1/message.send`, { method: 'POST', body: '{}' }), 'no answer: the outcome is unknown');
  // /.well-known/relay is the core's to answer now, and the core went with its thread.
  const live = await fetch(`${a.url}/healthz`);
  assert.equal(live.status, 200, 'the transports still stand');
  await a.srv.close();
});

test("a relay thread answers a session's next envelope from the main thread's verification; a forged one is still refused", async () => {
  const a = await served({}, 'relay thread');
  const alice = await registerHttp(a.url);
  const bob = await registerHttp(a.url);
  const send = (text) => post(`${a.url}/v1/message.send`, text, alice.session);
  const first = await send(alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'one', Date.now(), false));
  assert.equal(first.status, 200, JSON.stringify(first.body));
  assert.equal((await a.relay.stats()).preverified, 0, "the session's key is not known before its first send");
  const second = await send(alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'two', Date.now(), false));
  assert.equal(second.status, 200, JSON.stringify(second.body));
  assert.equal(second.body.status, 'target_accepted');
  assert.equal((await a.relay.stats()).preverified, 1, 'the second envelope was verified on the main thread');
  // The same request with one signature byte changed: refused, and nothing was remembered for it.
  const p = JSON.parse(alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'three', Date.now(), false));
  const sig = Buffer.from(p.envelope.sig, 'base64url');
  sig[0] ^= 1;
  p.envelope.sig = sig.toString('base64url');
  const forged = await send(JSON.stringify(p));
  assert.equal(forged.body.error?.code, 'invalid_signature', JSON.stringify(forged.body));
  assert.equal((await a.relay.stats()).preverified, 1);
  await a.srv.close();
});
