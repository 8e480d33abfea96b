// The embedding API: a relay in-process. JavaScript moves bytes, keeps time and runs
// effects; every protocol decision is the core's.

import { EventEmitter } from 'node:events';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import tls from 'node:tls';
import { Core, backupAnswer, maxAnswer, notReady, maxBatchBytes, maxRequestBytes, newAlarm, newHostMetrics, uncommitted, uncommittedFrame } from './core.js';
import { MemoryStorage, SqliteStorage } from './storage.js';
import { Log, messageOf } from './log.js';
import { REFUSED_CODE, refusedUrl, vettedAddresses, vettedLookup } from './outbound.js';
import { LIMITS } from './limits.js';
import { secret } from './secrets.js';
import { Parking, answer, runEvents } from './kit/requests.js';
import { failure, answered, notSent, unknown } from './kit/outcome.js';

export { secret };

const b64u = (buf) => Buffer.from(buf).toString('base64url');
/** Params as the core takes them: bytes (a string is UTF-8 encoded, a value serialized). */
/**
 * A caller's value as the core reads it: a relay's id followed, for a delivery, by a space
 * and the recipient's route revision it targets.
 * @param {import('./index.js').Caller} caller
 */
const callerValue = (caller) =>
  caller.kind === 'relay' && caller.routeRevision != null ? `${caller.value} ${caller.routeRevision}` : (caller.value ?? '');
const bytesOf = (p) => (p instanceof Uint8Array ? p : Buffer.from(typeof p === 'string' ? p : JSON.stringify(p)));

/**
 * Warns about a data directory or secret that others can read (made by an older relay, or by
 * hand): new ones are made 0700 and 0600, existing ones are left as they are.
 * @param {string} data @param {Log} log
 */
function warnOpen(data, log) {
  for (const [name, max] of [['.', 0o700], ['relay.key', 0o600], ['admin.token', 0o600], ['relay.sqlite', 0o600]]) {
    const file = path.join(data, name);
    try {
      const mode = fs.statSync(file).mode & 0o777;
      if (mode & ~max & 0o077) log.warn(`${name === '.' ? data : file} is open to others (mode ${mode.toString(8)}); chmod ${max.toString(8)} it`);
    } catch {
      // not there (memory storage): nothing to say
    }
  }
}

/** Largest answer read from a peer (the core's): a longer one is an unknown outcome. */
const MAX_ANSWER = maxAnswer();

/** The transport options a relay carries for `serve` (the limits, and the certificate to serve TLS with). */
export const SERVE_OPTIONS = [...Object.keys(LIMITS), 'tlsCert', 'tlsKey'];

/** @param {string | Buffer | Array<string | Buffer> | undefined} ca @returns {string[]} */
function caList(ca) {
  if (ca === undefined || ca === null) return [];
  return (Array.isArray(ca) ? ca : [ca]).map((c) => c.toString());
}

const decoder = new TextDecoder();

/**
 * A request read whole, as the core takes it (`Core.handle`).
 * @typedef {{admin: boolean, method: string, path: string, query: string, headers: string, body: Uint8Array, origin: string | null}} Request
 * @typedef {{status: number, headers: Record<string, string>, body: Uint8Array}} Answer
 */

/**
 * @typedef {object} RelayInfo
 * @property {string} relay
 * @property {string} network
 * @property {number} maxRequestBytes
 * @property {number} maxBatchBytes
 * @property {string} adminToken
 * @property {object} storage
 * @property {string | null} [data] the data directory, if any
 * @property {string} [adminListen] where `serve` puts the admin listener
 * @property {Log} [log]
 * @property {ReturnType<typeof newHostMetrics>} [metrics]
 * @property {boolean} [allowPrivatePeers] connect to private, loopback and other non-public peers off `dev`
 * @property {string | Buffer | Array<string | Buffer>} [ca] PEM certificates trusted for outbound https, beside the system's
 * @property {Record<string, unknown>} [serveOptions] `serve`'s options carried by the relay (limits, TLS)
 */

