// The relay core (wasm-bindgen build) behind a small wrapper that survives traps.
//
// A trap (a Rust panic is a wasm `unreachable`) leaves that wasm instance
// unusable. Nothing it was doing was committed, so the wrapper answers
// `internal`, drops the instance, and makes a fresh one over the same storage.

import fs from 'node:fs';
import vm from 'node:vm';
import { hostCrypto } from './native.js';
import { Log, messageOf } from './log.js';
import { isTrap } from './kit/step.js';
import { CommitGroup } from './kit/group.js';
import { tuning } from './tuning.js';


/** The core as a classic script (wasm-bindgen's no-modules target): each run of it is an instance of its own. */
const SCRIPT = new URL('../pkg/relay_wasm_script.js', import.meta.url);
const WASM = new URL('../pkg/relay_wasm_script_bg.wasm', import.meta.url);
/** The script and the compiled wasm module, read and compiled once per process (or thread). */
let loaded = null;

/**
 * Most calls in one commit group: a full group commits at once, and the rest wait for the
 * turn's end. RELAY_GROUP_COMMIT=N sets it as in the wasmtime host (0: each call commits
 * alone, to measure what grouping pays). No cap by default: a cap of 16 measured within
 * noise here (docs/performance.md).
 */
const groupCap = () => tuning().groupCommit ?? Infinity;

/**
 * A fresh instance of the core (its own glue and wasm memory), with the host's native crypto
 * installed. Nothing else holds it: once its `Core` lets go of it, it is garbage. (An ES
 * module imported under a fresh URL would stay in the module map for the process's life.)
 */
function loadModule(crypto) {
  loaded ??= {
    script: new vm.Script(`(() => {\n${fs.readFileSync(SCRIPT, 'utf8')}\nreturn wasm_bindgen;\n})()`, { filename: SCRIPT.pathname }),
    module: new WebAssembly.Module(fs.readFileSync(WASM)),
  };
  const mod = loaded.script.runInThisContext();
  mod.initSync({ module: loaded.module });
  mod.setHostCrypto(crypto);
  return mod;
}

const decoder = new TextDecoder();

/**
 * @typedef {import('./kit/step.js').Answer} Answer
 * @typedef {import('./kit/step.js').Step} Step
 */

/** The core's statics (answers for work it never saw), from a module loaded once per thread. */
let statics = null;
function core() {
  statics ??= loadModule(null);
  return statics.RelayCore;
}
/** The core's timer rules (`relay_core::transport::alarm`), for a relay's one timer. */
export const newAlarm = () => (core(), new statics.Alarm());
/**
 * The relay's side of the host's own metrics (`relay_core::transport::host_metrics`: attempts,
 * commits, ticks, traps), in the module that runs no relay, so a trap keeps them.
 */
export const newHostMetrics = () => (core(), new statics.HostMetrics());
/**
 * The transports' counts in the Prometheus text format, as every host writes them.
 * @param {{connections: number, websockets: number, refused: {limit: number, perIp: number}, busy: number, dropped: number}} m
 */
export const transportMetricsText = (m) => core().transportMetrics(m.connections, m.websockets, m.refused.limit, m.refused.perIp, m.busy, m.dropped);
/** The answer when the work waiting for the core is full: 503 unavailable, Retry-After 1. @returns {Answer} */
export const busyAnswer = () => /** @type {Answer} */ (core().busy());
/** The content type of the metrics text (Prometheus 0.0.4), the core's. @returns {string} */
export const metricsType = () => core().metricsType();
/** The health check a request is (`live`, `ready`), or null: the core decides which. @param {string} method @param {string} path @returns {'live' | 'ready' | null} */
export const healthCheck = (method, path) => core().healthCheck(method, path) ?? null;
/** The answer to a health check, in the core's words. @param {'live' | 'ready'} check @param {string | null} notReady @returns {Answer} */
export const healthAnswer = (check, notReady) => /** @type {Answer} */ (core().healthAnswer(check, notReady));
/** Why a relay is not ready (the core's words), or null. @param {{stopping?: boolean, coreDown?: boolean, storageFailing?: boolean}} s @returns {string | null} */
export const notReady = (s) => core().notReady(Boolean(s.stopping), Boolean(s.coreDown), Boolean(s.storageFailing)) ?? null;
/** The close every WebSocket gets when its relay stops (1001). @returns {[number, string]} */
export const stoppingClose = () => core().stoppingClose();
/** The answer frame to a WebSocket message when the work waiting for the core is full. @param {string} text */
export const busyFrame = (text) => core().busyFrame(text);
/** The answer frame to a WebSocket message lost before it committed: nothing was accepted. @param {string} text @returns {string} */
export const uncommittedFrame = (text) => core().uncommittedFrame(text);
/** `max_request_bytes` under `policies` (the default when not given). @param {Record<string, number>} [policies] */
export const maxRequestBytes = (policies) => core().maxRequestBytes(JSON.stringify(policies ?? {}));
/** `max_batch_bytes` under `policies`: the body limit of {@link batchPath}. @param {Record<string, number>} [policies] */
export const maxBatchBytes = (policies) => core().maxBatchBytes(JSON.stringify(policies ?? {}));
/** The path of relay RPC in batches, whose bodies are limited by `max_batch_bytes`. @type {() => string} */
export const batchPath = () => core().batchPath();
/** The request headers the core reads (lowercase): a host passes only these. @type {() => string[]} */
export const requestHeaders = () => core().requestHeaders().split(',');
/**
 * The transport limits every host enforces, from the core's one table.
 * @returns {{name: string, default: number, unit: 'ms' | 'count'}[]}
 */
