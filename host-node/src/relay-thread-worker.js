// The worker side of a relay thread (relay-thread.js): the relay (core, storage, timers,
// deliveries to peers) runs here; the main thread only carries the transports.
//
// Messages in: `{id, op, args, sending?}` (`sending`: the session of a message.send) and
// `{close: true}`. Messages out: `{started}`, then `{answers: [[id, ok, value], ...]}` (the
// answers a commit group releases cross together), `{event, data}` for the relay's
// notifications, and `{closed: true}`.

import { parentPort, workerData } from 'node:worker_threads';
import { createRelay } from './relay.js';
import { addon, hostCrypto } from './native.js';
import { Preverified } from './preverify.js';
import { Log } from './log.js';

// Envelopes the main thread verified are answered from the relay's memory (preverify.js,
// `workerData.preverify` its id); the core's own verifications here teach it session keys.
const native = addon();
const base = hostCrypto();
const preverified = workerData.preverify && base?.verifyEd25519 ? new Preverified(native, workerData.preverify) : null;
const crypto = preverified ? { ...base, verifyEd25519: preverified.wrap(base.verifyEd25519) } : undefined;

const log = new Log({ format: workerData.logFormat ?? 'text' });
// The first tick waits for the transports to listen (`listening`).
const relay = await createRelay({ ...workerData, crypto, log, holdTicks: true });
for (const event of ['notify', 'end_device_sessions']) relay.on(event, (data) => parentPort.postMessage({ event, data }));

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

/** The message.send's session, told to the verifier for exactly the span of the core's call. */
let sending = null;

/** Runs `call`, whose core call is synchronous, with the session known to the verifier for exactly its span. */
function told(call) {
  if (preverified) preverified.sending = sending;
  try {
    return call();
  } finally {
    if (preverified) preverified.sending = null;
  }
}

const ops = {
  handle: (req) => told(() => relay.handle(req)),
  message: (token, text, origin) => told(() => relay.message(token, text, origin)),
  stats: () => ({ coreCalls: relay.coreCalls, preverified: preverified?.hits ?? 0 }),
  ready: () => relay.ready(),
  listening: () => relay.listening(),
  metrics: () => relay.metricsText(),
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
    await relay.close();
    flush();
    parentPort.postMessage({ closed: true });
    parentPort.close();
    return;
  }
  sending = m.sending ?? null;
  run(m.id, m.op, m.args);
  sending = null;
});

parentPort.postMessage({ started: { config: relay.core.config, wellKnown: relay.wellKnown(), maxRequestBytes: relay.maxRequestBytes, maxBatchBytes: relay.maxBatchBytes, data: relay.data, adminListen: relay.adminListen } });
