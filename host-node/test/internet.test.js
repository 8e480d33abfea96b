// The pieces of issue 18 on their own: the outbound address check, the key-fetch limits, the
// limits' defaults and flags, the last-resort handler, and secrets on disk.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { refusedAddress, refusedUrl, vettedAddresses, vettedLookup, REFUSED_CODE } from '../src/outbound.js';
import { LIMITS, LIMIT_FLAGS, limitsOf } from '../src/limits.js';
import { parseArgs, lastResort } from '../src/cli.js';
import { createRelay, serve, Log } from '../src/index.js';
import { tmp } from './probe.js';

test('refused peer addresses: loopback, private, link-local, CGNAT, multicast, unspecified, broadcast, and their IPv6 forms', () => {
  const refused = [
    '127.0.0.1', '127.255.255.254', '10.0.0.1', '172.16.0.1', '172.31.255.255', '192.168.1.1', '169.254.169.254', '100.64.0.1',
    '100.127.255.255', '224.0.0.1', '239.255.255.255', '0.0.0.0', '0.1.2.3', '255.255.255.255', '240.0.0.1',
    '::', '::1', 'fc00::1', 'fd12:3456::1', 'fe80::1', 'fe80::1%eth0', 'febf::1', 'ff02::1', 'ff0e::1', 'fec0::1',
    '::ffff:127.0.0.1', '::ffff:7f00:1', '::ffff:10.0.0.1', '::ffff:169.254.169.254', '::ffff:100.64.0.1', '::ffff:0.0.0.0',
    '::127.0.0.1', '::10.1.2.3', '0:0:0:0:0:ffff:192.168.0.1', '64:ff9b::10.0.0.1', '2002:c0a8:0101::1', '2002:7f00:1::',
    'localhost', '', 'example.com', '1.2.3', '::ffff:1.2.3',
  ];
  for (const ip of refused) assert.notEqual(refusedAddress(ip), null, `${ip} is refused`);
  const allowed = [
    '8.8.8.8', '1.1.1.1', '172.15.255.255', '172.32.0.1', '100.63.255.255', '100.128.0.1', '192.169.0.1', '169.255.0.1', '223.255.255.255',
    '2606:4700:4700::1111', '2001:4860:4860::8888', '::ffff:8.8.8.8', '64:ff9b::808:808', '2002:0808:0808::1', 'fe00::1',
  ];
  for (const ip of allowed) assert.equal(refusedAddress(ip), null, `${ip} is allowed`);
  assert.equal(refusedAddress('::ffff:127.0.0.1'), 'loopback');
  assert.equal(refusedAddress('169.254.169.254'), 'link-local');
  assert.equal(refusedAddress('100.64.0.1'), 'shared (CGNAT)');
});

test("refused peer URLs are the core's rules: off dev only https, and an IP literal must be public unless private peers are allowed", () => {
  assert.equal(refusedUrl('http://127.0.0.1:8080/x', 'dev', false), null, 'dev checks nothing');
  assert.match(refusedUrl('http://relay.example/x', 'prod', false), /https only/);
  assert.match(refusedUrl('http://relay.example/x', 'prod', true), /https only/, 'the flag does not lift https');
  assert.match(refusedUrl('https://127.0.0.1:8443/x', 'prod', false), /loopback/);
  assert.match(refusedUrl('https://[::ffff:10.0.0.1]:8443/x', 'prod', false), /private/);
  assert.equal(refusedUrl('https://127.0.0.1:8443/x', 'prod', true), null);
  assert.equal(refusedUrl('https://relay.example/x', 'prod', false), null, 'names are checked at connect time');
  assert.equal(vettedAddresses('dev', false), false);
  assert.equal(vettedAddresses('prod', true), false);
  assert.equal(vettedAddresses('prod', false), true);
});