export class Relay extends EventEmitter {
  /**
   * @param {Core} core
   * @param {RelayInfo} info
   */
  constructor(core, info) {
    super();
    this.core = core;
    this.relay = info.relay;
    this.network = info.network;
    this.maxRequestBytes = info.maxRequestBytes;
    this.maxBatchBytes = info.maxBatchBytes;
    this.adminToken = info.adminToken;
    this.storage = info.storage;
    this.data = info.data ?? null;
    this.adminListen = info.adminListen ?? '127.0.0.1:0';
    this.log = info.log ?? core.log;
    this.metrics = info.metrics ?? core.metrics ?? newHostMetrics();
    this.timer = null;
    /** When the core is next ticked: the core's rules (earliest wins, backoff on failure). */
    this.alarm = newAlarm();
    this.closed = false;
    this.inflight = new Set();
    this.coreCalls = 0;
    /** What `serve` uses unless told otherwise: the limits and the certificate for TLS. */
    this.serveOptions = info.serveOptions ?? {};
    /** Off `dev`: https only, and (unless allowed) only public peer addresses. */
    this.outbound = { network: this.network, allowPrivatePeers: Boolean(info.allowPrivatePeers) };
    const extra = caList(info.ca);
    /** Kept-alive connections to peers, per scheme; https trusts the system's roots and `ca`. */
    this.agents = {
      'http:': new http.Agent({ keepAlive: true }),
      'https:': new https.Agent({ keepAlive: true, ...(extra.length ? { ca: [...tls.rootCertificates, ...extra] } : {}) }),
    };
    /** Connections go only to checked addresses, unless on `dev` or private peers are allowed. */
    this.lookup = vettedAddresses(this.network, this.outbound.allowPrivatePeers) ? vettedLookup : undefined;
    /** Requests parked in the core (the kit's): the fetches it names, and their answers by ticket. */
    this.parking = new Parking({
      getKey: async ({ relay, url, timeout_ms: timeout }) => {
        const o = await this.exchange('GET', url, {}, undefined, timeout);
        const why = failure(o);
        if (why) this.log.debug(`key fetch from ${relay} failed: ${why}`);
        return o;
      },
      keyFetched: (relay, o) => this.core.keyFetched(relay, o, Date.now()),
      run: (events) => this.#run(events),
    });
    /** What the core's events do here (the kit runs them). */
    this.handlers = {
      send: (e) => this.#attempt(e),
      wake: (e) => this.#schedule(e.at),
      notify: (e) => this.emit('notify', { account: e.account, latest_seq: e.latest_seq, frame: e.frame }),
      close: (e) => this.emit('end_device_sessions', { account: e.account, device_id: e.device_id, code: e.code, reason: e.reason }),
      accepted: (e) => {
        if (this.log.events) this.log.event({ event: 'accepted', method: e.method, message_id: e.message_id, from: e.from, to: e.to, status: e.status });
      },
      delivery_ended: (e) => {
        if (this.log.events) this.log.event({ event: 'delivery_ended', message_id: e.message_id, from: e.from, to: e.to, status: e.status, error_code: e.error_code });
      },
      // The audit trail: every operator action, whatever the event setting.
      operator_action: (e) => this.log.info('operator action', { event: 'operator_action', who: 'admin listener', action: e.action, subject: e.subject, touched: e.touched }),
    };
    // After a trap, whatever call it was, the fresh instance is ticked (which arms its timer).
    // Its parked requests went with the trapped instance: each is answered as uncommitted.
    core.onRecover = () => {
      this.parking.dropAll();
      this.#schedule(Date.now());
    };
    core.onCommitFailed = () => this.#failed();
    // The first tick (which arms the timer) on the next turn: whoever serves this relay
    // listens by then, so a peer fetching its key to authenticate a retry finds it. On a
    // relay thread the transports listen on another thread, later: the thread holds the
    // first tick until they say so (`listening`), or a peer's key fetch made meanwhile fails
    // and is remembered for a minute, refusing every retry until then.
    if (!info.holdTicks) this.#schedule(Date.now());
  }

