// The worker side of a relay thread (relay-thread.js): the relay (core, storage, timers,
// deliveries to peers) runs here; the main thread only carries the transports.
//
// Messages in: `{id, op, args, pre?}` (`pre`: the digest of an envelope the main thread
// verified) and `{close: true}`. Messages out: `{started}`, then
// `{answers: [[id, ok, value], ...]}` (the answers a commit group releases cross together),
// `{event, data}` for the relay's notifications, `{learn: [token, key]}` and `{closed: true}`.

import { parentPort, workerData } from 'node:worker_threads';
import { createRelay } from './relay.js';
import { Dispatch } from './dispatch.js';
import { addon, hostCrypto } from './native.js';
import { Preverified, preverifying } from './preverify.js';
import { Log } from './log.js';

// Envelopes the main thread verified are answered from memory (preverify.js); the main
// thread learns each session's key from the core's own verifications here.
const native = addon();
const base = hostCrypto();
const preverified = preverifying(native) && base?.verifyEd25519 ? new Preverified(native, (token, key) => parentPort.postMessage({ learn: [token, key] })) : null;
const crypto = preverified ? { ...base, verifyEd25519: preverified.wrap(base.verifyEd25519) } : undefined;

const log = new Log({ format: workerData.logFormat ?? 'text' });
const relay = await createRelay({ ...workerData, crypto, log });
const dispatch = new Dispatch(relay);
for (const event of ['notify', 'end_device_sessions']) dispatch.on(event, (data) => parentPort.postMessage({ event, data }));

/** Answers waiting to cross: those a commit group releases together cross in one message. */
let ready = [];
function answer(id, ok, value) {
  if (ready.length === 0) queueMicrotask(flush);
  ready.push([id, ok, value]);
}
function flush() {
  if (ready.length === 0) return;
  const answers = ready;
  ready = [];
  parentPort.postMessage({ answers });
}

/** An answer's body as JSON text, so the main thread neither clones nor re-serializes a tree. */
const asText = (r) => ({ status: r.status, body: typeof r.body === 'string' ? r.body : JSON.stringify(r.body) });

const ops = {
  request: async (space, method, token, headers, text, origin) => {
    // The core runs a call synchronously: the session is known to the verifier for exactly its span.
    if (preverified && space === 'v1' && method === 'message.send') preverified.sending = token;
    let answer;
    try {
      answer = dispatch.request(space, method, token, headers, text, origin);
    } finally {
      if (preverified) preverified.sending = null;
    }
    return asText(await answer);
  },
  session: (token) => dispatch.session(token),
  frame: (token, text, origin) => dispatch.frame(token, text, origin),
  stats: () => ({ coreCalls: relay.coreCalls, preverified: preverified?.hits ?? 0 }),
  ready: () => dispatch.ready(),
  metrics: () => dispatch.metrics(),
};

async function run(id, op, args) {
  try {
    answer(id, true, await ops[op](...args));
  } catch (e) {
    log.error(`relay thread: ${op} failed: ${e?.stack ?? e}`);
    answer(id, false, String(e?.message ?? e));
  }
}

parentPort.on('message', async (m) => {
  if (m.close) {
    await dispatch.close();
    flush();
    parentPort.postMessage({ closed: true });
    parentPort.close();
    return;
  }
  if (m.pre && preverified) preverified.add(m.pre);
  run(m.id, m.op, m.args);
});

parentPort.postMessage({ started: { wellKnown: dispatch.wellKnown, maxRequestBytes: dispatch.maxRequestBytes, data: dispatch.data, adminListen: dispatch.adminListen } });