test('the vetted lookup resolves, and refuses a name whose every address is refused (one or all)', async () => {
  for (const all of [false, true]) {
    const e = await new Promise((resolve) => vettedLookup('localhost', { all }, (err) => resolve(err)));
    assert.equal(e?.code, REFUSED_CODE);
    assert.match(e.message, /localhost resolves to no public address: .*loopback/);
  }
  // An IP literal that is public passes straight through dns.lookup.
  const one = await new Promise((resolve, reject) => vettedLookup('8.8.8.8', {}, (err, address, family) => (err ? reject(err) : resolve([address, family]))));
  assert.deepEqual(one, ['8.8.8.8', 4]);
  const list = await new Promise((resolve, reject) => vettedLookup('8.8.8.8', { all: true }, (err, addresses) => (err ? reject(err) : resolve(addresses))));
  assert.deepEqual(list, [{ address: '8.8.8.8', family: 4 }]);
});

// The key-fetch limits (one per relay per interval, failures cached, a cap in flight) are the
// core's (relay_core::transport::keys, tested there); hostile.test.js checks them over HTTP.

test('the limits: defaults, flags, TOML keys and options', () => {
  assert.deepEqual({ ...LIMITS }, {
    headerTimeout: 10000, bodyTimeout: 30000, idleTimeout: 60000, wsPingInterval: 30000,
    maxConnections: 1000, maxConnectionsPerIp: 64, wsSendQueue: 256, maxPending: 1024,
  });
  assert.deepEqual(LIMIT_FLAGS.map((l) => l.flag), [
    '--header-timeout', '--body-timeout', '--idle-timeout', '--ws-ping-interval', '--max-connections', '--max-connections-per-ip', '--ws-send-queue', '--max-pending',
  ]);
  assert.deepEqual(parseArgs([]).limits, { ...LIMITS });
  const argv = LIMIT_FLAGS.flatMap((l, i) => [l.flag, String(i + 1)]);
  assert.deepEqual(Object.values(parseArgs(argv).limits), [1, 2, 3, 4, 5, 6, 7, 8]);
  const dir = tmp('limits');
  const cfg = path.join(dir, 'relay.toml');
  fs.writeFileSync(cfg, `${LIMIT_FLAGS.map((l, i) => `${l.key} = ${i + 11}`).join('\n')}\ntls_cert = "c.pem"\ntls_key = "k.pem"\nca = ["a.pem", "b.pem"]\nallow_private_peers = true\n`);
  const c = parseArgs(['--config', cfg, '--max-pending', '5', '--ca', 'c2.pem']);
  assert.deepEqual(Object.values(c.limits), [11, 12, 13, 14, 15, 16, 17, 5]);
  assert.deepEqual([c.tlsCert, c.tlsKey, c.ca, c.allowPrivatePeers], ['c.pem', 'k.pem', ['a.pem', 'b.pem', 'c2.pem'], true]);
  fs.writeFileSync(cfg, 'allow_private_peers = "yes"\n');
  assert.throws(() => parseArgs(['--config', cfg]), /allow_private_peers/);
  fs.rmSync(dir, { recursive: true });
  assert.equal(parseArgs(['--allow-private-peers']).allowPrivatePeers, true);
  assert.equal(parseArgs([]).allowPrivatePeers, false);
  for (const bad of ['0', '-1', '1.5', 'x']) assert.throws(() => parseArgs(['--header-timeout', bad]), /positive integer/);
  assert.throws(() => parseArgs(['--tls-cert', 'c.pem']), /go together/);
  assert.throws(() => limitsOf({ maxPending: 0 }), /positive integer/);
  assert.deepEqual(limitsOf({ maxPending: 3 }, { maxPending: 4, wsSendQueue: undefined }).maxPending, 4);
});

test('serve refuses a certificate without its key', async () => {
  const relay = await createRelay({ relay: 'http://127.0.0.1:1' });
  await assert.rejects(serve(relay, { tlsCert: '-----BEGIN CERTIFICATE-----' }), /both a certificate/);
  await relay.close();
});

