// Facing the internet (issue 18): inputs that crashed, stalled or turned the Node host against
// others, each tried against a relay-node process (the relay on its thread, as the CLI runs
// it) with short limits set by its flags. Every probe ends by checking that the relay still
// answers and delivers within a few seconds.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import WebSocket from 'ws';
import { createRelay } from '../src/index.js';
import {
  relayNode, account, stillServes, tmp, connect, outcome, rawWebSocket, frame, serverFrames, sleep, post, eventually, sendText,
  unsignedRelayHeaders, countingServer,
} from './probe.js';

/** A raw HTTP request's answer (status line and all) on a fresh connection. */
async function rawExchange(port, bytes, wait = 3000) {
  const s = await connect(port);
  const o = outcome(s, wait);
  s.write(bytes);
  return o;
}

/** A request with only the relay-authentication headers, raw bodies allowed. */
function relayRequest(url, method, headers, body = '{}') {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}/relay/v1/${method}`, { method: 'POST', headers: { ...headers, 'content-type': 'application/json' }, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: JSON.parse(Buffer.concat(chunks).toString() || 'null') }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

test('crash probes: each closes its own connection (1009, 1002, 1007, 400) and the process goes on', async (t) => {
  const r = await relayNode(['--policy', 'max_request_bytes=16384']);
  try {
    const alice = await account(r.url, r.id);
    // A WebSocket that must see nothing of the others' troubles: it gets its notification after them.
    const bystander = new WebSocket(`ws://127.0.0.1:${r.port}/v1/ws`, { headers: { authorization: `Bearer ${alice.session}` } });
    const pushed = [];
    bystander.on('message', (d) => pushed.push(JSON.parse(d.toString())));
    await new Promise((res, rej) => {
      bystander.on('open', res);
      bystander.on('error', rej);
    });

    const probe = async (name, payload, expected) => {
      await t.test(name, async () => {
        const ws = await rawWebSocket(r.port, '/v1/ws', alice.session);
        const seen = serverFrames(ws, 3000);
        ws.socket.write(payload);
        const got = await seen;
        assert.equal(got.closeCode, expected, `close code ${got.closeCode}`);
        assert.ok(r.alive(), 'the process still runs');
        await stillServes(r.url, r.id);
      });
    };
    await probe('a WebSocket message over max_request_bytes: close 1009', frame(1, Buffer.alloc(20000, 0x61)), 1009);
    await probe('a frame with RSV1 set: close 1002', frame(1, '{"id":1}', { rsv1: true }), 1002);
    await probe('an unmasked client frame: close 1002', frame(1, '{"id":1}', { mask: false }), 1002);
    await probe('a reserved opcode: close 1002', frame(3, 'x'), 1002);
    await probe('invalid UTF-8 in a text frame: close 1007', frame(1, Buffer.from([0x7b, 0xff, 0xfe, 0x7d])), 1007);
    await probe('a fragmented message over max_request_bytes: close 1009', Buffer.concat([frame(1, Buffer.alloc(10000, 0x61), { fin: false }), frame(0, Buffer.alloc(10000, 0x61))]), 1009);

    await t.test('GET // with WebSocket upgrade headers: 400, the process goes on', async () => {
      const o = await rawExchange(r.port, 'GET // HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n');
      assert.ok(o.closed);
      assert.match(o.data, /^HTTP\/1.1 400/);
      assert.ok(r.alive());
      await stillServes(r.url, r.id);
    });
    await t.test('GET // and other unreadable targets without upgrade: 400', async () => {
      for (const target of ['//', '//x:y@', 'http://[']) {
        const o = await rawExchange(r.port, `GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
        assert.match(o.data, /^HTTP\/1.1 (400|404)/, `${target}: ${o.data.slice(0, 40)}`);
      }
      assert.ok(r.alive());
      await stillServes(r.url, r.id);
    });
    await t.test('connections reset mid-request, mid-body and mid-upgrade', async () => {
      const cuts = [
        'POST /v1/message.send HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"a":',
        'GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n' +
          `Authorization: Bearer ${alice.session}\r\n\r\n`,
        'GET /.well-known/relay HTTP/1.1\r\nHo',
      ];
      for (let i = 0; i < 20; i += 1) {
        const s = await connect(r.port);
        s.on('error', () => {});
        s.write(cuts[i % cuts.length]);
        if (i % 2) await sleep(5);
        s.resetAndDestroy();
      }
      await sleep(200);
      assert.ok(r.alive());
      await stillServes(r.url, r.id);
    });
    await t.test('the bystander WebSocket was not affected', async () => {
      const bob = await account(r.url, r.id);
      assert.equal((await sendText(bob, alice, 'to the bystander')).status, 200);
      await eventually(() => pushed.find((f) => f.method === 'message.timeline.changed'), 5000);
      assert.equal(bystander.readyState, WebSocket.OPEN);
    });
    bystander.close();
  } finally {
    await r.stop();
  }
});

test('headers, bodies and idle connections are timed (--header-timeout, --body-timeout, --idle-timeout)', async (t) => {
  const r = await relayNode(['--header-timeout', '500', '--body-timeout', '700', '--idle-timeout', '500', '--policy', 'max_request_bytes=16384']);
  try {
    await t.test('40 requests whose headers never finish, and 10 silent connections: all closed within the header timeout', async () => {
      const held = [];
      for (let i = 0; i < 50; i += 1) {
        const s = await connect(r.port);
        const o = outcome(s, 5000);
        if (i < 40) s.write('POST /v1/message.send HTTP/1.1\r\nHost: x\r\nContent-Le');
        held.push(o);
      }
      const results = await Promise.all(held);
      for (const o of results) assert.ok(o.closed && o.after < 2500, `closed ${o.closed} after ${o.after} ms`);
      await stillServes(r.url, r.id);
    });
    await t.test('headers dripped a byte at a time: closed at the header timeout all the same', async () => {
      const s = await connect(r.port);
      const o = outcome(s, 5000);
      const line = 'GET /.well-known/relay HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(200);
      let i = 0;
      const drip = setInterval(() => {
        if (s.destroyed || i >= line.length) return clearInterval(drip);
        s.write(line[i++]);
        return undefined;
      }, 50);
      const got = await o;
      clearInterval(drip);
      assert.ok(got.closed && got.after < 2500, `after ${got.after} ms`);
      await stillServes(r.url, r.id);
    });
    await t.test('a body that never finishes, or drips: 408 and closed at the body timeout', async () => {
      for (const drip of [false, true]) {
        const s = await connect(r.port);
        const o = outcome(s, 5000);
        s.write('POST /v1/message.send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"a":');
        const timer = drip ? setInterval(() => !s.destroyed && s.write(' '), 100) : null;
        const got = await o;
        clearInterval(timer);
        assert.ok(got.closed && got.after < 2500, `after ${got.after} ms`);
        assert.match(got.data, /^HTTP\/1.1 408/);
      }
      await stillServes(r.url, r.id);
    });
    await t.test('an idle keep-alive connection is closed after the idle timeout', async () => {
      const s = await connect(r.port);
      const o = outcome(s, 5000);
      s.write('GET /.well-known/relay HTTP/1.1\r\nHost: x\r\n\r\n');
      const got = await o;
      assert.match(got.data, /^HTTP\/1.1 200/);
      assert.ok(got.closed && got.after < 3000, `after ${got.after} ms`);
      await stillServes(r.url, r.id);
    });
    await t.test('a chunked body over max_request_bytes: 413 as soon as it passes, the rest unread, the connection closed', async () => {
      const s = await connect(r.port);
      const o = outcome(s, 8000);
      let answered = false;
      s.on('data', () => (answered = true));
      s.write('POST /v1/message.send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n');
      let sent = 0;
      const chunk = Buffer.concat([Buffer.from('4000\r\n'), Buffer.alloc(0x4000, 0x20), Buffer.from('\r\n')]);
      // Up to 20 MB, as fast as the socket takes it, until the answer comes.
      while (!s.destroyed && sent < 20 * 1024 * 1024 && !answered) {
        const more = s.write(chunk);
        sent += chunk.length;
        if (more) await new Promise((res) => setImmediate(res));
        else await new Promise((res) => { s.once('drain', res); s.once('close', res); setTimeout(res, 100); });
      }
      const got = await o;
      assert.match(got.data, /^HTTP\/1.1 413/);
      assert.ok(got.closed);
      assert.ok(sent < 10 * 1024 * 1024, `${sent} bytes were sent before the answer`);
      await stillServes(r.url, r.id);
    });
    await t.test('a declared Content-Length over max_request_bytes: 413 at once, nothing read, closed', async () => {
      const got = await rawExchange(r.port, 'POST /v1/message.send HTTP/1.1\r\nHost: x\r\nContent-Length: 20000000\r\n\r\n{');
      assert.match(got.data, /^HTTP\/1.1 413/);
      assert.ok(got.closed && got.after < 1000);
      await stillServes(r.url, r.id);
    });
  } finally {
    await r.stop();
  }
});

test('connections are capped at accept, in all (--max-connections) and per peer address (--max-connections-per-ip)', async (t) => {
  const r = await relayNode(['--max-connections', '8', '--max-connections-per-ip', '3']);
  try {
    await t.test('a 4th connection from one address is closed at once; another address is let in', async () => {
      const mine = [];
      for (let i = 0; i < 3; i += 1) mine.push(await connect(r.port));
      const fourth = await connect(r.port);
      const o = await outcome(fourth, 2000);
      assert.ok(o.closed && o.after < 1000 && o.data === '', `closed ${o.closed} after ${o.after}`);
      const other = await connect(r.port, { localAddress: '127.0.0.2' });
      const p = await outcome(other, 500);
      assert.ok(!p.closed, 'a connection from 127.0.0.2 stays open');
      for (const s of [...mine, other]) s.destroy();
      await sleep(100);
      await stillServes(r.url, r.id);
    });
    await t.test('past 8 open connections in all, new ones are closed at once', async () => {
      const open = [];
      for (let i = 0; i < 8; i += 1) open.push(await connect(r.port, { localAddress: `127.0.0.${10 + (i % 4)}` }));
      await sleep(100);
      const extra = await connect(r.port, { localAddress: '127.0.0.20' });
      const o = await outcome(extra, 2000);
      assert.ok(o.closed && o.after < 1000, `closed ${o.closed} after ${o.after}`);
      for (const s of open) s.destroy();
      await sleep(100);
      await stillServes(r.url, r.id);
    });
  } finally {
    await r.stop();
  }
});

test('WebSockets: ping/pong liveness (--ws-ping-interval) and a bounded send queue (--ws-send-queue)', async (t) => {
  const r = await relayNode(['--ws-ping-interval', '300', '--ws-send-queue', '4']);
  try {
    const alice = await account(r.url, r.id);
    await t.test('a client that never answers pings is closed; one that does stays', async () => {
      const quiet = await rawWebSocket(r.port, '/v1/ws', alice.session);
      const good = new WebSocket(`ws://127.0.0.1:${r.port}/v1/ws`, { headers: { authorization: `Bearer ${alice.session}` } });
      await new Promise((res, rej) => {
        good.on('open', res);
        good.on('error', rej);
      });
      const got = await serverFrames(quiet, 3000);
      assert.ok(got.closed, 'the silent client was closed');
      assert.ok(got.opcodes.includes(9), 'after a ping');
      await sleep(700);
      assert.equal(good.readyState, WebSocket.OPEN, 'the client that answers pings is still open');
      good.close();
      await stillServes(r.url, r.id);
    });
    await t.test('a client that does not read is dropped once its queue is full', async () => {
      // Large answers: a timeline of 8 messages of 100 KB each, synced again and again.
      const bob = await account(r.url, r.id);
      for (let i = 0; i < 8; i += 1) assert.equal((await sendText(alice, bob, `${i}`.padEnd(100_000, '.'))).status, 200);
      const ws = new WebSocket(`ws://127.0.0.1:${r.port}/v1/ws`, { headers: { authorization: `Bearer ${bob.session}` } });
      await new Promise((res, rej) => {
        ws.on('open', res);
        ws.on('error', rej);
      });
      const closed = new Promise((res) => ws.once('close', res));
      ws.on('error', () => {});
      // Stop reading, and keep asking.
      ws._socket.pause();
      for (let i = 0; i < 60; i += 1) ws.send(JSON.stringify({ id: i, method: 'message.timeline.sync', params: { after: 0 } }));
      const adminUrl = fs.readFileSync(path.join(r.data, 'admin.url'), 'utf8').trim();
      await eventually(async () => /relay_websockets_dropped_total [1-9]/.test(await (await fetch(`${adminUrl}/metrics`)).text()), 10000);
      ws._socket.resume();
      await closed;
      await stillServes(r.url, r.id);
    });
  } finally {
    await r.stop();
  }
});

