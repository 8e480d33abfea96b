// The relay core (wasm-bindgen build) behind a small wrapper that survives traps.
//
// A trap (a Rust panic is a wasm `unreachable`) leaves that wasm instance
// unusable. Nothing it was doing was committed, so the wrapper answers
// `internal`, drops the instance, and makes a fresh one over the same storage.

import fs from 'node:fs';
import vm from 'node:vm';
import { hostCrypto } from './native.js';
import { Log, messageOf } from './log.js';

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
const GROUP_CAP = groupCap(process.env.RELAY_GROUP_COMMIT);

function groupCap(v) {
  if (v === undefined || v === '') return Infinity;
  if (!/^\d+$/.test(v)) throw new Error(`RELAY_GROUP_COMMIT must be a number of calls, not ${v}`);
  return Number(v);
}

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

const INTERNAL = JSON.stringify({
  status: 500,
  body: { error: { code: 'internal', message: 'the relay core failed; nothing was accepted' } },
  effects: [],
});

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
function instance(mod, config, storage, seed) {
  try {
    return new mod.RelayCore(config, storage, seed);
  } catch (e) {
    if (e instanceof WebAssembly.RuntimeError) throw e;
    throw new Error(messageOf(e));
  }
}

export class Core {
  /**
   * @param {object} mod @param {string} config @param {Storage} storage @param {Uint8Array} seed @param {object | null} crypto
   * @param {{metrics?: import('./metrics.js').RelayMetrics | null, log?: Log}} [host] where traps, restarts and commits are counted and logged
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
    this.inner = instance(mod, config, storage, seed);
    /** False from a trap until a fresh instance stands (for /readyz). */
    this.healthy = true;
    /** False while the last group commit failed (for /readyz): the storage does not take writes. */
    this.committing = true;
    /** Called with the fresh instance's next wake-up (ms, or -1) after each recovery from a trap. */
    this.onRecover = null;
    /** Called after a group commit failed: the relay ticks again soon, so no timer is lost. */
    this.onCommitFailed = null;
    /** Answers of the open commit group, released after its flush: `[reply, resolve]`. */
    this.group = null;
  }

  /**
   * Calls a method as part of a commit group (when the storage can group commits): the
   * calls made in one turn of the event loop share one transaction, and each answer (with
   * its effects) is released only after that transaction is durable.
   * @returns {Promise<object>} the reply, as `call` returns it
   */
  callGrouped(kind, value, origin, method, params, now) {
    if (typeof this.storage.begin !== 'function' || GROUP_CAP === 0) return Promise.resolve(this.call(kind, value, origin, method, params, now));
    if (!this.group) {
      this.storage.begin();
      this.group = [];
      setImmediate(() => this.flushGroup());
    }
    const reply = JSON.parse(this.#run((c) => c.call(kind, value, origin, method, params, now), INTERNAL));
    const answer = new Promise((resolve) => this.group.push([reply, resolve]));
    if (this.group.length >= GROUP_CAP) this.flushGroup();
    return answer;
  }

  /** Commits the open group, then releases its answers (all `internal` if the commit failed). */
  flushGroup() {
    const group = this.group;
    if (!group) return;
    this.group = null;
    let durable = true;
    const started = performance.now();
    try {
      // A group that wrote nothing commits nothing, and is not counted.
      if (this.storage.flush()) this.metrics?.commit(group.length, (performance.now() - started) / 1000);
      this.committing = true;
    } catch (e) {
      durable = false;
      this.committing = false;
      this.log.error(`group commit of ${group.length} calls failed: ${messageOf(e)}`);
      this.onCommitFailed?.();
    }
    for (const [reply, resolve] of group) resolve(durable ? reply : JSON.parse(INTERNAL));
  }

  /**
   * @param {string} config @param {Storage} storage @param {Uint8Array} seed
   * @param {object | null} [crypto] the host crypto to offer the core (default: the native addon's)
   */
  static async create(config, storage, seed, crypto = hostCrypto(), host = {}) {
    return new Core(loadModule(crypto ?? null), config, storage, seed, crypto ?? null, host);
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
      if (!(e instanceof WebAssembly.RuntimeError)) throw e;
      this.traps += 1;
      this.healthy = false;
      this.metrics?.traps.inc();
      this.log.error(`relay core trapped: ${e.message}; starting a fresh instance over the same storage`);
      this.#recover();
      return fallback;
    }
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
    this.inner = instance(this.mod, this.config, this.storage, this.seed);
    this.healthy = true;
    this.metrics?.restarts.inc();
    let at = -1;
    try {
      at = this.inner.nextWake();
    } catch (e) {
      if (!(e instanceof WebAssembly.RuntimeError)) throw e;
      // The fresh instance cannot say: look again soon rather than never.
      at = Date.now() + 1000;
    }
    this.onRecover?.(at);
  }

  call(kind, value, origin, method, params, now) {
    return JSON.parse(this.guard((c) => c.call(kind, value, origin, method, params, now), INTERNAL));
  }
  callValue(kind, value, method, params, now) {
    return this.guard((c) => c.callValue(kind, value, method, params, now), JSON.parse(INTERNAL));
  }
  outcome(task, attempt, kind, body, now) {
    return JSON.parse(this.guard((c) => c.outcome(task, attempt, kind, body, now), '[]'));
  }
  /**
   * Runs what is due: the effects, the entries the tick set aside (if any), and why it could
   * not commit (if it could not).
   * @returns {{effects: object[], quarantined?: Array<{entry: string, code: string, message: string, at: number}>, error?: string}}
   */
  tick(now) {
    return JSON.parse(this.guard((c) => c.tick(now), '{"effects":[]}'));
  }
  /**
   * The core's counters and pending deliveries in the Prometheus text format ('' when the
   * instance trapped); throws an Error when the storage fails.
   * @returns {string}
   */
  metricsText() {
    try {
      return this.guard((c) => c.metrics(), '');
    } catch (e) {
      if (typeof e === 'string') throw new Error(e);
      throw e;
    }
  }
  nextWake() {
    return this.guard((c) => c.nextWake(), -1);
  }
  /** @returns {{ok: true, info: {account: string, device_id: string, expires_at: number}} | {ok: false, reply: object}} */
  session(token, now) {
    try {
      return { ok: true, info: JSON.parse(this.guard((c) => c.session(token, now), 'null')) };
    } catch (e) {
      if (typeof e === 'string') return { ok: false, reply: JSON.parse(e) };
      throw e;
    }
  }
  signRequest(method, target, body, now) {
    return JSON.parse(this.guard((c) => c.signRequest(method, target, body, now), 'null'));
  }
  /** @returns {{ok: true, value: string} | {ok: false, reply: object}} */
  checkRequest(headers, method, body, now) {
    return this.#fallible((c) => c.checkRequest(JSON.stringify(headers), method, body, now));
  }
  authenticateRequest(headers, method, body, now, key) {
    return this.#fallible((c) => c.authenticateRequest(JSON.stringify(headers), method, body, now, key));
  }
  peerKey(body, relay) {
    return this.#fallible((c) => c.peerKey(body, relay));
  }
  wellKnown() {
    return this.guard((c) => c.wellKnown(), '{}');
  }
  /** A WebSocket frame parsed by the core: `{id, method, params}` or `{id, error}`. */
  parseFrame(text) {
    return JSON.parse(this.mod.RelayCore.parseFrame(text));
  }
  /** The core's strict I-JSON verdict on a body: null if fine, else the error reply. */
  checkJson(body) {
    const r = this.mod.RelayCore.checkJson(body);
    return r === '' ? null : JSON.parse(r);
  }
  #fallible(f) {
    try {
      const v = this.guard(f, null);
      return v === null ? { ok: false, reply: JSON.parse(INTERNAL) } : { ok: true, value: v };
    } catch (e) {
      if (typeof e === 'string') return { ok: false, reply: JSON.parse(e) };
      throw e;
    }
  }
}