  /** The transports listen: the first tick runs (once), which arms the timer. */
  listening() {
    if (!this.timer) this.#schedule(Date.now());
  }

  /**
   * Calls a method. `caller` is `{kind: 'anonymous'|'session'|'relay'|'operator', value?, origin?}`;
   * `origin` is the network address it connected from, by which anonymous calls are limited
   * too; none for an in-process caller.
   * @returns {{status: number, body: object}}
   */
  call(caller, method, params) {
    this.coreCalls += 1;
    return this.#answered(method, this.core.call(caller.kind, callerValue(caller), caller.origin ?? null, method, bytesOf(params), Date.now()));
  }

  /**
   * Calls a method in a commit group: concurrent calls share one durable transaction; the
   * answer and effects come after it commits.
   * @returns {Promise<{status: number, body: object}>}
   */
  async callGrouped(caller, method, params) {
    this.coreCalls += 1;
    const p = bytesOf(params);
    const r = /** @type {import('./core.js').Answer} */ (await this.core.grouped((c) => c.call(caller.kind, callerValue(caller), caller.origin ?? null, method, p, Date.now())));
    return this.#answered(method, r);
  }

  /**
   * message.send in process, typed (the WIT's `send`): `caller` as for `call`, `params` the
   * protocol's params (an object or its JSON). The DeliveryStatus; a refusal is thrown as an
   * Error whose `payload` is the Failure (`code`, `status`, `error`), with nothing committed.
   * @returns {import('../pkg/relay_wasm.js').DeliveryStatus}
   */
  send(caller, params) {
    return this.#typed('send', caller, bytesOf(params)).status;
  }

  /** message.deliver in process, typed, as `send` (the caller is a relay). @returns {import('../pkg/relay_wasm.js').DeliveryStatus} */
  deliver(caller, params) {
    return this.#typed('deliver', caller, bytesOf(params)).status;
  }

  /** message.delivery.status of the caller's message, typed. @returns {import('../pkg/relay_wasm.js').DeliveryStatus} */
  status(caller, messageId) {
    return this.#typed('status', caller, messageId).status;
  }

  /**
   * message.timeline.sync of the caller's device, typed: entries after `after`, at most
   * `limit` (the protocol's default when none).
   * @returns {{entries: import('../pkg/relay_wasm.js').TimelineEntry[], next: number, hasMore: boolean}}
   */
  sync(caller, after = 0, limit = undefined) {
    const { entries, next, hasMore } = this.#typed('sync', caller, after, limit);
    return { entries, next, hasMore };
  }