test('work waiting for the core is bounded (--max-pending): 503 unavailable with Retry-After 1', async () => {
  // Relay requests naming a relay that never answers wait for its key (at most 2 s here).
  const hang = await countingServer('hang');
  const r = await relayNode(['--max-pending', '2', '--attempt-timeout', '3000']);
  try {
    const waiting = [relayRequest(r.url, 'route.get', unsignedRelayHeaders(hang.url)), relayRequest(r.url, 'route.get', unsignedRelayHeaders(hang.url))];
    await eventually(() => hang.counts.requests >= 1, 3000);
    const busy = await post(`${r.url}/v1/route.get`, { account: 'x' });
    assert.equal(busy.status, 503);
    assert.equal(busy.headers['retry-after'], '1');
    assert.equal(busy.body.error.code, 'unavailable');
    assert.equal(busy.body.error.data.retry_after, 1000);
    for (const w of await Promise.all(waiting)) assert.equal(w.status, 401, 'the held requests end unauthenticated');
    await stillServes(r.url, r.id);
  } finally {
    await r.stop();
    await hang.close();
  }
});

test('key fetches for relay requests: one per claimed relay per interval, failures cached, at most 8 in flight, none after a failed precheck', async (t) => {
  const r = await relayNode(['--attempt-timeout', '3000']);
  try {
    await t.test('20 unsigned requests naming one relay make it fetch once', async () => {
      const target = await countingServer('fail');
      const answers = await Promise.all(Array.from({ length: 20 }, () => relayRequest(r.url, 'route.get', unsignedRelayHeaders(target.url))));
      for (const a of answers) assert.equal(a.status, 401);
      // And again, after the first failed: remembered, not fetched.
      for (let i = 0; i < 5; i += 1) assert.equal((await relayRequest(r.url, 'message.deliver', { ...unsignedRelayHeaders(target.url), 'relay-route-revision': '1' })).status, 401);
      assert.equal(target.counts.requests, 1);
      await target.close();
      await stillServes(r.url, r.id);
    });
    await t.test('badly signed requests naming a real relay: its key is fetched once, and its signed requests still pass', async () => {
      // A relay whose /.well-known/relay is served by a server that counts the fetches.
      let doc = '';
      const spy = await countingServer((req, res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(doc);
      });
      const b = await createRelay({ relay: spy.url });
      doc = b.wellKnown();
      const forged = await Promise.all(Array.from({ length: 10 }, () => relayRequest(r.url, 'route.get', unsignedRelayHeaders(spy.url), '{"account":"x"}')));
      for (const a of forged) assert.equal(a.status, 401);
      for (let i = 0; i < 5; i += 1) assert.equal((await relayRequest(r.url, 'route.get', unsignedRelayHeaders(spy.url), '{"account":"x"}')).status, 401);
      assert.equal(spy.counts.requests, 1, 'one fetch for 15 forged requests');
      const body = '{"account":"x"}';
      const h = JSON.parse(b.core.inner.signRequest('route.get', r.id, body, Date.now()));
      const signed = await relayRequest(r.url, 'route.get', { 'relay-id': h.relay_id, 'relay-timestamp': h.timestamp, 'relay-nonce': h.nonce, 'relay-signature': h.signature }, body);
      assert.notEqual(signed.status, 401, JSON.stringify(signed.body));
      assert.equal(spy.counts.requests, 1, 'answered from the cached key');
      await b.close();
      await spy.close();
      await stillServes(r.url, r.id);
    });
    await t.test('a request failing the precheck (bad timestamp, nonce or signature form) fetches nothing', async () => {
      const target = await countingServer('fail');
      const bad = [
        { ...unsignedRelayHeaders(target.url), 'relay-timestamp': '1' },
        { ...unsignedRelayHeaders(target.url), 'relay-nonce': 'short' },
        { ...unsignedRelayHeaders(target.url), 'relay-signature': 'x' },
        { 'relay-id': target.url },
      ];
      for (const h of bad) assert.equal((await relayRequest(r.url, 'route.get', h)).status, 401);
      assert.equal(target.counts.connections, 0);
      await target.close();
      await stillServes(r.url, r.id);
    });
    await t.test('requests naming 12 relays that never answer: 8 fetch, the rest get 503 at once', async () => {
      const hung = await Promise.all(Array.from({ length: 12 }, () => countingServer('hang')));
      const answers = await Promise.all(hung.map((h) => relayRequest(r.url, 'route.get', unsignedRelayHeaders(h.url))));
      const busy = answers.filter((a) => a.status === 503);
      assert.equal(busy.length, 4, JSON.stringify(answers.map((a) => a.status)));
      for (const a of busy) {
        assert.equal(a.body.error.code, 'unavailable');
        assert.equal(a.headers['retry-after'], '1');
      }
      assert.equal(hung.reduce((n, h) => n + h.counts.requests, 0), 8);
      await Promise.all(hung.map((h) => h.close()));
      await stillServes(r.url, r.id);
    });
  } finally {
    await r.stop();
  }
});

