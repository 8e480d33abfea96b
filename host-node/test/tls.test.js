// TLS both ways (issue 18): two relay-node processes on a network other than `dev`, with
// https relay ids and certificates from a CA made here, serving HTTPS and WSS only
// (--tls-cert, --tls-key) and trusting that CA for their deliveries to each other (--ca);
// --allow-private-peers lets them reach each other on loopback.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import WebSocket from 'ws';
import { testCa } from './certs.js';
import { relayNode, account, post, sendText, timeline, eventually, outcome, connect, stillServes, tmp } from './probe.js';

const network = 'test';

test('two Node relays with https ids deliver both ways over TLS only, and push over WSS', async () => {
  const dir = tmp('tls');
  const ca = testCa();
  const leaf = ca.issue(['localhost', '127.0.0.1']);
  const file = (name, text) => {
    const f = path.join(dir, name);
    fs.writeFileSync(f, text, { mode: 0o600 });
    return f;
  };
  const flags = ['--network', network, '--tls-cert', file('cert.pem', leaf.cert), '--tls-key', file('key.pem', leaf.key), '--ca', file('ca.pem', ca.cert), '--allow-private-peers'];
  const a = await relayNode(flags, { scheme: 'https' });
  const b = await relayNode(flags, { scheme: 'https' });
  try {
    assert.match(a.id, /^https:\/\/127\.0\.0\.1:\d+$/);
    const o = { network, ca: ca.cert };
    const alice = await account(a.url, a.id, o);
    const bob = await account(b.url, b.id, o);
    // Each relay learns the other's user's route, as a contact card would give it.
    const publish = async (at, user) => {
      const r = await post(`${at.url}/v1/route.publish`, `{"route":${user.id.route(network, user.relay, 1, Date.now())}}`, undefined, { ca: ca.cert });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    };
    await publish(a, bob);
    await publish(b, alice);

    // Bob listens over WSS.
    const ws = new WebSocket(`wss://127.0.0.1:${b.port}/v1/ws`, { ca: ca.cert, headers: { authorization: `Bearer ${bob.session}` } });
    const pushed = [];
    ws.on('message', (d) => pushed.push(JSON.parse(d.toString())));
    await new Promise((res, rej) => {
      ws.on('open', res);
      ws.on('error', rej);
    });

    const there = await sendText(alice, bob, 'over TLS, a to b');
    assert.equal(there.status, 200, JSON.stringify(there.body));
    const back = await sendText(bob, alice, 'over TLS, b to a');
    assert.equal(back.status, 200, JSON.stringify(back.body));
    await eventually(async () => (await timeline(bob)).includes('over TLS, a to b'), 10000);
    await eventually(async () => (await timeline(alice)).includes('over TLS, b to a'), 10000);
    await eventually(() => pushed.find((f) => f.method === 'message.timeline.changed'), 5000);
    ws.close();

    // Plain HTTP on a TLS port gets no answer of the relay's.
    const s = await connect(b.port);
    const plain = outcome(s, 3000);
    s.write('GET /.well-known/relay HTTP/1.1\r\nHost: x\r\n\r\n');
    const got = await plain;
    assert.ok(!got.data.includes('"relay"'), 'no well-known document over plain http');
    // A client that does not trust the CA cannot talk to it.
    await assert.rejects(post(`${b.url}/v1/route.get`, { account: 'x' }), /self[- ]signed|unable to verify|certificate/i);
    await stillServes(a.url, a.id, o);
    await stillServes(b.url, b.id, o);
  } finally {
    await a.stop();
    await b.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