  /** A typed call of the core, its events carried out. */
  #typed(name, caller, ...args) {
    this.coreCalls += 1;
    const r = this.core.typed(name, caller.kind, callerValue(caller), ...args, Date.now());
    this.#run(r.events);
    return r;
  }

  #answered(method, r) {
    this.#run(r.effects);
    const body = JSON.parse(decoder.decode(r.body));
    return { status: r.status, body };
  }

  /**
   * A request read whole (`/v1/...`, `/relay/v1/...`, `/admin/v1/...`, `/.well-known/relay`,
   * a WebSocket upgrade), answered by the core: the answer to write, or the session a
   * WebSocket upgrade belongs to. A relay request whose source key is not known yet is parked
   * in the core until the fetch it names is reported; a backup is written here.
   * @param {Request} req
   * @returns {Promise<Answer | {upgrade: {token: string, account: string, device_id: string, expires_at: number, expiry_close: {code: number, reason: string}}}>}
   */
  async handle(req) {
    const s = await answer(
      (ticket) => {
        this.coreCalls += 1;
        return this.core.handle(req, ticket, Date.now());
      },
      { parking: this.parking, backup: (file) => this.#backup(file), run: (events) => this.#run(events), uncommitted },
    );
    if ('upgrade' in s) return s;
    return { status: s.status, headers: s.headers, body: s.body };
  }

  /** A WebSocket text message of session `token`: the answer frame, and the close to follow it, if any. */
  message(token, text, origin = null) {
    this.coreCalls += 1;
    const ticket = this.parking.open();
    try {
      const a = this.core.message(token, origin, text, ticket, Date.now());
      // Only a sibling shard's route parks a frame, and a Node relay is one shard: should one
      // be parked, nothing was accepted (its answer, when it comes, finds no ticket).
      if (a === null || a.parked) return { text: uncommittedFrame(text), close: null };
      if (a.effects) this.#run(a.effects);
      return { text: a.text, close: a.close ?? null };
    } finally {
      this.parking.close(ticket);
    }
  }

  /** `POST /admin/v1/backup`: the core checked the operator and the path; the copy is made here. */
  async #backup(file) {
    try {
      const r = await this.backup(file);
      return backupAnswer(r.path, r.bytes, null);
    } catch (e) {
      this.log.error(`backup to ${file}: ${messageOf(e)}`);
      return backupAnswer(file, 0, messageOf(e));
    }
  }

  /** Runs events: deliveries, wake-ups, notifications, session ends, log events (`this.handlers`). */
  #run(events) {
    runEvents(events, this.handlers);
  }

  // lines: timers
  /** Asks for a tick at `at`: the alarm keeps the earliest. */
  #schedule(at) {
    if (this.alarm.wakeAt(at) || !this.timer) this.#arm();
  }

  /** Sets the one timer for the alarm's deadline, if it is armed. */
  #arm() {
    clearTimeout(this.timer);
    const delay = this.alarm.delay(Date.now());
    this.timer = this.closed || delay === undefined ? null : setTimeout(() => this.#tick(), Math.min(delay, 2 ** 31 - 1));
  }

  #tick() {
    this.timer = null;
    if (this.closed) return;
    this.alarm.fire();
    const started = performance.now();
    const t = this.core.tick(Date.now());
    this.metrics.tick((performance.now() - started) / 1000);
    for (const q of t.quarantined ?? []) {
      this.log.warn('tick entry quarantined: it could not be processed and was set aside (admin.deliveries lists it)', { entry: q.entry, code: q.code, error: q.message });
    }
    if (t.error) {
      this.log.warn(`tick could not commit: ${t.error}; it runs again`);
      this.#failed();
    } else this.alarm.succeeded();
    // The tick's wake-up arms the timer (`#schedule`); with none, it stays disarmed.
    this.#run(t.events);
  }

  /** A tick or commit failed (storage busy): the alarm retries with its backoff. */
  #failed() {
    this.alarm.failed(Date.now());
    this.#arm();
  }

  // lines: sockets
  /**
   * One HTTP exchange with a peer over node:http(s); never follows redirects or retries
   * (fetch retries a 421 on its own, which would resend a signed request with a used nonce).
   * `not_sent` only when the request could not have reached the peer (no connection, or no
   * TLS session); after that an error or timeout is `unknown`.
   * @returns {Promise<import('./kit/outcome.js').Outcome>}
   */
  exchange(method, url, headers, body, timeout) {
    let u;
    try {
      u = new URL(url);
    } catch {
      return Promise.resolve(notSent('url'));
    }
    const refused = refusedUrl(u.href, this.outbound.network, this.outbound.allowPrivatePeers);
    const lib = u.protocol === 'https:' ? https : http;
    if (refused) {
      this.log.warn(`peer refused, not attempted: ${refused}`);
      return Promise.resolve(notSent('refused'));
    }
    return new Promise((resolve) => {
      let connected = false;
      let done = false;
      const finish = (r) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve(r);
      };
      const lost = (why) => (connected ? unknown(why) : notSent(why));
      const all = { ...headers };
      if (body !== undefined) all['content-length'] = Buffer.byteLength(body);
      const options = { method, headers: all, agent: this.agents[u.protocol], ...(this.lookup ? { lookup: this.lookup } : {}) };
      const req = lib.request(u, options, (res) => {
        const chunks = [];
        let size = 0;
        res.on('data', (c) => {
          size += c.length;
          if (size > MAX_ANSWER) req.destroy(new Error('answer too large'));
          else chunks.push(c);
        });
        res.on('end', () => finish(answered(res.statusCode, Buffer.concat(chunks))));
        res.on('error', (e) => finish(unknown(String(e?.code ?? e))));
      });
      const timer = setTimeout(() => {
        finish(lost('timeout'));
        req.destroy(new Error('timeout'));
      }, timeout);
      // Connected once the request can reach the peer: after the TLS handshake for https (a
      // failed handshake sent none of it), at once on a kept-alive socket.
      req.on('socket', (sock) => {
        if (req.reusedSocket) connected = true;
        else sock.once(u.protocol === 'https:' ? 'secureConnect' : 'connect', () => (connected = true));
      });
      req.on('error', (e) => {
        if (e?.code === REFUSED_CODE) this.log.warn(`peer refused, not attempted: ${e.message} (--allow-private-peers lifts the address check)`);
        finish(lost(String(e?.code ?? e?.message)));
      });
      req.end(body);
    });
  }

  /** Carries a `send` event: POSTs its url, headers and body as they are, and reports what became of it. */
  async #attempt(e) {
    const p = (async () => {
      const started = performance.now();
      const r = await this.exchange('POST', e.url, e.headers, e.body, e.timeout_ms);
      this.metrics.attempt(r, (performance.now() - started) / 1000);
      if (this.closed) return;
      this.#run(this.core.fetched(e.task, e.attempt, r, Date.now()));
    })();
    this.inflight.add(p);
    try {
      await p;
    } finally {
      this.inflight.delete(p);
    }
  }

  // lines: process
  /** This relay's `/.well-known/relay` document (JSON text). */
  wellKnown() {
    return this.core.wellKnown();
  }

  /**
   * Whether the relay can serve: its storage is open and took the last group commit, its
   * core instance is healthy (not between a trap and a fresh instance) and it is not
   * shutting down.
   * @returns {{ready: boolean, reason?: string}}
   */
  ready() {
    const reason = notReady({ stopping: this.closed, coreDown: !this.core.healthy, storageFailing: this.storage?.isOpen === false || !this.core.committing });
    return reason === null ? { ready: true } : { ready: false, reason };
  }

  /**
   * The metrics in the Prometheus text format: the core's counters and pending deliveries,
   * then the host's (attempts, commits, ticks, traps, restarts).
   * @returns {Promise<string>}
   */
  async metricsText() {
    const core = this.core.metricsText();
    return core + this.metrics.text();
  }

  /**
   * Copies the SQLite database to `file` (absolute; written whole with mode 0600, replacing
   * any file there) while the relay runs, through the relay's own connection (storage.js
   * `backup`).
   * @param {string} file
   * @returns {Promise<{path: string, bytes: number}>}
   */
  async backup(file) {
    if (typeof this.storage?.backup !== 'function') throw new Error('backup needs SQLite storage (this relay has none)');
    if (typeof file !== 'string' || !path.isAbsolute(file)) throw new Error('backup needs an absolute path');
    if (this.closed) throw new Error('the relay is shutting down');
    const started = performance.now();
    const r = await this.storage.backup(file);
    this.log.info('backup written', { path: r.path, bytes: r.bytes, ms: Math.round(performance.now() - started) });
    return r;
  }

  /** Stops timers and waits for deliveries in flight; the storage is closed when it can be. */
  async close() {
    this.closed = true;
    clearTimeout(this.timer);
    await Promise.allSettled([...this.inflight]);
    for (const a of Object.values(this.agents)) a.destroy();
    this.core.flushGroup();
    this.storage?.close?.();
  }
}

