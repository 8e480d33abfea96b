// Account migration from JavaScript (protocol.md, "Home relay changes"): moveAccount between
// two served relays, what the former home keeps answering, and the move back.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRelay, serve } from '../src/index.js';
import { DeviceSession, Identity, RelayError, moveAccount, olderSpan, openSession } from 'relay-node/client';
import { NET, post, eventually, freePort } from './helpers.js';

/** A relay served on a free loopback port, memory storage; its id carries the port. */
async function served() {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const relay = await createRelay({ relay: url, storage: 'memory' });
  const srv = await serve(relay, { host: '127.0.0.1', port });
  return { relay, srv, url };
}

/** An account with one device, registered at `url` over HTTP (route revision 1). */
async function registered(url) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const route = id.route(NET, url, 1, Date.now());
  const r = await post(`${url}/v1/account.register`, `{"route":${route},"certificate":${cert},"discoverable":true}`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return { id, cert, route, session: await openSession({ identity: id, network: NET, relay: url }) };
}

const messageId = (params) => JSON.parse(params).envelope.message_id;

test('moveAccount: the former home keeps its results, new sends go to the new home, and the account moves back', async () => {
  const a = await served();
  const b = await served();
  try {
    const alice = await registered(a.url);
    const bob = await registered(a.url);

    // Before the move: alice sends bob a message at A, keeping a sent record.
    const first = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'before the move', Date.now(), true);
    const sent = await post(`${a.url}/v1/message.send`, first, alice.session);
    assert.equal(sent.status, 200, JSON.stringify(sent.body));

    const moved = await moveAccount({ identity: alice.id, network: NET, from: a.url, to: b.url, revision: 2, certificates: [alice.cert], discoverable: true });
    assert.equal(moved.revision, 2);
    assert.equal(JSON.parse(moved.route).relay, b.url);
    const held = await post(`${a.url}/v1/route.get`, { account: alice.id.accountId() });
    assert.equal(held.body.route.revision, 2, 'A learned the move');
    assert.equal(held.body.route.relay, b.url);

    // The former home opens a session and answers status and sync for what it accepted.
    const former = await openSession({ identity: alice.id, network: NET, relay: a.url });
    const status = await eventually(async () => {
      const s = await post(`${a.url}/v1/message.delivery.status`, { message_id: messageId(first) }, former);
      assert.equal(s.status, 200, JSON.stringify(s.body));
      return s.body.status === 'target_accepted' ? s.body : null;
    });
    assert.equal(status.to, bob.id.accountId());
    const sync = await post(`${a.url}/v1/message.timeline.sync`, { after: 0 }, former);
    assert.equal(sync.status, 200, JSON.stringify(sync.body));
    assert.deepEqual(sync.body.entries.map((e) => e.kind), ['sent']);
    assert.equal(alice.id.openEntry(JSON.stringify(sync.body.entries[0])), 'before the move');

    // A new send at A: not its home any more, the route names B.
    const stray = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'wrong relay', Date.now(), false);
    const refused = await post(`${a.url}/v1/message.send`, stray, former);
    assert.equal(refused.status, 421, JSON.stringify(refused.body));
    assert.equal(refused.body.error.code, 'not_home_relay');
    assert.equal(refused.body.error.data.route.relay, b.url);
    assert.equal(refused.body.error.data.route.revision, 2);
    // moveAccount reports a refusal by its protocol code: a move back at a revision A holds already.
    await assert.rejects(
      moveAccount({ identity: alice.id, network: NET, from: b.url, to: a.url, revision: 2, certificates: [alice.cert] }),
      (e) => e instanceof RelayError && e.code === 'state_conflict' && e.method === 'account.register',
      'a move at a revision that is not higher is refused',
    );

    // A new send at B reaches bob at A (B learns bob's route from the send).
    const second = JSON.parse(alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'after the move', Date.now(), true));
    second.recipient_route = JSON.parse(bob.route);
    const atB = await post(`${b.url}/v1/message.send`, second, moved.session);
    assert.equal(atB.status, 200, JSON.stringify(atB.body));
    await eventually(async () => {
      const s = await post(`${b.url}/v1/message.delivery.status`, { message_id: second.envelope.message_id }, moved.session);
      assert.notEqual(s.body.status, 'failed', JSON.stringify(s.body));
      return s.body.status === 'target_accepted';
    });
    const inbox = await post(`${a.url}/v1/message.timeline.sync`, { after: 0 }, bob.session);
    assert.equal(inbox.status, 200, JSON.stringify(inbox.body));
    assert.deepEqual(inbox.body.entries.map((e) => bob.id.openEntry(JSON.stringify(e))), ['before the move', 'after the move']);

    // Moving back: A serves the account again, and a new send there is accepted.
    const back = await moveAccount({ identity: alice.id, network: NET, from: b.url, to: a.url, revision: 3, certificates: [alice.cert] });
    assert.equal(back.revision, 3);
    const fromB = await post(`${b.url}/v1/route.get`, { account: alice.id.accountId() });
    assert.equal(fromB.body.route.revision, 3, 'B learned the move back');
    const third = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'home again', Date.now(), false);
    const again = await post(`${a.url}/v1/message.send`, third, back.session);
    assert.equal(again.status, 200, JSON.stringify(again.body));
    await eventually(async () => {
      const s = await post(`${a.url}/v1/message.delivery.status`, { message_id: messageId(third) }, back.session);
      return s.body.status === 'target_accepted';
    });
    const last = await post(`${a.url}/v1/message.timeline.sync`, { after: 0 }, bob.session);
    assert.deepEqual(last.body.entries.map((e) => bob.id.openEntry(JSON.stringify(e))), ['before the move', 'after the move', 'home again']);
  } finally {
    await a.srv.close();
    await b.srv.close();
  }
});

