import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs, command } from '../src/cli.js';

test('relay-node serve takes the wasmtime host flags and a TOML config', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-cfg-'));
  const cfg = path.join(dir, 'relay.toml');
  fs.writeFileSync(cfg, 'listen = "127.0.0.1:9100"\nnetwork = "dev"\nmemory = true\n[policy]\nmessage_retention = 60000\n');
  const s = parseArgs(['--config', cfg, '--policy', 'clock_tolerance=1000', '--url', 'http://127.0.0.1:9100']);
  assert.equal(s.listen, '127.0.0.1:9100');
  assert.equal(s.data, null);
  assert.deepEqual(s.policies, { message_retention: 60000, clock_tolerance: 1000 });
  assert.equal(s.url, 'http://127.0.0.1:9100');
  assert.throws(() => parseArgs(['--policy', 'x=1.5']), /NAME=INTEGER/);
  assert.throws(() => parseArgs(['--nope']), /unexpected argument '--nope'/);
  assert.throws(() => parseArgs(['--shards', '2']), /relay-node does not take --shards/);
  fs.writeFileSync(cfg, 'lisen = "x"\n');
  assert.throws(() => parseArgs(['--config', cfg]), /unknown field `lisen`/);
  fs.rmSync(dir, { recursive: true });
});

test('relay-node serve: --admin-listen and --log-format, as flags and config keys', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-cfg-'));
  const cfg = path.join(dir, 'relay.toml');
  const d = parseArgs([]);
  assert.equal(d.adminListen, '127.0.0.1:0', 'loopback, a port the system picks');
  assert.equal(d.logFormat, 'text');
  fs.writeFileSync(cfg, 'admin_listen = "127.0.0.1:9101"\nlog_format = "json"\n');
  const c = parseArgs(['--config', cfg]);
  assert.equal(c.adminListen, '127.0.0.1:9101');
  assert.equal(c.logFormat, 'json');
  const f = parseArgs(['--config', cfg, '--admin-listen', '[::1]:0', '--log-format', 'text']);
  assert.equal(f.adminListen, '[::1]:0');
  assert.equal(f.logFormat, 'text');
  assert.throws(() => parseArgs(['--log-format', 'yaml']), /text or json/);
  assert.throws(() => parseArgs(['--admin-listen', 'localhost']), /HOST:PORT/);
  fs.rmSync(dir, { recursive: true });
});

test('relay-node admin: deliveries, backup and metrics make the calls relay admin makes', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-admin-'));
  fs.writeFileSync(path.join(dir, 'admin.url'), 'http://127.0.0.1:5/\n');
  fs.writeFileSync(path.join(dir, 'admin.token'), 'tok\n');
  assert.deepEqual(command(['admin', 'backup', '--data', dir, 'out.sqlite']).admin, {
    method: 'POST', url: 'http://127.0.0.1:5/admin/v1/backup?shard=0', authorization: 'Bearer tok', body: JSON.stringify({ path: path.resolve('out.sqlite') }), view: 'action',
  });
  assert.equal(command(['admin', '--data', dir, '--admin-url', 'http://127.0.0.1:6/', 'deliveries', 'failed']).admin.url, 'http://127.0.0.1:6/admin/v1/deliveries?shard=0');
  assert.deepEqual(command(['admin', '--data', dir, 'metrics']).admin, { method: 'GET', url: 'http://127.0.0.1:5/metrics', authorization: null, body: '', view: 'raw' });
  assert.equal(command(['admin', '--data', dir, 'destinations', '--failing']).admin.view, 'destinations');
  assert.equal(command(['admin', '--data', dir, '--json', 'destinations']).admin.view, 'raw', '--json prints the answer as it came');
  for (const [bad, says] of [[['backup'], /Usage: relay-node admin backup/], [['deliveries', 'lost'], /possible values: pending, failed/], [['drop', 'everything'], /unrecognized subcommand 'drop'/]]) {
    assert.throws(() => command(['admin', '--data', dir, ...bad]), says);
  }
  fs.rmSync(dir, { recursive: true });
});

test('relay-node serve --listen on port 0 serves as the relay id of the port the system gave', async () => {
  const { spawn } = await import('node:child_process');
  const bin = new URL('../bin/relay-node.js', import.meta.url).pathname;
  const proc = spawn(process.execPath, [bin, 'serve', '--listen', '127.0.0.1:0', '--memory'], { stdio: ['ignore', 'pipe', 'pipe'] });
  try {
    let out = '';
    let err = '';
    proc.stderr.on('data', (d) => (err += d));
    const line = await new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`relay-node did not start:\n${err}`)), 20000);
      proc.stdout.on('data', (d) => {
        out += d;
        const m = /listening on 127\.0\.0\.1:(\d+) as (\S+)/.exec(out);
        if (m) {
          clearTimeout(t);
          resolve(m);
        }
      });
      proc.once('exit', (code) => reject(new Error(`relay-node exited (${code}):\n${err}`)));
    });
    const [, port, url] = line;
    assert.notEqual(port, '0');
    assert.equal(url, `http://127.0.0.1:${port}`);
    const known = await (await fetch(`${url}/.well-known/relay`)).json();
    assert.equal(known.relay, url, 'the relay id names the port it serves on');
  } finally {
    proc.kill();
  }
});