/**
 * Creates a relay in-process.
 * @param {object} opts
 * @param {string} opts.relay the relay id (origin URL)
 * @param {string} [opts.network] default `dev`
 * @param {object} [opts.policies] protocol.md §7 policies to override
 * @param {'sqlite'|'memory'|object} [opts.storage] default `sqlite` when `data` is given, else memory
 * @param {string} [opts.data] data directory (SQLite database, relay key, operator token)
 * @param {'node:sqlite'|'bun:sqlite'|'better-sqlite3'} [opts.sqliteDriver] which SQLite (default: the first the runtime offers)
 * @param {object} [opts.engine] `{attempt_timeout, max_in_flight_per_destination}`
 * @param {object} [opts.crypto] the host crypto offered to the core (default: the native addon's; a relay thread wraps it)
 * @param {string} [opts.adminListen] where `serve` puts the admin listener (default `127.0.0.1:0`)
 * @param {'text'|'json'} [opts.logFormat] default text
 * @param {Log} [opts.log] a log of the caller's (instead of one made from `logFormat`)
 * @param {boolean} [opts.allowPrivatePeers] off `dev`, connect to loopback, private and other non-public peers too
 * @param {string | Buffer | Array<string | Buffer>} [opts.ca] PEM CA certificates trusted for outbound https beside the system's
 * @returns {Promise<Relay>}
 */
