// Backup and restore (issue 21): `relay-node admin backup` copies a running relay's database
// under load; a relay started from the copy (and the original relay.key) holds every message
// accepted before the backup began, and resumes the deliveries that were pending.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { sqliteDriver } from '../src/sqlite.js';
import { Identity } from '../pkg/relay_wasm.js';
import { NET, post, eventually, freePort } from './helpers.js';

const BIN = new URL('../bin/relay-node.js', import.meta.url).pathname;
const run = promisify(execFile);


function start(port, data) {
  const args = ['serve', '--listen', `127.0.0.1:${port}`, '--data', data];
  // Fast retries; no request limits in the way of the load (as the benchmark's relays).
  const limits = ['send_rate', 'deliver_rate', 'deliver_rate_per_account', 'deliver_rate_per_sender', 'account_request_rate'].map((p) => `${p}=100000000`);
  for (const p of ['retry_initial=200', 'retry_max=1000', ...limits]) args.push('--policy', p);
  return spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, RELAY_LOG: 'warn' } });
}

async function up(url) {
  await eventually(async () => {
    try {
      return (await fetch(`${url}/readyz`)).ok;
    } catch {
      return false;
    }
  }, 20000);
}

function kill(p, signal = 'SIGKILL') {
  return new Promise((resolve) => {
    if (p.exitCode !== null) return resolve(p.exitCode);
    p.on('exit', resolve);
    p.kill(signal);
    return undefined;
  });
}

async function account(url) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const r = await post(`${url}/v1/account.register`, `{"route":${id.route(NET, url, 1, Date.now())},"certificate":${cert},"discoverable":true}`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const session = async () => (await post(`${url}/v1/session.open`, id.sessionOpen(NET, url, Date.now()))).body.session;
  return { id, cert, url, session: await session(), reopen: session };
}

/** Every message id in an account's timeline, page by page. */
async function timelineIds(url, session) {
  const ids = new Set();
  let after = 0;
  for (;;) {
    const r = await post(`${url}/v1/message.timeline.sync`, { after }, session);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    for (const e of r.body.entries) ids.add(e.envelope.message_id);
    if (!r.body.has_more) return ids;
    after = r.body.next;
  }
}

test('a backup taken under load restores into a relay that holds every message answered before it began, and resumes a pending delivery', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-backup-'));
  const [pa, pb] = [await freePort(), await freePort()];
  const [ua, ub] = [`http://127.0.0.1:${pa}`, `http://127.0.0.1:${pb}`];
  const [da, db] = [path.join(dir, 'a'), path.join(dir, 'b')];
  let a = start(pa, da);
  let b = start(pb, db);
  // Whatever happens, no relay process outlives the test.
  t.after(() => {
    a.kill('SIGKILL');
    b.kill('SIGKILL');
  });
  await up(ua);
  await up(ub);
  const alice = await account(ua);
  const carol = await account(ua);
  const bob = await account(ub);
  assert.equal((await post(`${ua}/v1/route.publish`, `{"route":${bob.id.route(NET, ub, 1, Date.now())}}`)).status, 200);

  // Bob's relay goes down before the backup: the message to him is pending in it.
  await kill(b);
  const pendingMsg = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'waits for the restore', Date.now(), false);
  const pending = await post(`${ua}/v1/message.send`, pendingMsg, alice.session);
  assert.equal(pending.body.status, 'delivering', JSON.stringify(pending.body));

  // Load: four clients send to carol without pause; each answer's id is noted with when it came.
  /** @type {Array<{id: string, at: number}>} */
  const answered = [];
  let stopLoad = false;
  const client = async () => {
    while (!stopLoad) {
      const m = alice.id.message(NET, carol.id.accountId(), `[${carol.cert}]`, 'load', Date.now(), false);
      const r = await post(`${ua}/v1/message.send`, m, alice.session);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      answered.push({ id: JSON.parse(m).envelope.message_id, at: performance.now() });
    }
  };
  const load = Promise.all([client(), client(), client(), client()]);
  await eventually(() => answered.length >= 50);

  // The backup, through the CLI, while the load goes on.
  const file = path.join(dir, 'backup.sqlite');
  const began = performance.now();
  const before = answered.filter((x) => x.at < began).map((x) => x.id);
  const { stdout } = await run(process.execPath, [BIN, 'admin', 'backup', '--json', '--data', da, file]);
  assert.equal(JSON.parse(stdout).path, file);
  assert.equal(JSON.parse(stdout).bytes, fs.statSync(file).size);
  const duringOrAfter = answered.length - before.length;
  assert.ok(duringOrAfter > 0, 'the load went on while the backup ran');
  await eventually(() => answered.length >= before.length + duringOrAfter + 20, 10000);
  stopLoad = true;
  await load;
  assert.equal(fs.statSync(file).mode & 0o777, 0o600, 'the backup is created 0600');
  assert.equal(fs.existsSync(`${file}.partial`), false);
  const copy = sqliteDriver().open(file);
  const pragma = (name) => copy.prepare(`SELECT * FROM pragma_${name}`).first()[0];
  assert.equal(pragma('journal_mode'), 'delete', 'one self-contained file');
  assert.equal(pragma('integrity_check'), 'ok');
  copy.close();
  // A relative path is resolved by the CLI; the relay takes absolute ones only.
  const relative = await fetch(`${fs.readFileSync(path.join(da, 'admin.url'), 'utf8').trim()}/admin/v1/backup`, {
    method: 'POST',
    headers: { authorization: `Bearer ${fs.readFileSync(path.join(da, 'admin.token'), 'utf8').trim()}` },
    body: JSON.stringify({ path: 'backup.sqlite' }),
  });
  assert.equal(relative.status, 400);

  // Stop the relay; restore: a new data directory with the backup and the original relay.key.
  await kill(a);
  const dr = path.join(dir, 'restored');
  fs.mkdirSync(dr, { mode: 0o700 });
  fs.copyFileSync(file, path.join(dr, 'relay.sqlite'));
  fs.copyFileSync(path.join(da, 'relay.key'), path.join(dr, 'relay.key'));
  a = start(pa, dr);
  await up(ua);
  assert.equal(JSON.parse(await (await fetch(`${ua}/.well-known/relay`)).text()).relay, ua);

  // Every message answered before the backup began is in the restored relay: in carol's
  // timeline (one answered 'delivering' is delivered by the restored relay).
  const carolSession = await carol.reopen();
  let missing = before;
  await eventually(async () => {
    const have = await timelineIds(ua, carolSession);
    missing = before.filter((id) => !have.has(id));
    return missing.length === 0;
  }, 10000).catch(() => {});
  assert.deepEqual(missing, [], `${missing.length} of ${before.length} noted messages are missing`);
  assert.ok(before.length >= 50);

  // Bob's relay comes back after the restore: the pending delivery resumes from the copy.
  b = start(pb, db);
  await up(ub);
  const id = JSON.parse(pendingMsg).envelope.message_id;
  await eventually(async () => (await post(`${ua}/v1/message.delivery.status`, { message_id: id }, await alice.reopen())).body.status === 'target_accepted', 20000);
  const atBob = await post(`${ub}/v1/message.timeline.sync`, { after: 0 }, await bob.reopen());
  assert.deepEqual(atBob.body.entries.map((e) => bob.id.openEntry(JSON.stringify(e))), ['waits for the restore']);
  await kill(a, 'SIGTERM');
  await kill(b, 'SIGTERM');
  fs.rmSync(dir, { recursive: true });
});