export const transportLimits = () => JSON.parse(core().transportLimits());
/**
 * Why a relay must not connect to `ip` as a peer (loopback, private, link-local, ... in every
 * IPv6 form), or null when it may: the core's definition (`relay_core::transport::address`).
 * @param {string} ip @returns {string | null}
 */
export const refusedAddress = (ip) => core().refusedAddress(ip) ?? null;
/**
 * Why a relay on `network` must not send to `url` at all, or null: the core's rules
 * (`relay_core::transport::address::refused_url`), checked before any connection.
 * @param {string} url @param {string} network @param {boolean} allowPrivate @returns {string | null}
 */
export const refusedUrl = (url, network, allowPrivate) => core().refusedUrl(url, network, allowPrivate) ?? null;
/** The largest answer read from a peer; a longer one is an unknown outcome (the core's). @returns {number} */
export const maxAnswer = () => core().maxAnswer();
/** Whether a relay on `network` checks every address a peer's name resolves to. @param {string} network @param {boolean} allowPrivate @returns {boolean} */
export const vettedAddresses = (network, allowPrivate) => core().vettedAddresses(network, allowPrivate);
/**
 * The answer to a request the host refused on its own, as the core spells it for every host
 * (`relay_core::transport::Refusal`); it closes the connection.
 * @param {'too_large' | 'body_timeout' | 'unreadable_body' | 'unreadable_target'} name
 * @param {number} [n] the limit (bytes) or the timeout (ms)
 * @returns {Answer}
 */
export const refused = (name, n = 0) => /** @type {Answer} */ (core().refused(name, n));
/**
 * The answer to a backup step, as the core spells it: `{bytes, path}` once written, or 500
 * internal with `error`.
 * @param {string} path @param {number} bytes @param {string | null} error @returns {Answer}
 */
export const backupAnswer = (path, bytes, error) => /** @type {Answer} */ (core().backupAnswer(path, bytes, error));
/** The answer for a call lost before it committed: 500 internal, nothing was accepted. @returns {Answer} */
export const uncommitted = () => /** @type {Answer} */ (core().uncommitted());

/**
 * @typedef {object} Storage
 * @property {(key: Uint8Array) => Uint8Array | null | undefined} get
 * @property {(start: Uint8Array, end: Uint8Array, limit: number) => Array<[Uint8Array, Uint8Array]>} scan
 * @property {(writes: Array<[Uint8Array, Uint8Array | null]>) => void} commit
 */

/**
 * A fresh `RelayCore` over the storage. The core checks the store's schema version first; a
 * store written by a newer relay (or one it cannot read) throws an Error with its message.
 */
function instance(mod, config, storage, seed, operator) {
  try {
    return new mod.RelayCore(config, storage, seed, operator);
  } catch (e) {
    if (isTrap(e)) throw e;
    throw new Error(messageOf(e));
  }
}