test('home spans: a session from before a move away and back cannot send; DeviceSession opens a fresh one', async () => {
  const a = await served();
  const b = await served();
  try {
    const alice = await registered(a.url);
    const bob = await registered(a.url);
    const device = new DeviceSession({ identity: alice.id, network: NET, relay: a.url });
    const first = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'first span', Date.now(), false);
    assert.equal((await device.call('message.send', first)).status, 'target_accepted');
    const old = device.session;

    await moveAccount({ identity: alice.id, network: NET, from: a.url, to: b.url, revision: 2, certificates: [alice.cert] });
    await moveAccount({ identity: alice.id, network: NET, from: b.url, to: a.url, revision: 3, certificates: [alice.cert] });

    // The old session is a former account's session for good: a new send through it is refused
    // with the current route, which names A itself.
    const second = alice.id.message(NET, bob.id.accountId(), `[${bob.cert}]`, 'second span', Date.now(), false);
    const refused = await post(`${a.url}/v1/message.send`, second, old);
    assert.equal(refused.status, 421, JSON.stringify(refused.body));
    assert.equal(refused.body.error.data.route.relay, a.url);
    assert.equal(refused.body.error.data.route.revision, 3);
    assert.ok(olderSpan(new RelayError(a.url, 'message.send', 421, refused.body.error)));
    // Its status of what it sent in its span still answers (rule 2).
    const status = await post(`${a.url}/v1/message.delivery.status`, { message_id: messageId(first) }, old);
    assert.equal(status.status, 200, JSON.stringify(status.body));
    // DeviceSession opens a fresh session and sends.
    assert.equal((await device.call('message.send', second)).status, 'target_accepted');
    assert.notEqual(device.session, old);
  } finally {
    await a.srv.close();
    await b.srv.close();
  }
});

test('openSession and moveAccount throw the protocol error', async () => {
  const a = await served();
  try {
    const stranger = new Identity();
    await assert.rejects(openSession({ identity: stranger, network: NET, relay: a.url }), (e) => {
      assert.ok(e instanceof RelayError);
      assert.equal(e.method, 'session.open');
      assert.equal(typeof e.code, 'string');
      assert.ok(e.status >= 400);
      return true;
    });
    // A certificate without manage cannot register the account at the new home.
    const alice = await registered(a.url);
    const b = await served();
    try {
      const weak = alice.id.certificate(NET, 'send,sync', Date.now());
      await assert.rejects(
        moveAccount({ identity: alice.id, network: NET, from: a.url, to: b.url, revision: 2, certificates: [weak] }),
        (e) => e instanceof RelayError && e.code === 'permission_denied' && e.status === 403,
      );
      const still = await post(`${a.url}/v1/route.get`, { account: alice.id.accountId() });
      assert.equal(still.body.route.revision, 1, 'nothing was published at A');
    } finally {
      await b.srv.close();
    }
  } finally {
    await a.srv.close();
  }
});
