// Operating a relay (issue 21): metrics that agree with what happened, health checks, the
// admin listener, structured logs, and the store's schema version.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { createRelay, serve, RelayThread, SqliteStorage, Log } from '../src/index.js';
import { Identity } from '../pkg/relay_wasm.js';
import { NET, post, eventually, register, as, freePort } from './helpers.js';

const BIN = new URL('../bin/relay-node.js', import.meta.url).pathname;


const tmp = (name) => fs.mkdtempSync(path.join(os.tmpdir(), `relay-node-${name}-`));

/** A served relay over SQLite in a fresh data directory; its id carries the port, so bind first. */
async function served(mode, { policies = {}, log } = {}) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const data = tmp('ops');
  const opts = { relay: url, policies, data, ...(log ? { log } : {}) };
  const relay = mode === 'relay thread' ? await RelayThread.start(opts) : await createRelay(opts);
  const srv = await serve(relay, { host: '127.0.0.1', port });
  const token = fs.readFileSync(path.join(data, 'admin.token'), 'utf8').trim();
  return { relay, srv, url, data, token, admin: srv.adminUrl };
}

async function stop(r) {
  await r.srv.close();
  fs.rmSync(r.data, { recursive: true, force: true });
}

async function account(url, discoverable = true) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const r = await post(`${url}/v1/account.register`, `{"route":${id.route(NET, url, 1, Date.now())},"certificate":${cert},"discoverable":${discoverable}}`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const s = await post(`${url}/v1/session.open`, id.sessionOpen(NET, url, Date.now()));
  assert.equal(s.status, 200, JSON.stringify(s.body));
  return { id, cert, url, session: s.body.session };
}

/** message.send params from `from` to `to` (a fresh message id each time). */
const message = (from, to, text) => from.id.message(NET, to.id.accountId(), `[${to.cert}]`, text, Date.now(), false);

/**
 * The samples of a Prometheus text exposition, by `name{labels}` as written; every family
 * announced by TYPE is listed in `types`.
 */
function parseMetrics(text) {
  /** @type {Map<string, number>} */
  const samples = new Map();
  /** @type {Map<string, string>} */
  const types = new Map();
  for (const line of text.split('\n')) {
    if (line === '') continue;
    const t = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (t) {
      assert.ok(!types.has(t[1]), `family ${t[1]} announced twice`);
      types.set(t[1], t[2]);
      continue;
    }
    if (line.startsWith('#')) continue;
    const m = /^(\S+?(?:\{.*\})?) (\S+)$/.exec(line);
    assert.ok(m, `not a sample line: ${line}`);
    samples.set(m[1], Number(m[2]));
  }
  return { samples, types };
}

/** The samples of one family (`name` and its labelled series), as `{labels-or-'': value}`. */
function family(samples, name) {
  const out = {};
  for (const [k, v] of samples) {
    if (k === name) out[''] = v;
    else if (k.startsWith(`${name}{`)) out[k.slice(name.length)] = v;
  }
  return out;
}