export class Core {
  /**
   * @param {object} mod @param {string} config @param {Storage} storage @param {Uint8Array} seed @param {object | null} crypto
   * @param {{metrics?: {trap: () => void, restart: () => void} | null, log?: Log, operator?: string | null}} [host] where traps, restarts and
   *   commits are counted and logged, and the operator token (none: no operator API)
   */
  constructor(mod, config, storage, seed, crypto, host = {}) {
    this.mod = mod;
    this.crypto = crypto;
    this.config = config;
    this.storage = storage;
    this.seed = seed;
    this.traps = 0;
    this.metrics = host.metrics ?? null;
    this.log = host.log ?? new Log();
    this.operator = host.operator ?? null;
    this.inner = instance(mod, config, storage, seed, this.operator);
    /** False from a trap until a fresh instance stands (for /readyz). */
    this.healthy = true;
    /** False while the last group commit failed (for /readyz): the storage does not take writes. */
    this.committing = true;
    /** Called after each recovery from a trap: the relay ticks the fresh instance (which arms its timer). */
    this.onRecover = null;
    /** Called after a group commit failed: the relay ticks again soon, so no timer is lost. */
    this.onCommitFailed = null;
    /** The open commit group (the kit's): answers released after its flush. */
    this.group = new CommitGroup({
      begin: () => this.inner.beginGroup(),
      commit: (size) => this.#commitGroup(size),
      later: (flush) => setImmediate(flush),
      failed: (e, size) => {
        this.committing = false;
        this.log.error(`group commit of ${size} calls failed: ${messageOf(e)}`);
        if (isTrap(e)) this.#trapped(e);
        this.onCommitFailed?.();
      },
      cap: groupCap(),
    });
  }

  /**
   * Runs `f` (a call into the core returning its buffer) as part of a commit group, when the
   * storage can group commits: the calls made in one turn of the event loop share one
   * transaction, and each answer (with its effects) is released only after that transaction
   * is durable.
   * @param {(c: any) => Uint8Array} f
   * @returns {Promise<Step>}
   */
  async grouped(f) {
    const { out, committed } = await this.#inGroup(f);
    return committed ? out : uncommitted();
  }

