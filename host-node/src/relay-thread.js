// A relay on a worker thread, seen from the main thread: the transports (HTTP parsing,
// WebSocket frames) run here while the core, its storage and its commits run there, so the
// two overlap on two cores. What crosses is text: request bodies in, answer bodies out.

import { EventEmitter } from 'node:events';
import { Worker } from 'node:worker_threads';
import { addon } from './native.js';
import { Ahead, preverifying } from './preverify.js';
import { Log } from './log.js';
import { notReady } from './core.js';
import { SERVE_OPTIONS } from './relay.js';

const WORKER = new URL('./relay-thread-worker.js', import.meta.url);

/** A relay running on its own thread; `serve(thread)` puts the transports in front of it. */
export class RelayThread extends EventEmitter {
  /**
   * @param {Worker} worker
   * @param {{wellKnown: string, maxRequestBytes: number, maxBatchBytes: number, data: string | null, adminListen: string, config: string}} started
   * @param {Log} [log] this thread's log (the transports')
   * @param {Record<string, unknown>} [serveOptions] `serve`'s options given at start (limits, TLS)
   * @param {Ahead | null} [ahead] envelopes verified here, ahead of the thread (preverify.js)
   */
  constructor(worker, started, log = new Log(), serveOptions = {}, ahead = null) {
    super();
    this.worker = worker;
    /** What `serve` uses unless told otherwise: the limits and the certificate for TLS (kept on this thread). */
    this.serveOptions = serveOptions;
    this.wellKnown = started.wellKnown;
    this.maxRequestBytes = started.maxRequestBytes;
    this.maxBatchBytes = started.maxBatchBytes;
    this.data = started.data;
    this.adminListen = started.adminListen;
    this.log = log;
    this.nextId = 0;
    /** Calls waiting for the thread: id -> [resolve, reject]. */
    this.pending = new Map();
    this.closing = null;
    /** Why the thread is gone, once it is: later calls fail at once. */
    this.gone = null;
    /** Envelopes verified here, ahead of the thread (preverify.js); null when off. */
    this.ahead = ahead;
    worker.on('message', (m) => this.#receive(m));
    worker.on('error', (e) => this.#lost(e));
    worker.on('exit', (code) => this.#lost(new Error(`the relay thread exited (code ${code})`)));
  }

  /**
   * Starts a relay thread; `opts` are `createRelay`'s (plain data: storage 'sqlite' or 'memory').
   * @param {import('./relay.js').RelayOptions} opts
   * @returns {Promise<RelayThread>}
   */
  static start(opts) {
    const { log, ...rest } = opts;
    const mine = log ?? new Log({ format: opts.logFormat ?? 'text' });
    // The transports' options stay here (the TLS key never crosses to the relay thread).
    const serveOptions = Object.fromEntries(SERVE_OPTIONS.filter((k) => rest[k] !== undefined).map((k) => [k, rest[k]]));
    const data = Object.fromEntries(Object.entries(rest).filter(([k]) => !SERVE_OPTIONS.includes(k)));
    const native = addon();
    const ahead = preverifying(native) ? new Ahead(native) : null;
    return new Promise((resolve, reject) => {
      const worker = new Worker(WORKER, { workerData: { ...data, logFormat: mine.format, preverify: ahead?.id ?? 0 } });
      const early = (e) => reject(e instanceof Error ? e : new Error(`the relay thread exited (code ${e})`));
      worker.once('error', early);
      worker.once('exit', early);
      worker.once('message', (m) => {
        worker.off('error', early);
        worker.off('exit', early);
        if (m.started) {
          ahead?.open(m.started.config);
          return resolve(new RelayThread(worker, m.started, mine, serveOptions, ahead));
        }
        ahead?.close();
        reject(new Error('the relay thread did not start'));
      });
    });
  }

  /**
   * Same as `Relay.handle`, answered by the thread, or here when the core's rules need no
   * state (preverify.js). The body crosses (moved, not cloned); the envelope of a client's
   * message.send or a relay's message.deliver may be verified here first.
   * @param {import('./relay.js').Request} req
   */
  handle(req) {
    const ahead = this.ahead?.request(req);
    if (ahead?.status != null) return Promise.resolve({ status: ahead.status, headers: ahead.headers ?? {}, body: ahead.body ?? new Uint8Array() });
    const body = new Uint8Array(req.body);
    return this.#call('handle', [{ ...req, body }], ahead?.sending ?? null, [body.buffer]);
  }

  /** The transports listen: the relay on the thread runs its first tick (held until now). */
  listening() {
    return this.#call('listening', []);
  }

  /** Same as `Relay.message`; a message.send's envelope may be verified here first. */
  message(token, text, origin = null) {
    return this.#call('message', [token, text, origin], this.ahead?.frame(token, text) ? token : null);
  }

  /** Stops the relay on its thread (deliveries in flight finish, the storage closes), then the thread. */
  close() {
    this.closing ??= this.gone
      ? Promise.resolve()
      : new Promise((resolve) => {
          this.once('closed', resolve);
          this.once('gone', resolve);
          this.worker.postMessage({ close: true });
        }).then(() => this.worker.terminate());
    return this.closing;
  }

  /**
   * Whether the relay on the thread can serve (/readyz): not when the thread is gone or
   * closing, else as the relay says.
   * @returns {Promise<{ready: boolean, reason?: string}>}
   */
  async ready() {
    if (this.gone) return { ready: false, reason: notReady({ coreDown: true }) };
    if (this.closing) return { ready: false, reason: notReady({ stopping: true }) };
    try {
      return await this.#call('ready', []);
    } catch (e) {
      return { ready: false, reason: e.message };
    }
  }

  /**
   * The metrics of the relay on the thread (the core's, then the relay's), asked for at
   * each scrape: the figures live there.
   * @returns {Promise<string>}
   */
  metricsText() {
    return this.#call('metrics', []);
  }

  /** Counters of the relay on the thread: the calls that reached its core, and the verifications answered from the memory. */
  stats() {
    return this.#call('stats', []);
  }

  #call(op, args, sending = null, transfer = []) {
    if (this.gone) return Promise.reject(this.gone);
    if (this.closing) return Promise.reject(new Error('the relay thread is closing'));
    const id = this.nextId++;
    // Posted at once: the thread starts on a request while this one reads the next.
    this.worker.postMessage(sending === null ? { id, op, args } : { id, op, args, sending }, transfer);
    return new Promise((resolve, reject) => this.pending.set(id, [resolve, reject]));
  }

  #receive(m) {
    if (m.answers) {
      for (const [id, ok, value] of m.answers) {
        const p = this.pending.get(id);
        this.pending.delete(id);
        if (ok) p?.[0](value);
        else p?.[1](new Error(value));
      }
    } else if (m.event) {
      this.emit(m.event, m.data);
    } else if (m.closed) {
      this.emit('closed');
    }
  }

  /**
   * The thread is gone: every call waiting on it, and every later one, fails with a
   * `RELAY_THREAD_LOST` error. Whether those calls were committed is unknown, so the
   * transports drop their connections rather than answer (`internal` would say nothing
   * was accepted); the client's idempotent retry learns the outcome.
   */
  #lost(cause) {
    if (this.gone) return;
    this.ahead?.close();
    const e = Object.assign(new Error(cause.message, { cause }), { code: 'RELAY_THREAD_LOST' });
    this.gone = e;
    for (const [, reject] of this.pending.values()) reject(e);
    this.pending.clear();
    this.emit('gone');
    if (!this.closing) this.emit('lost', e);
  }
}
