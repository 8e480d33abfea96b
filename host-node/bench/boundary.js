// Crossing the JS/wasm boundary: `call` (JSON in, an answer object with the JSON body) vs the
// typed calls (records out) vs serde-wasm-bindgen values in and out, for send and sync.
// node host-node/bench/boundary.js [N]
import { createRelay } from '../src/index.js';
import { register, message, as } from '../test/helpers.js';

const N = Number(process.argv[2] ?? 2000);
const relay = await createRelay({ relay: 'http://127.0.0.1:1', policies: { send_rate: 0, deliver_rate_per_account: 0, account_request_rate: 0 } });
const alice = register(relay);
const bob = register(relay);
const enc = new TextEncoder();
const dec = new TextDecoder();
const batch = (t) => Array.from({ length: N }, (_, i) => enc.encode(message(alice, bob, t.repeat(900) + i)));
const [viaCall, viaTyped, viaValues] = [batch('x'), batch('y'), batch('z').map((b) => JSON.parse(dec.decode(b)))];
const core = relay.core.inner;

function time(label, f) {
  const t = process.hrtime.bigint();
  for (let i = 0; i < N; i++) f(i);
  const us = Number(process.hrtime.bigint() - t) / 1000 / N;
  console.log(`${label.padEnd(48)} ${us.toFixed(1).padStart(8)} µs/op`);
  return us;
}

// The answer as a client reads it: `call` gives the JSON body, the typed calls a record.
const s1 = time('send, call (JSON body, parsed)', (i) => JSON.parse(dec.decode(core.call('session', alice.session, null, 'message.send', viaCall[i], Date.now()).body)));
const s2 = time('send, typed (DeliveryStatus record)', (i) => core.send('session', alice.session, viaTyped[i], Date.now()));
const s3 = time('send, serde-wasm-bindgen values (callValue)', (i) => core.callValue('session', alice.session, 'message.send', viaValues[i], Date.now()));
const page = enc.encode('{"after":0,"limit":50}');
const y1 = time('sync 50 entries, call (JSON body, parsed)', () => JSON.parse(dec.decode(core.call('session', bob.session, null, 'message.timeline.sync', page, Date.now()).body)));
const y2 = time('sync 50 entries, typed (TimelinePage record)', () => core.sync('session', bob.session, 0, 50, Date.now()));
console.log(`typed/call time ratio: send ${(s2 / s1).toFixed(2)}, sync ${(y2 / y1).toFixed(2)}; values/call send ${(s3 / s1).toFixed(2)} (below 1: faster than call)`);
await relay.close();
