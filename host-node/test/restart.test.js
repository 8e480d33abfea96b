import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Identity } from '../pkg/relay_wasm.js';
import { NET, post, eventually, freePort } from './helpers.js';

const BIN = new URL('../bin/relay-node.js', import.meta.url).pathname;


function start(port, data) {
  return spawn(process.execPath, [BIN, 'serve', '--listen', `127.0.0.1:${port}`, '--data', data, '--policy', 'retry_initial=200', '--policy', 'retry_max=1000'], {
    stdio: ['ignore', 'ignore', 'inherit'],
  });
}

async function up(url) {
  await eventually(async () => {
    try {
      return (await fetch(`${url}/.well-known/relay`)).ok;
    } catch {
      return false;
    }
  });
}

function kill(p) {
  return new Promise((resolve) => {
    p.on('exit', resolve);
    p.kill('SIGKILL');
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

test('a relay-node process killed mid-delivery and restarted over its SQLite file finishes without a duplicate', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-kill-'));
  const [pa, pb] = [await freePort(), await freePort()];
  const [ua, ub] = [`http://127.0.0.1:${pa}`, `http://127.0.0.1:${pb}`];
  let a = start(pa, path.join(dir, 'a'));
  let b = start(pb, path.join(dir, 'b'));
  await up(ua);
  await up(ub);
  const alice = await account(ua);
  const bob = await account(ub);
  assert.equal((await post(`${ua}/v1/route.publish`, `{"route":${bob.id.route(NET, ub, 1, Date.now())}}`)).status, 200);
  await kill(b);
  const m = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'survives kill -9', Date.now(), false);
  const sent = await post(`${ua}/v1/message.send`, m, alice.session);
  assert.equal(sent.body.status, 'delivering');
  await new Promise((r) => setTimeout(r, 700));
  await kill(a);
  b = start(pb, path.join(dir, 'b'));
  a = start(pa, path.join(dir, 'a'));
  await up(ua);
  await up(ub);
  const id = JSON.parse(m).envelope.message_id;
  await eventually(async () => (await post(`${ua}/v1/message.delivery.status`, { message_id: id }, alice.session)).body.status === 'target_accepted', 20000);
  const again = await post(`${ua}/v1/message.send`, m, alice.session);
  assert.equal(again.body.status, 'target_accepted');
  const sync = await post(`${ub}/v1/message.timeline.sync`, { after: 0 }, await bob.reopen());
  assert.deepEqual(sync.body.entries.map((e) => bob.id.openEntry(JSON.stringify(e))), ['survives kill -9']);
  await kill(a);
  await kill(b);
  fs.rmSync(dir, { recursive: true });
});