  /**
   * Runs `f` in the open commit group (or alone, committing at once, when the storage cannot
   * group commits): what it returned, held until its group committed, and whether it did
   * (`out` is null when the call trapped: the group's writes went with the instance).
   * @template T @param {(c: any) => T} f @returns {Promise<{out: T | null, committed: boolean}>}
   */
  async #inGroup(f) {
    if (!this.storage.durable || this.group.cap === 0) {
      const out = this.guard(f, null);
      return { out, committed: out !== null };
    }
    this.group.enter();
    const out = this.#run(f, null);
    if (out === null || !this.group.open) return { out: null, committed: false };
    return { out, committed: (await this.group.hold(out)) !== null };
  }

  /** Commits the open group, then releases its answers (all `internal` if the commit failed). */
  flushGroup() {
    this.group.flush();
  }

  /**
   * The core's group commit: one storage commit for the group, which the storage counts as
   * `batch` operations. A group that wrote nothing commits nothing.
   * @param {number} size
   */
  #commitGroup(size) {
    try {
      this.storage.batch = size;
      this.inner.flushGroup();
      this.committing = true;
    } finally {
      this.storage.batch = 1;
    }
  }

  /**
   * @param {string} config @param {Storage} storage @param {Uint8Array} seed
   * @param {object | null} [crypto] the host crypto to offer the core (default: the native addon's)
   */
  static async create(config, storage, seed, crypto = hostCrypto(), host = {}) {
    return new Core(loadModule(crypto ?? null), config, storage, seed, crypto ?? null, host);
  }

  /** A call into the core read as a step; a trap answers `uncommitted`. */
  #step(f, flush) {
    const bytes = flush ? this.guard(f, null) : this.#run(f, null);
    return bytes === null ? uncommitted() : bytes;
  }

  /** Runs `f` against the instance, after committing any open group (so its answer and effects never precede a commit). */
  guard(f, fallback) {
    this.flushGroup();
    return this.#run(f, fallback);
  }

  /** Runs `f` against the instance; on a trap, replaces the instance and returns `fallback`. */
  #run(f, fallback) {
    try {
      return f(this.inner);
    } catch (e) {
      if (!isTrap(e)) throw e;
      this.#trapped(e);
      return fallback;
    }
  }

  /** After a trap: the open group (its writes were in the instance) answers that nothing was accepted, and a fresh instance stands. */
  #trapped(e) {
    this.traps += 1;
    this.healthy = false;
    this.metrics?.trap();
    this.log.error(`relay core trapped: ${e.message}; starting a fresh instance over the same storage`);
    this.group.drop();
    this.#recover();
  }

  /**
   * Replaces a trapped instance with a fresh one over the same storage. The trapped one is
   * dropped whole (never entered again, not even to free its objects: its memory goes with
   * it). Then `onRecover` learns when the fresh instance wants its next tick, so a timer is
   * armed whatever call trapped.
   */
  #recover() {
    // Unregisters the object's finalizer (plain JS), so nothing frees it inside the trapped instance later.
    this.inner.__destroy_into_raw?.();
    this.mod = loadModule(this.crypto);
    this.inner = instance(this.mod, this.config, this.storage, this.seed, this.operator);
    this.healthy = true;
    this.metrics?.restart();
    this.onRecover?.();
  }

  /**
   * A request read whole, in a commit group. `req.headers` is `name\nvalue\n` for each of
   * `requestHeaders()` present.
   * @param {{admin: boolean, method: string, path: string, query: string, headers: string, body: Uint8Array, origin: string | null}} req
   * @param {number} ticket the host's name for it while it may be parked in the core
   * @param {number} now
   * @returns {Promise<Step>}
   */
  handle(req, ticket, now) {
    return this.grouped((c) => c.handle(req.admin, req.method, req.path, req.query, req.headers, req.body, req.origin, ticket, now));
  }
  /**
   * Reports the GET of a key document a parked step named, in a commit group: what it
   * resumed, released after the group commits (`lost` when the commit failed).
   * @param {string} relay @param {import('./kit/outcome.js').Outcome} outcome @param {number} now
   * @returns {Promise<import('./kit/requests.js').Report>}
   */
  async keyFetched(relay, outcome, now) {
    const { out, committed } = await this.#inGroup((c) => c.keyFetched(relay, outcome, now));
    // A trap: the fresh instance has no parked requests, and the relay answers them all.
    if (out === null) return { resumed: [], lost: false };
    return { resumed: out, lost: !committed };
  }
  /**
   * A WebSocket text message: the answer frame, and the close to follow it and effects, if
   * any (or that it is parked under `ticket`); null when the core trapped.
   * @returns {import('./kit/step.js').Frame | null}
   */
  message(token, origin, text, ticket, now) {
    const s = this.guard((c) => c.message(token, origin, text, ticket, now), null);
    return s;
  }
  /** Calls a method in process (no commit group). @returns {Answer} */
  call(kind, value, origin, method, params, now) {
    return /** @type {Answer} */ (this.#step((c) => c.call(kind, value, origin, method, params, now), true));
  }
  /**
   * One of the seed's four methods as a typed call (the WIT's `send`, `deliver`, `status`,
   * `sync`): the record, with the events to carry out. A refusal is thrown (an Error whose
   * `payload` is the Failure), and after a trap the `internal` one: nothing was accepted.
   * @param {'send' | 'deliver' | 'status' | 'sync'} name
   * @param {unknown[]} args the binding's arguments after the method's name
   */
  typed(name, ...args) {
    const trapped = {};
    const r = this.guard((c) => c[name](...args), trapped);
    if (r === trapped) throw core().uncommittedFailure();
    return r;
  }
  callValue(kind, value, method, params, now) {
    return this.guard((c) => c.callValue(kind, value, method, params, now), { status: 500, body: JSON.parse(decoder.decode(uncommitted().body)) });
  }
  /**
   * Reports what became of a `send` event the host carried; returns the events.
   * @param {string} task @param {number} attempt @param {import('./kit/outcome.js').Outcome} outcome @param {number} now
   * @returns {object[]}
   */
  fetched(task, attempt, outcome, now) {
    return this.guard((c) => c.fetched(task, attempt, outcome, now), []);
  }
  /**
   * Runs what is due: the events (ending with the next wake-up, if any), the entries the
   * tick set aside (if any), and why it could not commit (if it could not).
   * @returns {{events: object[], quarantined?: Array<{entry: string, code: string, message: string, at: number}>, error?: string}}
   */
  tick(now) {
    return this.guard((c) => c.tick(now), { events: [], error: 'the core trapped' });
  }
  /**
   * The core's counters and destination gauges in the Prometheus text format ('' when the
   * instance trapped); throws an Error when the storage fails.
   * @returns {string}
   */
  metricsText() {
    try {
      return this.guard((c) => c.metrics(Date.now()), '');
    } catch (e) {
      if (typeof e === 'string') throw new Error(e);
      throw e;
    }
  }
  wellKnown() {
    return this.guard((c) => c.wellKnown(), '{}');
  }
}
