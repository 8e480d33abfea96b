// The edge host end to end: relay-edge processes (workerd, one Durable Object per shard) on
// loopback ports, driven over HTTP and WebSocket with the Node host's test helpers.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { Identity, RelayCore } from '../../host-node/pkg/relay_wasm.js';
import { NET, post, eventually, freePort } from '../../host-node/test/helpers.js';
import { parseArgs } from '../src/launch.js';
import workerdPackage from 'workerd';

const BIN = new URL('../bin/relay-edge', import.meta.url).pathname;
/** Whether the core the edge host runs (host-edge/pkg) has shards (`RelayCore.shardOf`). */
const SHARDED = fs.readFileSync(new URL('../../host-node/pkg/web/relay_wasm.js', import.meta.url), 'utf8').includes('static shardOf(');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));


/**
 * A relay-edge process on `port` over `data`: the process is workerd itself (the script
 * execs it), so `kill()` is a SIGKILL of the relay.
 */
async function edge(port, data, flags = []) {
  const url = `http://127.0.0.1:${port}`;
  const proc = spawn(BIN, ['serve', '--listen', `127.0.0.1:${port}`, '--data', data, '--policy', 'retry_initial=200', '--policy', 'retry_max=1000', ...flags], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RELAY_LOG: 'warn' },
  });
  let err = '';
  proc.stderr.on('data', (d) => (err += d));
  proc.stdout.on('data', (d) => (err += d));
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  await eventually(async () => {
    if (proc.exitCode !== null) throw new Error(`relay-edge exited (${proc.exitCode}):\n${err}`);
    try {
      return (await fetch(`${url}/.well-known/relay`)).ok;
    } catch {
      return false;
    }
  }, 20000);
  return {
    url,
    data,
    proc,
    log: () => err,
    kill: async () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
  };
}

async function account(url, discoverable = true) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const r = await post(`${url}/v1/account.register`, `{"route":${id.route(NET, url, 1, Date.now())},"certificate":${cert},"discoverable":${discoverable}}`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const session = async () => (await post(`${url}/v1/session.open`, id.sessionOpen(NET, url, Date.now()))).body.session;
  return { id, cert, url, session: await session(), reopen: session };
}

const publish = async (at, user) => {
  const r = await post(`${at}/v1/route.publish`, `{"route":${user.id.route(NET, user.url, 1, Date.now())}}`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
};
const send = (from, to, text, senderBoxes = false) => post(`${from.url}/v1/message.send`, from.id.message(NET, to.id.accountId(), `[${to.cert}]`, text, Date.now(), senderBoxes), from.session);
const status = async (user, id) => (await post(`${user.url}/v1/message.delivery.status`, { message_id: id }, user.session)).body;
const texts = async (user) => {
  const r = await post(`${user.url}/v1/message.timeline.sync`, { after: 0 }, await user.reopen());
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body.entries.map((e) => user.id.openEntry(JSON.stringify(e)));
};
const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'relay-edge-'));

/** A WebSocket of `user`'s session, with the frames it received. */
async function socket(user) {
  const ws = new WebSocket(`${user.url.replace('http', 'ws')}/v1/ws`, { headers: { authorization: `Bearer ${user.session}` } });
  const frames = [];
  ws.on('message', (d) => frames.push(JSON.parse(d.toString())));
  const closed = new Promise((resolve) => ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })));
  await new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  return { ws, frames, closed };
}

/** The core's counters from the admin listener (DATA/admin.url), by sample. */
async function metrics(data) {
  const admin = fs.readFileSync(path.join(data, 'admin.url'), 'utf8').trim();
  const text = await (await fetch(`${admin}/metrics`)).text();
  return new Map(text.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => [l.slice(0, l.lastIndexOf(' ')), Number(l.slice(l.lastIndexOf(' ') + 1))]));
}

