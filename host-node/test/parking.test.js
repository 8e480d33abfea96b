// The kit's side of parked requests (kit/requests.js): tickets, resumptions handed to their
// requests however they interleave, a lost report, and the effects of an answer whose request
// is gone. The core's side (which requests park, the bounds) is tested in relay-core.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Parking, answer, answerFrame } from '../src/kit/requests.js';

const ok = (n) => ({ status: 200, headers: {}, body: new Uint8Array([n]), effects: [{ type: 'wake', at: n }] });
const uncommitted = () => ({ status: 500, headers: {}, body: new Uint8Array() });

/** A parking whose fetches the test completes by hand, and the effects it ran. */
function parkingFor() {
  const gets = [];
  const ran = [];
  const parking = new Parking({
    getKey: (k) => new Promise((done) => gets.push({ k, done })),
    keyFetched: async (relay, o) => o,
    run: (events) => ran.push(...(events ?? [])),
  });
  return { parking, gets, ran };
}

test('a parked request waits for its ticket, the fetch it names is started once, and a request parked again keeps waiting', async () => {
  const { parking, gets, ran } = parkingFor();
  const host = { parking, backup: async () => uncommitted(), run: (e) => ran.push(...(e ?? [])), uncommitted };
  const tickets = [];
  const first = answer(async (t) => (tickets.push(t), { parked: { key: { relay: 'r', url: 'u', timeout_ms: 1 } } }), host);
  const second = answer(async (t) => (tickets.push(t), { parked: {} }), host);
  await new Promise((r) => setImmediate(r));
  assert.equal(gets.length, 1, 'only the parked step that names a fetch starts one');
  assert.notEqual(tickets[0], tickets[1]);
  // The report resumes the second (parked again, on a fetch of its own) and answers the first.
  gets[0].done({
    resumed: [
      { ticket: tickets[1], step: { parked: { key: { relay: 's', url: 'v', timeout_ms: 1 } } } },
      { ticket: tickets[0], step: ok(1) },
    ],
    lost: false,
  });
  assert.deepEqual((await first).body, new Uint8Array([1]));
  await new Promise((r) => setImmediate(r));
  assert.equal(gets.length, 2);
  gets[1].done({ resumed: [{ ticket: tickets[1], step: ok(2) }], lost: false });
  assert.deepEqual((await second).body, new Uint8Array([2]));
  assert.deepEqual(ran.map((e) => e.at), [1, 2], 'each answer runs its effects once');
  assert.equal(parking.waiting.size, 0, 'answered tickets are closed');
});

test('a report whose commit failed answers its requests uncommitted; an answer whose request is gone still runs its effects; a restart answers all', async () => {
  const { parking, gets, ran } = parkingFor();
  const host = { parking, backup: async () => uncommitted(), run: () => {}, uncommitted };
  let t1;
  const lost = answer(async (t) => ((t1 = t), { parked: { key: { relay: 'r', url: 'u', timeout_ms: 1 } } }), host);
  await new Promise((r) => setImmediate(r));
  gets[0].done({ resumed: [{ ticket: t1, step: ok(1) }, { ticket: 999, step: ok(9) }], lost: true });
  assert.equal((await lost).status, 500);
  assert.deepEqual(ran, [], 'nothing of a failed commit runs');
  parking.deliver({ resumed: [{ ticket: 999, step: ok(9) }], lost: false });
  assert.deepEqual(ran.map((e) => e.at), [9]);
  // A frame parked when the core restarts gets the core's uncommitted frame.
  const frame = answerFrame(() => ({ text: '', parked: {} }), { parking, uncommitted: () => 'gone' });
  await new Promise((r) => setImmediate(r));
  parking.dropAll();
  assert.deepEqual(await frame, { text: 'gone' });
});