async function scrape(admin) {
  const res = await fetch(`${admin}/metrics`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  return parseMetrics(await res.text());
}

const UNREACHABLE = 'http://127.0.0.1:9';

for (const mode of ['in-process', 'relay thread']) {
  test(`/metrics agrees with a known mix: local, cross-relay, refused, rate-limited, a failing and an unreachable destination (${mode})`, async () => {
    const lines = [];
    // Logs are captured where the relay runs on this thread; a relay thread logs its own.
    const log = mode === 'in-process' ? new Log({ format: 'json', level: 'info', write: (l) => lines.push(JSON.parse(l)) }) : undefined;
    // Five sends a minute; a retry waits a minute, so the unreachable destination sees one attempt.
    const a = await served(mode, { policies: { send_rate: 5, retry_initial: 60000, retry_max: 120000 }, log });
    const b = await served(mode);
    const alice = await account(a.url);
    const carol = await account(a.url);
    const bob = await account(b.url);
    const dora = await account(b.url, false); // refuses messages without an authorization
    const erin = new Identity();
    const erinCard = { id: erin, cert: erin.certificate(NET, 'send,sync,manage', Date.now() - 1000) };
    for (const route of [bob.id.route(NET, b.url, 1, Date.now()), dora.id.route(NET, b.url, 1, Date.now()), erin.route(NET, UNREACHABLE, 1, Date.now())]) {
      assert.equal((await post(`${a.url}/v1/route.publish`, `{"route":${route}}`)).status, 200);
    }
    // One open WebSocket at A.
    const ws = new WebSocket(`${a.url.replace('http', 'ws')}/v1/ws`, { headers: { authorization: `Bearer ${carol.session}` } });
    await new Promise((resolve, reject) => {
      ws.on('open', resolve);
      ws.on('error', reject);
    });

    const send = async (to, text) => {
      const m = message(alice, to, text);
      const r = await post(`${a.url}/v1/message.send`, m, alice.session);
      return { ...r, id: JSON.parse(m).envelope.message_id };
    };
    assert.equal((await send(alice, 'a note')).body.status, 'target_accepted', 'self');
    assert.equal((await send(carol, 'local')).body.status, 'target_accepted', 'local');
    const toBob = await send(bob, 'cross');
    assert.equal(toBob.status, 200, JSON.stringify(toBob.body));
    const toDora = await send(dora, 'refused there');
    assert.equal(toDora.status, 200, JSON.stringify(toDora.body));
    const toErin = await send(erinCard, 'nobody home');
    assert.equal(toErin.body.status, 'delivering');
    const bad = JSON.parse(message(alice, carol, 'bad'));
    delete bad.recipient_boxes;
    const refused = await post(`${a.url}/v1/message.send`, bad, alice.session);
    assert.equal(refused.body.error?.code, 'invalid_params');
    const limited = await send(carol, 'one too many');
    assert.equal(limited.status, 429);
    assert.equal(limited.body.error.code, 'rate_limited');

    const statusOf = async (id) => (await post(`${a.url}/v1/message.delivery.status`, { message_id: id }, alice.session)).body;
    await eventually(async () => (await statusOf(toBob.id)).status === 'target_accepted');
    const doraStatus = await eventually(async () => {
      const s = await statusOf(toDora.id);
      return s.status === 'failed' ? s : null;
    });
    assert.equal(doraStatus.error.code, 'discovery_disabled');
    // The unreachable destination's one attempt has come back.
    const { samples, types } = await eventually(async () => {
      const m = await scrape(a.admin);
      return m.samples.get('relay_delivery_attempts_total{outcome="not_attempted"}') === 1 ? m : null;
    });

    // Every core counter, exactly.
    assert.deepEqual(family(samples, 'relay_messages_accepted_total'), { '{kind="cross"}': 3, '{kind="local"}': 1, '{kind="self"}': 1 });
    assert.deepEqual(family(samples, 'relay_messages_rejected_total'), { '{code="invalid_params"}': 1, '{code="rate_limited"}': 1 });
    assert.deepEqual(family(samples, 'relay_delivery_attempts_total'), { '{outcome="accepted"}': 1, '{outcome="not_attempted"}': 1, '{outcome="rejected"}': 1 });
    assert.deepEqual(family(samples, 'relay_deliveries_delivered_total'), { '': 2 }, 'the local and the cross delivery');
    assert.deepEqual(family(samples, 'relay_deliveries_failed_total'), { '{code="discovery_disabled"}': 1 });
    assert.deepEqual(family(samples, 'relay_rate_limited_total'), { '{method="message.send"}': 1 });
    assert.deepEqual(family(samples, 'relay_tick_entries_quarantined_total'), { '': 0 });
    // One pending, none out: per-destination detail is admin.destinations, not a label.
    assert.deepEqual(family(samples, 'relay_deliveries_pending'), { '': 1 });
    assert.deepEqual(family(samples, 'relay_in_flight_attempts'), { '': 0 });
    assert.ok(samples.get('relay_oldest_pending_delivery_age_seconds') >= 0);
    // The host's own.
    assert.equal(samples.get('relay_open_websockets'), 1);
    assert.ok(samples.get('relay_open_connections') >= 1);
    assert.equal(samples.get('relay_guest_traps_total'), 0);
    assert.equal(samples.get('relay_core_restarts_total'), 0);
    assert.equal(samples.get('relay_attempt_duration_seconds_count{outcome="answered"}'), 1);
    assert.equal(samples.get('relay_attempt_duration_seconds_count{outcome="rejected"}'), 1);
    assert.equal(samples.get('relay_attempt_duration_seconds_count{outcome="not_attempted"}'), 1);
    assert.equal(samples.get('relay_attempt_duration_seconds_count{outcome="unknown"}'), 0);
    assert.equal(samples.get('relay_attempt_duration_seconds_bucket{le="+Inf",outcome="answered"}'), 1);
    assert.ok(samples.get('relay_commit_group_size_count') >= 1, 'commits were counted');
    assert.ok(samples.get('relay_commit_group_size_sum') >= samples.get('relay_commit_group_size_count'));
    assert.ok(samples.get('relay_commit_duration_seconds_count') === samples.get('relay_commit_group_size_count'));
    assert.ok(samples.get('relay_tick_duration_seconds_count') >= 0);
    for (const [name, type] of [
      ['relay_attempt_duration_seconds', 'histogram'],
      ['relay_commit_group_size', 'histogram'],
      ['relay_commit_duration_seconds', 'histogram'],
      ['relay_guest_traps_total', 'counter'],
      ['relay_core_restarts_total', 'counter'],
      ['relay_open_connections', 'gauge'],
      ['relay_open_websockets', 'gauge'],
      ['relay_tick_duration_seconds', 'histogram'],
      ['relay_messages_accepted_total', 'counter'],
      ['relay_deliveries_pending', 'gauge'],
      ['relay_oldest_pending_delivery_age_seconds', 'gauge'],
    ]) {
      assert.equal(types.get(name), type, name);
    }
    // B received the one message it took, and refused the other.
    const atB = (await scrape(b.admin)).samples;
    assert.deepEqual(family(atB, 'relay_messages_accepted_total'), { '{kind="received"}': 1 });
    assert.deepEqual(family(atB, 'relay_messages_rejected_total'), { '{code="discovery_disabled"}': 1 });
    assert.equal(atB.get('relay_open_websockets'), 0);

    ws.close();
    await eventually(async () => (await scrape(a.admin)).samples.get('relay_open_websockets') === 0);

    if (log) {
      // One structured line per accepted message, and per terminal outcome: ids, never bodies.
      const events = lines.filter((l) => l.event);
      const accepted = events.filter((e) => e.event === 'accepted' && e.method === 'message.send');
      assert.equal(accepted.length, 5);
      for (const e of accepted) {
        assert.deepEqual(Object.keys(e).sort(), ['event', 'from', 'level', 'message_id', 'method', 'status', 'timestamp', 'to']);
        assert.equal(e.from, alice.id.accountId());
      }
      assert.deepEqual(
        accepted.map((e) => [e.to, e.status]),
        [
          [alice.id.accountId(), 'target_accepted'],
          [carol.id.accountId(), 'target_accepted'],
          [bob.id.accountId(), 'delivering'],
          [dora.id.accountId(), 'delivering'],
          [erin.accountId(), 'delivering'],
        ],
      );
      const ended = events.filter((e) => e.event === 'delivery_ended');
      const byId = Object.fromEntries(ended.map((e) => [e.message_id, e]));
      assert.deepEqual(byId[toBob.id], { ...byId[toBob.id], from: alice.id.accountId(), to: bob.id.accountId(), status: 'target_accepted', error_code: null });
      assert.deepEqual(byId[toDora.id], { ...byId[toDora.id], from: alice.id.accountId(), to: dora.id.accountId(), status: 'failed', error_code: 'discovery_disabled' });
      assert.equal(byId[toErin.id], undefined, 'still pending');
      for (const l of lines) {
        assert.equal(typeof l.timestamp, 'string');
        assert.match(l.level, /^(ERROR|WARN|INFO|DEBUG)$/);
        assert.ok(!('body' in l) && !('envelope' in l) && !('params' in l), JSON.stringify(l));
      }
    }
    await stop(a);
    await stop(b);
  });

  test(`/healthz and /readyz on both listeners; the admin API only on the admin listener, with the token (${mode})`, async () => {
    const a = await served(mode);
    assert.equal(fs.readFileSync(path.join(a.data, 'admin.url'), 'utf8').trim(), a.admin, 'admin.url names the admin listener');
    assert.match(a.admin, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.notEqual(a.admin, a.url);
    for (const base of [a.url, a.admin]) {
      const h = await fetch(`${base}/healthz`);
      assert.equal(h.status, 200);
      assert.equal((await h.text()).trim(), 'ok');
      const r = await fetch(`${base}/readyz`);
      assert.equal(r.status, 200);
      assert.equal((await r.text()).trim(), 'ready');
    }
    const deliveries = (base, token) =>
      fetch(`${base}/admin/v1/deliveries`, { method: 'POST', headers: { authorization: `Bearer ${token}` }, body: '{}' });
    const onPublic = await deliveries(a.url, a.token);
    assert.equal(onPublic.status, 404, 'no admin API on the public port');
    assert.equal((await onPublic.json()).error.code, 'not_found');
    assert.equal((await fetch(`${a.url}/metrics`)).status, 404, 'no metrics on the public port');
    const wrong = await deliveries(a.admin, `${a.token.slice(0, -1)}${a.token.endsWith('A') ? 'B' : 'A'}`);
    assert.equal(wrong.status, 401);
    assert.equal((await wrong.json()).error.code, 'unauthenticated');
    assert.equal((await deliveries(a.admin, 'short')).status, 401);
    assert.equal((await fetch(`${a.admin}/admin/v1/deliveries`, { method: 'POST', body: '{}' })).status, 401, 'no token');
    const ok = await deliveries(a.admin, a.token);
    assert.equal(ok.status, 200, await ok.clone().text());
    assert.ok(Array.isArray((await ok.json()).deliveries));
    // Not ready once shutting down.
    await a.srv.close();
    assert.equal((await a.relay.ready()).ready, false);
    assert.equal(fs.existsSync(path.join(a.data, 'admin.url')), false, 'a clean stop takes admin.url away');
    fs.rmSync(a.data, { recursive: true, force: true });
  });
}

test('/readyz answers 503 when the storage is closed, and a trap is counted and restarts the core', async () => {
  const a = await served('in-process');
  const alice = await account(a.url);
  a.relay.core.inner.handle = () => {
    throw new WebAssembly.RuntimeError('unreachable');
  };
  const r = await post(`${a.url}/v1/message.send`, message(alice, alice, 'x'), alice.session);
  assert.equal(r.body.error.code, 'internal');
  const { samples } = await scrape(a.admin);
  assert.equal(samples.get('relay_guest_traps_total'), 1);
  assert.equal(samples.get('relay_core_restarts_total'), 1);
  assert.equal((await fetch(`${a.url}/readyz`)).status, 200, 'the fresh instance serves');
  a.relay.storage.db.close();
  for (const base of [a.url, a.admin]) {
    const res = await fetch(`${base}/readyz`);
    assert.equal(res.status, 503);
    assert.equal(await res.text(), 'not ready: the storage refused the last commit\n');
    assert.equal((await fetch(`${base}/healthz`)).status, 200, 'still live');
  }
  await a.srv.close();
  fs.rmSync(a.data, { recursive: true, force: true });
});

test('two relays in one process keep their metrics apart', async () => {
  const a = await served('in-process');
  const b = await served('in-process');
  const alice = await account(a.url);
  assert.equal((await post(`${a.url}/v1/message.send`, message(alice, alice, 'x'), alice.session)).status, 200);
  assert.equal((await scrape(a.admin)).samples.get('relay_messages_accepted_total{kind="self"}'), 1);
  assert.equal((await scrape(b.admin)).samples.get('relay_messages_accepted_total{kind="self"}'), undefined);
  await stop(a);
  await stop(b);
});

/** A data directory whose store says it was written by schema version 2. */
function newerStore() {
  const dir = tmp('newer');
  const s = new SqliteStorage(path.join(dir, 'relay.sqlite'));
  s.commit([[Buffer.from('meta/schema'), Buffer.from('2')]]);
  s.close();
  return dir;
}

test('a store written by a newer relay (meta/schema "2") is refused: createRelay, a relay thread and relay-node serve', async () => {
  const dir = newerStore();
  await assert.rejects(createRelay({ relay: 'http://127.0.0.1:1', data: dir }), /written by a newer relay \(schema version 2; this relay reads up to 1\)/);
  // The refused store was let go of: a second try gets the same answer, not a lock error.
  await assert.rejects(RelayThread.start({ relay: 'http://127.0.0.1:1', data: dir }), /newer relay/);
  const port = await freePort();
  const child = spawn(process.execPath, [BIN, 'serve', '--listen', `127.0.0.1:${port}`, '--data', dir], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  const code = await new Promise((resolve) => child.on('exit', resolve));
  assert.notEqual(code, 0);
  assert.match(err, /newer relay/);
  // A current store is left as it was, with its version recorded.
  const fresh = tmp('fresh');
  const r = await createRelay({ relay: 'http://127.0.0.1:1', data: fresh });
  await r.close();
  const s = new SqliteStorage(path.join(fresh, 'relay.sqlite'));
  assert.equal(Buffer.from(s.get(Buffer.from('meta/schema'))).toString(), '1');
  s.close();
  fs.rmSync(dir, { recursive: true });
  fs.rmSync(fresh, { recursive: true });
});

test('relay-node serve --log-format json: every line is one JSON object', async (t) => {
  const port = await freePort();
  const data = tmp('json');
  const child = spawn(process.execPath, [BIN, 'serve', '--listen', `127.0.0.1:${port}`, '--data', data, '--log-format', 'json'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RELAY_LOG: 'info' },
  });
  t.after(() => child.kill('SIGKILL'));
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const url = `http://127.0.0.1:${port}`;
  await eventually(async () => {
    try {
      return (await fetch(`${url}/healthz`)).ok;
    } catch {
      return false;
    }
  });
  const alice = await account(url);
  assert.equal((await post(`${url}/v1/message.send`, message(alice, alice, 'secret words'), alice.session)).status, 200);
  await eventually(() => out.includes('"event":"accepted"'));
  // The operator's CLI finds the admin listener through admin.url.
  const admin = (...args) => new Promise((resolve) => execFile(process.execPath, [BIN, 'admin', '--data', data, ...args], (e, stdout) => resolve({ code: e?.code ?? 0, stdout })));
  const listed = await admin('--json', 'deliveries', 'pending');
  assert.equal(listed.code, 0);
  assert.deepEqual(JSON.parse(listed.stdout).deliveries, []);
  // Without --json, the table relay admin prints.
  const table = await admin('deliveries', 'pending');
  assert.equal(table.code, 0);
  assert.match(table.stdout, /^DESTINATION +FROM +MESSAGE +STATE/);
  assert.match(table.stdout, /^\(0 deliveries\)$/m);
  const scraped = await admin('metrics');
  assert.equal(scraped.code, 0);
  assert.match(scraped.stdout, /^relay_messages_accepted_total\{kind="self"\} 1$/m);
  const adminUrl = fs.readFileSync(path.join(data, 'admin.url'), 'utf8').trim();
  child.kill('SIGTERM');
  assert.equal(await new Promise((resolve) => child.on('exit', resolve)), 0);
  const lines = out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
  assert.ok(lines.some((l) => l.admin_url === adminUrl), 'the admin URL is logged');
  assert.ok(lines.some((l) => l.event === 'accepted' && l.to === alice.id.accountId() && l.status === 'target_accepted'));
  assert.ok(!out.includes('secret words') && !out.includes('"envelope"'), 'ids only');
  assert.ok(lines.some((l) => /shutting down/.test(l.message ?? '')));
  fs.rmSync(data, { recursive: true });
});

test('a tick entry the core sets aside is logged at warn and counted', async () => {
  const lines = [];
  const log = new Log({ format: 'json', level: 'info', write: (l) => lines.push(JSON.parse(l)) });
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', storage: 'memory', policies: { retry_initial: 50, retry_max: 100 }, log });
  const alice = register(relay);
  const erin = new Identity();
  const far = { id: erin, cert: erin.certificate(NET, 'send,sync,manage', Date.now() - 1000) };
  assert.equal(relay.call({ kind: 'anonymous' }, 'route.publish', `{"route":${erin.route(NET, UNREACHABLE, 1, Date.now())}}`).status, 200);
  let attempts = 0;
  const exchange = relay.exchange.bind(relay);
  relay.exchange = (...x) => {
    attempts += 1;
    return exchange(...x);
  };
  const m = message(alice, far, 'never');
  assert.equal(relay.call(as(alice), 'message.send', m).body.status, 'delivering');
  await eventually(() => attempts >= 1 && relay.inflight.size === 0);
  // The task's record goes bad in storage: the next tick cannot process its due entry.
  const id = JSON.parse(m).envelope.message_id;
  relay.storage.commit([[Buffer.from(`task/${alice.id.accountId()}.${id}`), Buffer.from('{not a task')]]);
  const warn = await eventually(() => lines.find((l) => l.level === 'WARN' && /quarantined/.test(l.message)));
  assert.ok(warn.entry.startsWith('due/') && warn.entry.endsWith(id), JSON.stringify(warn));
  assert.equal(warn.code, 'internal');
  assert.match(await relay.metricsText(), /^relay_tick_entries_quarantined_total 1$/m);
  await relay.close();
});

test('every operator action is an audit log line: who, what, which destination, how many deliveries', async () => {
  const lines = [];
  // JSON, and text at info (where per-message events are off): the audit line is in both.
  const log = new Log({ format: 'json', level: 'info', write: (l) => lines.push(JSON.parse(l)) });
  const quiet = new Log({ format: 'text', level: 'info', write: (l) => lines.push({ text: l }) });
  for (const [l, expectJson] of [[log, true], [quiet, false]]) {
    lines.length = 0;
    const relay = await createRelay({ relay: 'http://127.0.0.1:1', storage: 'memory', log: l });
    const alice = register(relay);
    const erin = new Identity();
    const far = { id: erin, cert: erin.certificate(NET, 'send,sync,manage', Date.now() - 1000) };
    assert.equal(relay.call({ kind: 'anonymous' }, 'route.publish', `{"route":${erin.route(NET, UNREACHABLE, 1, Date.now())}}`).status, 200);
    assert.equal(relay.call(as(alice), 'message.send', message(alice, far, 'held')).status, 200);
    const act = (method) => relay.call({ kind: 'operator' }, `admin.destination.${method}`, JSON.stringify({ destination: UNREACHABLE }));
    assert.equal(act('pause').status, 200);
    assert.equal(act('resume').status, 200);
    assert.equal(relay.call({ kind: 'operator' }, 'admin.destination.pause', '{"destination":"https://nobody.example"}').status, 404);
    if (expectJson) {
      const audit = lines.filter((x) => x.event === 'operator_action').map(({ level, message, who, action, subject, touched }) => ({ level, message, who, action, subject, touched }));
      const line = (action) => ({ level: 'INFO', message: 'operator action', who: 'admin listener', action, subject: UNREACHABLE, touched: 1 });
      assert.deepEqual(audit, [line('destination.pause'), line('destination.resume')]);
    } else {
      const audit = lines.map((x) => x.text).filter((t) => / INFO operator action /.test(t));
      assert.equal(audit.length, 2, lines.map((x) => x.text).join('\n'));
      assert.match(audit[0], new RegExp(`event=operator_action who=admin listener action=destination.pause subject=${UNREACHABLE} touched=1$`));
      assert.match(audit[1], new RegExp(`action=destination.resume subject=${UNREACHABLE} touched=1$`));
    }
    await relay.close();
  }
});

test('a failed group commit makes the relay not ready until a commit succeeds again', async () => {
  const data = tmp('commit');
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', data });
  const alice = register(relay);
  const tx = relay.storage.tx;
  relay.storage.tx = () => {
    throw new Error('disk full');
  };
  const failed = await relay.callGrouped(as(alice), 'message.send', message(alice, alice, 'lost'));
  assert.equal(failed.body.error.code, 'internal');
  assert.deepEqual(relay.ready(), { ready: false, reason: 'the storage refused the last commit' });
  relay.storage.tx = tx;
  const ok = await relay.callGrouped(as(alice), 'message.send', message(alice, alice, 'kept'));
  assert.equal(ok.status, 200, JSON.stringify(ok.body));
  assert.deepEqual(relay.ready(), { ready: true });
  await relay.close();
  fs.rmSync(data, { recursive: true });
});