test('the last resort: rejections are logged; an uncaught exception is survived only with the relay on its own thread, alive, and not in a storm', () => {
  const lines = [];
  const log = new Log({ write: (l) => lines.push(l) });
  const exits = [];
  const exit = (c) => exits.push(c);
  let healthy = true;
  const threaded = lastResort(log, { threaded: true, healthy: () => healthy }, exit);
  threaded.rejection(new Error('r1'));
  assert.match(lines.at(-1), /unhandled rejection \(logged; serving goes on\).*r1/);
  for (let i = 0; i < 10; i += 1) threaded.exception(new Error(`e${i}`));
  assert.deepEqual(exits, [], 'ten within a minute are survived');
  threaded.exception(new Error('e10'));
  assert.deepEqual(exits, [70], 'the eleventh stops the relay');
  const gone = lastResort(log, { threaded: true, healthy: () => healthy }, exit);
  healthy = false;
  gone.exception(new Error('x'));
  assert.deepEqual(exits, [70, 70]);
  assert.match(lines.at(-1), /the relay thread is gone/);
  lastResort(log, { threaded: false, healthy: () => true }, exit).exception(new Error('y'));
  assert.deepEqual(exits, [70, 70, 70]);
  assert.match(lines.at(-1), /not known good/);
});

test('secrets on disk: a 0700 directory, 0600 files, made only when absent; a bad one stops the start naming the file', async () => {
  const parent = tmp('secrets');
  const data = path.join(parent, 'data');
  const mode = (f) => fs.statSync(f).mode & 0o777;
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', data });
  const srv = await serve(relay, { port: 0 });
  assert.equal(mode(data), 0o700);
  for (const f of ['relay.key', 'admin.token', 'relay.sqlite', 'admin.url']) assert.equal(mode(path.join(data, f)), 0o600, f);
  for (const f of fs.readdirSync(data)) if (f.startsWith('relay.sqlite')) assert.equal(mode(path.join(data, f)), 0o600, f);
  const known = relay.wellKnown();
  const token = fs.readFileSync(path.join(data, 'admin.token'), 'utf8');
  await srv.close();
  // Restarted: the same key and token.
  const again = await createRelay({ relay: 'http://127.0.0.1:1', data });
  assert.equal(again.wellKnown(), known);
  assert.equal(fs.readFileSync(path.join(data, 'admin.token'), 'utf8'), token);
  await again.close();
  // A malformed, truncated or unreadable secret is never replaced: the start stops and says which file.
  const key = path.join(data, 'relay.key');
  const good = fs.readFileSync(key);
  for (const [content, why] of [['not base64url!', /relay\.key: malformed/], ['', /relay\.key: malformed/], [good.subarray(0, 20), /relay\.key: malformed/]]) {
    fs.writeFileSync(key, content);
    await assert.rejects(createRelay({ relay: 'http://127.0.0.1:1', data }), why);
    assert.deepEqual(fs.readFileSync(key), Buffer.from(content), 'left as it was');
  }
  fs.writeFileSync(key, good);
  const tokenFile = path.join(data, 'admin.token');
  fs.rmSync(tokenFile);
  fs.mkdirSync(tokenFile);
  await assert.rejects(createRelay({ relay: 'http://127.0.0.1:1', data }), /admin\.token: cannot read it \(EISDIR\)/);
  fs.rmdirSync(tokenFile);
  // Absent: made anew.
  const fresh = await createRelay({ relay: 'http://127.0.0.1:1', data });
  assert.equal(fresh.wellKnown(), known, 'the key was kept');
  assert.notEqual(fs.readFileSync(tokenFile, 'utf8'), token, 'the absent token was made anew');
  assert.equal(mode(tokenFile), 0o600);
  await fresh.close();
  fs.rmSync(parent, { recursive: true, force: true });
});

test('a data directory or secret open to others (made by an older relay) is reported at start, and left as it is', async () => {
  const data = tmp('open');
  const first = await createRelay({ relay: 'http://127.0.0.1:1', data });
  await first.close();
  fs.chmodSync(data, 0o755);
  fs.chmodSync(path.join(data, 'relay.key'), 0o644);
  const lines = [];
  const again = await createRelay({ relay: 'http://127.0.0.1:1', data, log: new Log({ write: (l) => lines.push(l) }) });
  await again.close();
  assert.ok(lines.some((l) => /WARN .*relay\.key is open to others \(mode 644\); chmod 600 it/.test(l)), lines.join('\n'));
  assert.ok(lines.some((l) => /WARN .* is open to others \(mode 755\); chmod 700 it/.test(l)), lines.join('\n'));
  assert.ok(!lines.some((l) => /admin\.token/.test(l)));
  assert.equal(fs.statSync(path.join(data, 'relay.key')).mode & 0o777, 0o644);
  fs.rmSync(data, { recursive: true, force: true });
});