export async function createRelay(opts) {
  const log = opts.log ?? new Log({ format: opts.logFormat ?? 'text' });
  const network = opts.network ?? 'dev';
  // The data directory holds the relay key and the operator token: its owner's only.
  if (opts.data) fs.mkdirSync(opts.data, { recursive: true, mode: 0o700 });
  // The secrets first: a start they stop leaves nothing open.
  const seed = opts.data ? secret(path.join(opts.data, 'relay.key'), 32) : crypto.randomBytes(32);
  const admin = opts.data ? secret(path.join(opts.data, 'admin.token'), 24) : crypto.randomBytes(24);
  let storage = opts.storage;
  if (storage === undefined) storage = opts.data ? 'sqlite' : 'memory';
  const owned = typeof storage === 'string';
  if (storage === 'sqlite') {
    if (!opts.data) throw new Error('sqlite storage needs a data directory');
    storage = new SqliteStorage(path.join(opts.data, 'relay.sqlite'), { driver: opts.sqliteDriver });
  } else if (storage === 'memory') {
    storage = new MemoryStorage();
  }
  // started_at: attempts in flight before now were carried by a relay that is gone (a trap
  // recovery reuses this configuration, so its attempts, still carried, are not).
  const config = JSON.stringify({ relay: opts.relay, network, policies: opts.policies ?? {}, started_at: Date.now(), ...(opts.engine ?? {}) });
  const metrics = newHostMetrics();
  let core;
  try {
    core = await Core.create(config, storage, new Uint8Array(seed), opts.crypto, { metrics, log, operator: b64u(admin) });
  } catch (e) {
    // A store this relay must not open (written by a newer one): let go of it, and say why.
    if (owned) storage.close?.();
    throw new Error(messageOf(e), { cause: e });
  }
  if ('onCommit' in storage) storage.onCommit = (size, seconds) => metrics.commit(size, seconds);
  if (opts.data) warnOpen(opts.data, log);
  return new Relay(core, {
    relay: opts.relay,
    network,
    maxRequestBytes: maxRequestBytes(opts.policies),
    maxBatchBytes: maxBatchBytes(opts.policies),
    adminToken: b64u(admin),
    storage,
    data: opts.data ?? null,
    adminListen: opts.adminListen,
    log,
    metrics,
    allowPrivatePeers: opts.allowPrivatePeers,
    ca: opts.ca,
    serveOptions: Object.fromEntries(SERVE_OPTIONS.filter((k) => opts[k] !== undefined).map((k) => [k, opts[k]])),
    holdTicks: opts.holdTicks === true,
  });
}
