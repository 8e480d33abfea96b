// Group commit in the Node host, through the core's (relay_core::engine::group, whose own
// tests cover reads through the overlay): answers wait for one commit per group, a failed
// commit or a trap undoes the whole group.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRelay } from '../src/index.js';
import { register, message, as, texts } from './helpers.js';

/** A relay over SQLite in a scratch directory (so its calls group), with two accounts. */
async function sqliteRelay() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-group-'));
  const relay = await createRelay({ relay: 'http://127.0.0.1:1', data: dir, policies: { send_rate: 0 } });
  return { dir, relay, alice: register(relay), bob: register(relay) };
}

test('grouped calls answer after one commit, and a failed commit answers internal for all', async () => {
  const { dir, relay, alice, bob } = await sqliteRelay();
  const ok = await Promise.all([1, 2, 3].map((i) => relay.callGrouped(as(alice), 'message.send', message(alice, bob, `m${i}`))));
  assert.deepEqual(ok.map((r) => r.status), [200, 200, 200]);
  assert.deepEqual(texts(bob).sort(), ['m1', 'm2', 'm3']);
  const tx = relay.storage.tx;
  relay.storage.tx = () => {
    throw new Error('disk full');
  };
  const failed = await Promise.all([4, 5].map((i) => relay.callGrouped(as(alice), 'message.send', message(alice, bob, `m${i}`))));
  relay.storage.tx = tx;
  assert.deepEqual(failed.map((r) => r.status), [500, 500]);
  assert.deepEqual(texts(bob).sort(), ['m1', 'm2', 'm3'], 'the failed group left nothing');
  await relay.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('the calls of one turn reach the database in one commit of the whole group', async () => {
  const { dir, relay, alice, bob } = await sqliteRelay();
  const commits = [];
  relay.storage.onCommit = (n) => commits.push(n);
  const pending = Promise.all([1, 2, 3, 4].map((i) => relay.callGrouped(as(alice), 'message.send', message(alice, bob, `m${i}`))));
  assert.deepEqual(commits, [], 'nothing is committed before the turn ends');
  const ok = await pending;
  assert.deepEqual(ok.map((r) => r.status), [200, 200, 200, 200]);
  assert.deepEqual(commits, [4], 'one commit carried the four calls');
  assert.deepEqual(texts(bob).sort(), ['m1', 'm2', 'm3', 'm4']);
  await relay.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a trap inside a group undoes the whole group: every call of it answers internal, and the relay goes on', async () => {
  const { dir, relay, alice, bob } = await sqliteRelay();
  const first = [1, 2].map((i) => relay.callGrouped(as(alice), 'message.send', message(alice, bob, `m${i}`)));
  relay.core.inner.call = () => {
    throw new WebAssembly.RuntimeError('unreachable');
  };
  const trapped = relay.callGrouped(as(alice), 'message.send', message(alice, bob, 'm3'));
  const all = await Promise.all([...first, trapped]);
  assert.deepEqual(all.map((r) => r.status), [500, 500, 500]);
  assert.ok(all.every((r) => r.body.error.code === 'internal'));
  assert.equal(relay.core.traps, 1);
  assert.deepEqual(texts(bob), [], 'nothing of the group was kept');
  const again = await relay.callGrouped(as(alice), 'message.send', message(alice, bob, 'm1'));
  assert.equal(again.status, 200, JSON.stringify(again.body));
  assert.deepEqual(texts(bob), ['m1']);
  await relay.close();
  fs.rmSync(dir, { recursive: true, force: true });
});