test('outbound off dev: loopback and private peers are not attempted (IP literal or a name resolving to one); --allow-private-peers lets them', async (t) => {
  const network = 'test';
  const peer = await countingServer('fail');
  const opts = (port) => `https://127.0.0.1:${port}`;
  for (const allow of [false, true]) {
    await t.test(allow ? 'with --allow-private-peers: attempted' : 'by default: not attempted', async () => {
      const r = await relayNode(['--network', network, ...(allow ? ['--allow-private-peers'] : [])], { id: opts });
      try {
        const alice = await account(r.url, r.id, { network });
        for (const host of ['127.0.0.1', 'localhost']) {
          const { Identity } = await import('../pkg/relay_wasm.js');
          const ident = new Identity();
          const bob = { id: ident, cert: ident.certificate(network, 'send,sync,manage', Date.now() - 1000) };
          const pub = await post(`${r.url}/v1/route.publish`, `{"route":${ident.route(network, `https://${host}:${peer.port}`, 1, Date.now())}}`);
          assert.equal(pub.status, 200, JSON.stringify(pub.body));
          const sent = await sendText(alice, bob, 'to a private address');
          assert.equal(sent.status, 200, JSON.stringify(sent.body));
          const before = peer.counts.connections;
          if (allow) await eventually(() => peer.counts.connections > before, 5000);
          else {
            await eventually(() => r.log().includes(`peer refused, not attempted`) && (host === '127.0.0.1' || r.log().includes('localhost resolves to no public address')), 5000);
            await sleep(300);
            assert.equal(peer.counts.connections, 0, 'nothing connected to the private peer');
          }
        }
        // A relay request claiming a private relay fetches nothing from it either.
        if (!allow) {
          const a = await relayRequest(r.url, 'route.get', unsignedRelayHeaders(`https://localhost:${peer.port}`));
          assert.equal(a.status, 401);
          assert.equal(peer.counts.connections, 0);
        }
        await stillServes(r.url, r.id, { network });
      } finally {
        await r.stop();
      }
    });
  }
  await peer.close();
});

test('an uncaught exception or unhandled rejection on the transports thread is logged and the relay goes on; with the relay on that thread it stops (70)', async (t) => {
  const dir = tmp('boom');
  const boom = path.join(dir, 'boom.mjs');
  fs.writeFileSync(
    boom,
    "import { isMainThread } from 'node:worker_threads';\nif (isMainThread) process.on('SIGUSR2', () => { Promise.reject(new Error('probe rejection')); setTimeout(() => { throw new Error('probe exception'); }, 50); });\n",
  );
  await t.test('relay thread: logged, still serving', async () => {
    const r = await relayNode([], { nodeArgs: ['--import', boom] });
    try {
      r.proc.kill('SIGUSR2');
      await eventually(() => r.log().includes('probe exception'), 8000);
      assert.match(r.log(), /unhandled rejection.*probe rejection/);
      assert.match(r.log(), /uncaught exception on the transports' thread/);
      assert.ok(r.alive());
      await stillServes(r.url, r.id);
    } finally {
      await r.stop();
    }
  });
  await t.test('RELAY_NODE_THREAD=0: the state is not known good, exit 70', async () => {
    const r = await relayNode([], { nodeArgs: ['--import', boom], env: { RELAY_NODE_THREAD: '0' } });
    try {
      r.proc.kill('SIGUSR2');
      const { code } = await r.exited;
      assert.equal(code, 70);
      assert.match(r.log(), /uncaught exception; stopping \(status 70\)/);
    } finally {
      await r.stop();
    }
  });
  fs.rmSync(dir, { recursive: true, force: true });
});

