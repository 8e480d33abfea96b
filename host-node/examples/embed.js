// The README's JavaScript example, as `./x test` runs it: from the packed relay-node installed
// into an empty app, on Node 20, 22, 24 and 26, Deno 2 and Bun 1. It prints one JSON line of
// what it saw; the test reads that line. The README quotes it (a test checks the quotes).
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createRelay, serve } from 'relay-node';
import { Identity } from 'relay-node/client';

// An account with one device at `relay`, and a session for it (the client builders sign in-process).
function account(relay) {
  const id = new Identity();
  const certificate = id.certificate('dev', 'send,sync,manage', Date.now() - 1000);
  const route = id.route('dev', relay.relay, 1, Date.now());
  relay.call({ kind: 'anonymous' }, 'account.register', `{"route":${route},"certificate":${certificate},"discoverable":true}`);
  const { body } = relay.call({ kind: 'anonymous' }, 'session.open', id.sessionOpen('dev', relay.relay, Date.now()));
  return { id, certificate, session: { kind: 'session', value: body.session } };
}

// Alice sends Bob a message in-process (the typed calls: records, a refusal thrown with its
// code); Bob reads it from his timeline, whose signed objects come as their canonical text.
function sendAndRead(relay) {
  const alice = account(relay);
  const bob = account(relay);
  const sent = relay.send(alice.session, alice.id.message('dev', bob.id.accountId(), `[${bob.certificate}]`, 'hello', Date.now(), false));
  const page = relay.sync(bob.session, 0);
  const opened = (e) => bob.id.openEntry(`{"envelope":${e.envelope},"device_certificate":${e.deviceCertificate},"key_box":${e.keyBox}}`);
  return { status: sent.status, read: page.entries.map(opened) };
}

const seen = { runtime: globalThis.Deno ? `deno ${Deno.version.deno}` : globalThis.Bun ? `bun ${Bun.version}` : `node ${process.versions.node}` };

// 1. In memory.
const memory = await createRelay({ relay: 'http://127.0.0.1:1', storage: 'memory' });
memory.on('notify', ({ account, latest_seq }) => { /* push to the account's devices */ });
seen.memory = sendAndRead(memory);
// 2. Bad input: a protocol error with its code (400 invalid_params), and nothing stored.
const bad = memory.call({ kind: 'anonymous' }, 'account.register', '{"route":');
seen.bad = { status: bad.status, code: bad.body.error.code };
await memory.close();

// 3. On disk (SQLite: the runtime's own, or better-sqlite3 on Node 20), across a restart.
const data = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-example-'));
try {
  const disk = await createRelay({ relay: 'http://127.0.0.1:1', data });
  seen.disk = { driver: disk.storage.driver, ...sendAndRead(disk) };
  await disk.close();
  const again = await createRelay({ relay: 'http://127.0.0.1:1', data });
  await again.close();
} catch (e) {
  seen.disk = { error: e.message };
}

// 4. Served over HTTP: a self-delivery (Alice to her own account) through POST /v1/message.send.
// A free port first: a relay's id is the URL it is reached at.
const probe = net.createServer();
await new Promise((ok) => probe.listen(0, '127.0.0.1', ok));
const port = probe.address().port;
await new Promise((ok) => probe.close(ok));
const url = `http://127.0.0.1:${port}`;
const relay = await createRelay({ relay: url, storage: 'memory' });
const served = await serve(relay, { host: '127.0.0.1', port });
const alice = account(relay);
const post = (method, params) =>
  fetch(`${url}/v1/${method}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${alice.session.value}` },
    body: params,
  }).then((r) => r.json());
const self = await post('message.send', alice.id.message('dev', alice.id.accountId(), `[${alice.certificate}]`, 'note to self', Date.now(), false));
const synced = await post('message.timeline.sync', '{"after":0}');
seen.http = { status: self.status, read: synced.entries.map((e) => alice.id.openEntry(JSON.stringify(e))) };
await served.close();

console.log(JSON.stringify(seen));
