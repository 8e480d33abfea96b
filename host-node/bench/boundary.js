// Crossing the JS/wasm boundary: JSON strings vs serde-wasm-bindgen values, for send and sync.
// node host-node/bench/boundary.js [N]
import { createRelay } from '../src/index.js';
import { register, message, as } from '../test/helpers.js';

const N = Number(process.argv[2] ?? 2000);
const relay = await createRelay({ relay: 'http://127.0.0.1:1', policies: { send_rate: 0, deliver_rate_per_account: 0 } });
const alice = register(relay);
const bob = register(relay);
const strings = Array.from({ length: N }, (_, i) => message(alice, bob, 'x'.repeat(900) + i));
const values = Array.from({ length: N }, (_, i) => JSON.parse(message(alice, bob, 'y'.repeat(900) + i)));
const core = relay.core.inner;

function time(label, f) {
  const t = process.hrtime.bigint();
  for (let i = 0; i < N; i++) f(i);
  const us = Number(process.hrtime.bigint() - t) / 1000 / N;
  console.log(`${label.padEnd(40)} ${us.toFixed(1).padStart(8)} µs/op`);
  return us;
}

const s1 = time('send, JSON string in/out', (i) => JSON.parse(core.call('session', alice.session, null, 'message.send', strings[i], Date.now())));
const s2 = time('send, serde-wasm-bindgen values', (i) => core.callValue('session', alice.session, 'message.send', values[i], Date.now()));
const page = '{"after":0,"limit":50}';
const pageV = { after: 0, limit: 50 };
const y1 = time('sync 50 entries, JSON string in/out', () => JSON.parse(core.call('session', bob.session, null, 'message.timeline.sync', page, Date.now())));
const y2 = time('sync 50 entries, serde-wasm-bindgen values', () => core.callValue('session', bob.session, 'message.timeline.sync', pageV, Date.now()));
console.log(`string/value time ratio: send ${(s1 / s2).toFixed(2)}, sync ${(y1 / y2).toFixed(2)} (below 1: strings are faster)`);
await relay.close();