test('relay-edge serve takes the flags of relay serve that apply on workerd', () => {
  const s = parseArgs(['--listen', '127.0.0.1:9100', '--policy', 'clock_tolerance=1000', '--shards', '4', '--attempt-timeout', '1500', '--max-in-flight-per-destination', '3', '--allow-private-peers']);
  assert.equal(s.listen, '127.0.0.1:9100');
  assert.deepEqual(s.policies, { clock_tolerance: 1000 });
  assert.equal(s.shards, 4);
  assert.deepEqual(s.engine, { attempt_timeout: 1500, max_in_flight_per_destination: 3 });
  assert.equal(s.allowPrivatePeers, true);
  assert.equal(parseArgs([]).data, '.relay-edge');
  assert.equal(parseArgs([]).adminListen, '127.0.0.1:0');
  assert.throws(() => parseArgs(['--policy', 'x=1.5']), /NAME=INTEGER/);
  assert.throws(() => parseArgs(['--shards', '0']), /positive integer/);
  assert.throws(() => parseArgs(['--tls-cert', 'c.pem']), /relay-edge does not take --tls-cert/);
  assert.throws(() => parseArgs(['--admin-listen', 'localhost']), /HOST:PORT/);
});

test('an edge relay: secrets and the admin door, self and local delivery, WebSocket notification, cross-relay delivery', async () => {
  const dir = tmp();
  const [pa, pb] = [await freePort(), await freePort()];
  const a = await edge(pa, path.join(dir, 'a'));
  const b = await edge(pb, path.join(dir, 'b'));
  try {
    // The data directory and its secrets, as the other hosts keep them.
    assert.equal(fs.statSync(a.data).mode & 0o777, 0o700);
    for (const f of ['relay.key', 'admin.token', 'admin.url']) assert.equal(fs.statSync(path.join(a.data, f)).mode & 0o777, 0o600, f);
    const wk = await (await fetch(`${a.url}/.well-known/relay`)).json();
    assert.equal(wk.relay, a.url);
    // The operator API only on the admin door, with the token from admin.token.
    const token = fs.readFileSync(path.join(a.data, 'admin.token'), 'utf8').trim();
    assert.equal((await post(`${a.url}/admin/v1/deliveries`, {}, token)).status, 404);
    const admin = fs.readFileSync(path.join(a.data, 'admin.url'), 'utf8').trim();
    assert.equal((await post(`${admin}/admin/v1/deliveries`, {}, token)).status, 200);
    assert.equal((await post(`${admin}/admin/v1/deliveries`, {}, 'nope')).status, 401);
    assert.equal((await fetch(`${admin}/readyz`)).status, 200);
    // What the host refuses on its own is the core's answer, as on every host: a body over
    // max_request_bytes, and GET /v1/ws that does not ask to upgrade.
    const big = await fetch(`${a.url}/v1/route.get`, { method: 'POST', body: 'x'.repeat(300000) });
    const want = RelayCore.refused('too_large', 262144);
    assert.equal(big.status, 413);
    assert.equal(await big.text(), Buffer.from(want.body).toString());
    // The health checks answer GET (and HEAD) in the core's words; another method is no endpoint.
    assert.equal(await (await fetch(`${a.url}/readyz`)).text(), 'ready\n');
    assert.equal((await fetch(`${a.url}/readyz`, { method: 'HEAD' })).status, 200);
    assert.equal((await fetch(`${a.url}/readyz`, { method: 'POST', body: '{}' })).status, 404);
    assert.equal((await fetch(`${admin}/metrics`, { method: 'POST', body: '{}' })).status, 404);
    const plain = await fetch(`${a.url}/v1/ws?session=x`);
    assert.equal(plain.status, 404);
    assert.equal(await plain.text(), '{"error":{"code":"not_found","message":"no such endpoint"}}');

    const alice = await account(a.url);
    const bob = await account(a.url);
    const carol = await account(b.url);
    // Self delivery: target_accepted at once.
    const self = await send(alice, alice, 'note to self');
    assert.equal(self.body.status, 'target_accepted', JSON.stringify(self.body));
    // Local delivery, told to bob's WebSocket.
    const sock = await socket(bob);
    const local = await send(alice, bob, 'next door');
    assert.equal(local.status, 200, JSON.stringify(local.body));
    await eventually(async () => (await status(alice, local.body.message_id)).status === 'target_accepted');
    const note = await eventually(() => sock.frames.find((f) => f.method === 'message.timeline.changed'));
    assert.equal(note.params.account, bob.id.accountId());
    // A call over the socket.
    sock.ws.send(JSON.stringify({ id: 7, method: 'message.timeline.sync', params: { after: 0 } }));
    const page = await eventually(() => sock.frames.find((f) => f.id === 7));
    assert.deepEqual(page.result.entries.map((e) => bob.id.openEntry(JSON.stringify(e))), ['next door']);
    sock.ws.close();
    // Across relays: A delivers to B by relay RPC (B fetches A's key).
    await publish(a.url, carol);
    const far = await send(alice, carol, 'edge to edge');
    assert.equal(far.status, 200, JSON.stringify(far.body));
    await eventually(async () => (await status(alice, far.body.message_id)).status === 'target_accepted');
    assert.deepEqual(await texts(carol), ['edge to edge']);
  } finally {
    await a.kill();
    await b.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('killed with SIGKILL mid-delivery and started again over its data, the relay finishes the delivery once', async () => {
  const dir = tmp();
  const [pa, pb] = [await freePort(), await freePort()];
  let a = await edge(pa, path.join(dir, 'a'));
  let b = await edge(pb, path.join(dir, 'b'));
  try {
    const alice = await account(a.url);
    const bob = await account(b.url);
    await publish(a.url, bob);
    await b.kill();
    const m = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'survives kill -9', Date.now(), false);
    const sent = await post(`${a.url}/v1/message.send`, m, alice.session);
    assert.equal(sent.body.status, 'delivering', JSON.stringify(sent.body));
    await sleep(700);
    await a.kill();
    b = await edge(pb, path.join(dir, 'b'));
    a = await edge(pa, path.join(dir, 'a'));
    const id = JSON.parse(m).envelope.message_id;
    await eventually(async () => (await status(alice, id)).status === 'target_accepted', 20000);
    assert.equal((await post(`${a.url}/v1/message.send`, m, alice.session)).body.status, 'target_accepted');
    assert.deepEqual(await texts(bob), ['survives kill -9']);
  } finally {
    await a.kill();
    await b.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('an object holds at most six outbound connections at once (Workers\' limit); the rest wait their turn and go', async () => {
  const dir = tmp();
  const a = await edge(await freePort(), path.join(dir, 'a'));
  // A peer that holds each request 600 ms, then answers unavailable (the sender retries later).
  let open = 0;
  let most = 0;
  let seen = 0;
  const slow = http.createServer((req, res) => {
    req.resume();
    open += 1;
    seen += 1;
    most = Math.max(most, open);
    setTimeout(() => {
      open -= 1;
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end('{"error":{"code":"unavailable","message":"busy"}}');
    }, 600);
  });
  await new Promise((r) => slow.listen(0, '127.0.0.1', r));
  try {
    const alice = await account(a.url);
    const url = `http://127.0.0.1:${slow.address().port}`;
    for (let i = 0; i < 10; i += 1) {
      const ghost = new Identity();
      const r = await post(`${a.url}/v1/route.publish`, `{"route":${ghost.route(NET, url, 1, Date.now())}}`);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const cert = ghost.certificate(NET, 'send,sync,manage', Date.now() - 1000);
      const s = await post(`${a.url}/v1/message.send`, alice.id.message(NET, ghost.accountId(), `[${cert}]`, `to ${i}`, Date.now(), false), alice.session);
      assert.equal(s.body.status, 'delivering', JSON.stringify(s.body));
    }
    // Ten first attempts at once to one peer (16 may be in flight per destination): six
    // connections, then the other four as turns come free.
    await eventually(() => seen >= 10, 15000);
    assert.ok(most <= 6, `${most} connections at once`);
    assert.equal(most, 6, 'the six turns were used');
  } finally {
    slow.close();
    await a.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('an object evicted mid-attempt retries the same bytes after it starts again, and the message is delivered once', async () => {
  const dir = tmp();
  const [pa, pb, pp] = [await freePort(), await freePort(), await freePort()];
  // b's relay id is the proxy's URL: the proxy holds b's first delivery unanswered (the
  // attempt in flight when a is evicted) and passes everything else on to b.
  const proxyUrl = `http://127.0.0.1:${pp}`;
  const b = await edge(pb, path.join(dir, 'b'), ['--url', proxyUrl]);
  let a = await edge(pa, path.join(dir, 'a'));
  /** @type {Buffer | null} */
  let held = null;
  const delivered = [];
  const proxy = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    if (req.url === '/relay/v1/message.deliver') {
      if (!held) {
        held = body;
        return; // never answered
      }
      delivered.push(body);
    }
    const headers = Object.fromEntries(Object.entries(req.headers).filter(([k]) => !['host', 'connection', 'content-length'].includes(k)));
    const r = await fetch(`${b.url}${req.url}`, { method: req.method, headers, body: req.method === 'POST' ? body : undefined });
    res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'application/json' });
    res.end(Buffer.from(await r.arrayBuffer()));
  });
  await new Promise((r) => proxy.listen(pp, '127.0.0.1', r));
  try {
    const alice = await account(a.url);
    const bob = await account(proxyUrl);
    await publish(a.url, bob);
    const m = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'outlives its object', Date.now(), false);
    const sent = await post(`${a.url}/v1/message.send`, m, alice.session);
    assert.equal(sent.body.status, 'delivering', JSON.stringify(sent.body));
    await eventually(() => held !== null, 10000);
    // Evicted with the attempt in flight: the object, its waitUntil and its fetch are gone.
    await a.kill();
    a = await edge(pa, path.join(dir, 'a'));
    const id = JSON.parse(m).envelope.message_id;
    await eventually(async () => (await status(alice, id)).status === 'target_accepted', 20000);
    assert.ok(delivered.length >= 1);
    for (const body of delivered) assert.ok(body.equals(held), 'a retry carries the bytes of the attempt in flight');
    assert.deepEqual(await texts(bob), ['outlives its object']);
  } finally {
    proxy.closeAllConnections?.();
    proxy.close();
    await a.kill();
    await b.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a peer that refuses the connection is not attempted; one that answers after connecting is', async () => {
  const dir = tmp();
  const a = await edge(await freePort(), path.join(dir, 'a'));
  // A port nobody listens on, then a server that takes the request and drops the connection.
  const refused = await freePort();
  const dropping = net.createServer((s) => {
    s.on('error', () => {});
    s.once('data', () => s.destroy());
  });
  await new Promise((r) => dropping.listen(0, '127.0.0.1', r));
  try {
    const alice = await account(a.url);
    for (const port of [refused, dropping.address().port]) {
      const ghost = new Identity();
      const url = `http://127.0.0.1:${port}`;
      const r = await post(`${a.url}/v1/route.publish`, `{"route":${ghost.route(NET, url, 1, Date.now())}}`);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const cert = ghost.certificate(NET, 'send,sync,manage', Date.now() - 1000);
      const s = await post(`${a.url}/v1/message.send`, alice.id.message(NET, ghost.accountId(), `[${cert}]`, 'anyone?', Date.now(), false), alice.session);
      assert.equal(s.body.status, 'delivering', JSON.stringify(s.body));
    }
    const m = await eventually(async () => {
      const m = await metrics(a.data);
      return m.get('relay_delivery_attempts_total{outcome="not_attempted"}') >= 1 && m.get('relay_delivery_attempts_total{outcome="unknown"}') >= 1 ? m : null;
    });
    assert.ok(m.get('relay_delivery_attempts_total{outcome="not_attempted"}') >= 1);
    // The audit trail on workerd: an operator action is one JSON line in the relay's log.
    const token = fs.readFileSync(path.join(a.data, 'admin.token'), 'utf8').trim();
    const admin = fs.readFileSync(path.join(a.data, 'admin.url'), 'utf8').trim();
    const dest = `http://127.0.0.1:${refused}`;
    const paused = await post(`${admin}/admin/v1/destination.pause`, { destination: dest }, token);
    assert.equal(paused.status, 200, JSON.stringify(paused.body));
    const line = await eventually(() => a.log().split('\n').find((l) => l.includes('"event":"operator_action"')));
    const audit = JSON.parse(line.slice(line.indexOf('{')));
    assert.deepEqual(audit, { event: 'operator_action', who: 'admin listener', action: 'destination.pause', subject: dest, touched: 1 });
  } finally {
    dropping.close();
    await a.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('WebSockets survive the object hibernating: after it was evicted, a notification still reaches them; an expired session is closed 4401', async () => {
  const dir = tmp();
  const a = await edge(await freePort(), path.join(dir, 'a'), ['--policy', 'session_ttl=15000']);
  try {
    const alice = await account(a.url);
    const bob = await account(a.url);
    const sock = await socket(bob);
    // workerd evicts an object idle for 10 s; its hibernatable sockets stay open.
    await sleep(11_000);
    const r = await send(alice, bob, 'after hibernation');
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const note = await eventually(() => sock.frames.find((f) => f.method === 'message.timeline.changed'));
    assert.equal(note.params.account, bob.id.accountId());
    sock.ws.send(JSON.stringify({ id: 1, method: 'message.timeline.sync', params: { after: 0 } }));
    const page = await eventually(() => sock.frames.find((f) => f.id === 1));
    assert.equal(page.result.entries.length, 1);
    // The session ends 15 s after it opened: the alarm closes its socket.
    const closed = await Promise.race([sock.closed, sleep(10_000).then(() => null)]);
    assert.deepEqual(closed, { code: 4401, reason: 'session expired' });
  } finally {
    await a.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('four shards: accounts spread over four objects, deliveries between shards, metrics per shard', { skip: !SHARDED && 'this core has no shards' }, async () => {
  const dir = tmp();
  const a = await edge(await freePort(), path.join(dir, 'a'), ['--shards', '4']);
  try {
    const users = [];
    for (let i = 0; i < 6; i += 1) users.push(await account(a.url));
    const sent = [];
    for (let i = 0; i < 6; i += 1) {
      const r = await send(users[i], users[(i + 1) % 6], `m${i}`);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      sent.push(r.body.message_id);
    }
    for (let i = 0; i < 6; i += 1) await eventually(async () => (await status(users[i], sent[i])).status === 'target_accepted', 15000);
    for (let i = 0; i < 6; i += 1) assert.deepEqual(await texts(users[(i + 1) % 6]), [`m${i}`]);
    const objects = fs.readdirSync(path.join(a.data, 'objects/relay-shard')).filter((f) => f.endsWith('.sqlite') && f !== 'metadata.sqlite');
    assert.ok(objects.length >= 2 && objects.length <= 4, `six accounts over ${objects.length} of the four objects`);
    const m = await metrics(a.data);
    assert.ok([...m.keys()].some((k) => k.includes('shard="0"')), 'samples carry their shard');
  } finally {
    await a.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a trap on workerd is a WebAssembly.RuntimeError, and reset() gives a fresh instance whose core opens the same storage', async () => {
  const dir = tmp();
  const port = await freePort();
  const rel = (f) => JSON.stringify(path.relative(dir, new URL(f, import.meta.url).pathname));
  fs.writeFileSync(path.join(dir, 'trap.capnp'), `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [(name = "trap", worker = (compatibilityDate = "2026-11-17", modules = [
    (name = "test/trap-worker.js", esModule = embed ${rel('./trap-worker.js')}),
    (name = "src/edge/core.js", esModule = embed ${rel('../../host-node/src/edge/core.js')}),
    (name = "src/kit/step.js", esModule = embed ${rel('../../host-node/src/kit/step.js')}),
    (name = "pkg/web/relay_wasm.js", esModule = embed ${rel('../../host-node/pkg/web/relay_wasm.js')}),
    (name = "pkg/web/relay_wasm_bg.wasm", wasm = embed ${rel('../../host-node/pkg/web/relay_wasm_bg.wasm')}),
  ]))],
  sockets = [(name = "http", address = "127.0.0.1:${port}", http = (), service = "trap")],
);
`);
  const bin = String(/** @type {any} */ (workerdPackage).default ?? workerdPackage);
  const proc = spawn(bin, ['serve', path.join(dir, 'trap.capnp')], { stdio: ['ignore', 'ignore', 'inherit'] });
  try {
    const r = await eventually(async () => {
      try {
        return await (await fetch(`http://127.0.0.1:${port}/`)).json();
      } catch {
        return null;
      }
    });
    assert.deepEqual(r.trap, { runtimeError: true, message: 'memory access out of bounds' });
    assert.equal(r.after.generation, r.before.generation + 1);
    assert.equal(r.after.relay, r.before.relay);
    assert.deepEqual(r.after.tick.events, []);
    assert.ok(r.keys > 0, 'the first core wrote its schema; the fresh one opened it');
  } finally {
    proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
