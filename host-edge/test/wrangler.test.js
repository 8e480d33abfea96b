// relay-node's `workerd` export as a user's own Worker gets it: the packed package installed
// into an empty app beside the README's Worker (host-node/examples/worker: src/index.js and
// the wrangler.jsonc template), then `wrangler dev` runs it locally and a client registers,
// sends itself a message and reads it back over HTTP. wrangler needs Node 22.12 or later: it
// runs on the Node 22 of host-node/runtimes (the npm registry's).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Identity } from '../../host-node/pkg/relay_wasm.js';
import { NET, post, eventually, freePort, runtime } from '../../host-node/test/helpers.js';

const NODE = path.resolve(new URL('../..', import.meta.url).pathname);
const HOST_NODE = path.join(NODE, 'host-node');
const WRANGLER = new URL('../node_modules/wrangler/bin/wrangler.js', import.meta.url).pathname;

function run(cmd, args, opts) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20, timeout: 600_000, ...opts });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.status ?? r.signal}):\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

test('wrangler dev runs the Worker template over the packed relay-node: a self-delivery over HTTP', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-wrangler-'));
  let dev = null;
  try {
    const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', dir], { cwd: HOST_NODE }));
    const app = path.join(dir, 'app');
    fs.cpSync(path.join(HOST_NODE, 'examples/worker'), app, { recursive: true });
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'worker', private: true, type: 'module' }));
    run('npm', ['install', '--no-audit', '--no-fund', path.join(dir, packed.filename)], { cwd: app });

    // The template as it is, but for the relay id (the URL wrangler dev serves) and the network.
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    const template = fs.readFileSync(path.join(app, 'wrangler.jsonc'), 'utf8');
    const local = template.replace('"relay": "https://relay.example.com",\n      "network": "prod"', `"relay": "${url}",\n      "network": "dev"`);
    assert.notEqual(local, template, 'the template names the relay id and network where the test expects them');
    fs.writeFileSync(path.join(app, 'wrangler.jsonc'), local);
    const b64u = (n) => crypto.randomBytes(n).toString('base64url');
    fs.writeFileSync(path.join(app, '.dev.vars'), `RELAY_KEY=${b64u(32)}\nADMIN_TOKEN=${b64u(24)}\n`);

    dev = spawn(runtime('node22/bin/node'), [WRANGLER, 'dev', '--ip', '127.0.0.1', '--port', String(port)], {
      cwd: app,
      env: { ...process.env, WRANGLER_SEND_METRICS: 'false', CI: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let log = '';
    dev.stdout.on('data', (c) => (log += c));
    dev.stderr.on('data', (c) => (log += c));
    const known = await eventually(async () => {
      try {
        const r = await fetch(`${url}/.well-known/relay`);
        return r.status === 200 ? await r.json() : null;
      } catch {
        return null;
      }
    }, 90_000).catch((e) => {
      throw new Error(`${e.message}; wrangler said:\n${log}`);
    });
    assert.equal(known.relay, url);

    const id = new Identity();
    const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
    const reg = await post(`${url}/v1/account.register`, `{"route":${id.route(NET, url, 1, Date.now())},"certificate":${cert},"discoverable":true}`);
    assert.equal(reg.status, 200, JSON.stringify(reg.body));
    const session = (await post(`${url}/v1/session.open`, id.sessionOpen(NET, url, Date.now()))).body.session;
    const sent = await post(`${url}/v1/message.send`, id.message(NET, id.accountId(), `[${cert}]`, 'from a Worker', Date.now(), false), session);
    assert.equal(sent.body.status, 'target_accepted', JSON.stringify(sent.body));
    const synced = await post(`${url}/v1/message.timeline.sync`, '{"after":0}', session);
    assert.deepEqual(
      synced.body.entries.map((e) => id.openEntry(JSON.stringify(e))),
      ['from a Worker'],
    );
    const bad = await post(`${url}/v1/account.register`, '{"route":', undefined);
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.code, 'invalid_params');
  } finally {
    dev?.kill('SIGTERM');
    await new Promise((r) => (dev && dev.exitCode === null ? dev.once('exit', r) : r()));
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
