// The relay on workerd (Cloudflare Workers): a Worker that routes each request to the
// Durable Object of its shard, and the Durable Object class `RelayShard`, one relay core over
// the object's SQLite storage. The host moves bytes: the core decides routing, status codes,
// headers, frames, retries and what every outbound outcome means (protocol.md §6).
//
// Bindings (the same locally, from `relay-edge serve`, and in wrangler.jsonc):
// - RELAY: the Durable Object namespace of `RelayShard`;
// - CONFIG (JSON): {relay, network, policies, attempt_timeout?, max_in_flight_per_destination?, shards,
//   allow_private_peers?, probe_peers?};
// - RELAY_KEY, ADMIN_TOKEN (secrets): the relay key's 32-byte seed and the operator token, base64url;
// - DOOR: "admin" on the Worker that serves the operator API (`/admin/v1/...`, `/metrics`);
//   absent on the public one.

import { DurableObject } from 'cloudflare:workers';
import { connect } from 'cloudflare:sockets';
import { Alarm, RelayCore, REQUEST_HEADERS, generation, reset, uncommitted, headerText, shardOf } from './core.js';
import { SqlStore, ShardIndex } from './store.js';
import { EMPTY, isTrap } from '../kit/step.js';
import { CommitGroup } from '../kit/group.js';
import { Parking, answer as answerOf, answerFrame, runEvents } from '../kit/requests.js';
import { answered, notSent, unknown, failure, readAll } from '../kit/outcome.js';

/** The keys of CONFIG that are the engine's own options (relay-settings' `Engine`). */
const ENGINE_KEYS = ['attempt_timeout', 'max_in_flight_per_destination'];
const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** The headers that carry, from the Worker to an object, what only the Worker knows. */
const DOOR = 'x-relay-door';
const ORIGIN = 'x-relay-origin';
const SHARD = 'x-relay-shard';
const REQUEST_NAMES = new Set(REQUEST_HEADERS);
/**
 * Most outbound connections one object holds at once: Cloudflare allows six simultaneous open
 * connections per invocation, and an object's attempts and key fetches share its invocations.
 * The rest wait their turn in order; an attempt's time starts when its turn comes.
 */
const MAX_OUTBOUND = 6;

/** Turns for outbound connections: at most `n` at once, the rest first come, first served. */
class Turns {
  /** @param {number} n */
  constructor(n) {
    this.free = n;
    /** @type {Array<() => void>} */
    this.waiting = [];
  }

  /** Resolves when a turn is this caller's. */
  take() {
    if (this.free > 0) {
      this.free -= 1;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /** Ends a turn: the next waiting caller's starts. */
  give() {
    const next = this.waiting.shift();
    if (next) next();
    else this.free += 1;
  }
}

/** Most calls in one commit group: a full group commits at once (the Node host has none by default; 64 bounds an answer's wait). */
const GROUP_CAP = 64;

/** The error body of protocol.md §4, for what the host answers itself. */
const text = (status, body, type = 'text/plain; charset=utf-8') => new Response(body, { status, headers: { 'content-type': type } });

/** @param {string} s base64url @returns {Uint8Array} */
function unb64u(s) {
  const t = s.trim().replace(/-/g, '+').replace(/_/g, '/');
  const bin = atob(t + '='.repeat((4 - (t.length % 4)) % 4));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

// lines: configuration
/**
 * The relay's settings from the bindings.
 * @param {any} env
 */
function settingsOf(env) {
  const c = env.CONFIG ?? {};
  const seed = unb64u(String(env.RELAY_KEY ?? ''));
  if (seed.length !== 32) throw new Error('RELAY_KEY must hold 32 bytes in base64url');
  return {
    relay: String(c.relay),
    network: String(c.network ?? 'dev'),
    policies: c.policies ?? {},
    // The engine's own options, passed to the core as they are.
    engine: Object.fromEntries(ENGINE_KEYS.filter((k) => c[k] !== undefined).map((k) => [k, c[k]])),
    shards: Math.max(1, Number(c.shards ?? 1)),
    allowPrivatePeers: c.allow_private_peers === true,
    probePeers: c.probe_peers !== false,
    seed,
    token: env.ADMIN_TOKEN ? String(env.ADMIN_TOKEN).trim() : null,
  };
}

// lines: sockets
/** The stub of shard `k`'s object. @param {any} env @param {number} k */
const shard = (env, k) => env.RELAY.get(env.RELAY.idFromName(`shard-${k}`));

/**
 * A request's body, read within `limit` bytes; a 413 answer when it is over (the declared
 * length first, then the count).
 * @param {Request} request @param {number} limit
 * @returns {Promise<Uint8Array | Response>}
 */
async function readBody(request, limit) {
  const declared = Number(request.headers.get('content-length'));
  const body = Number.isFinite(declared) && declared > limit ? null : await readAll(request.body, limit);
  return body ?? respond(RelayCore.refused('too_large', limit));
}

/** `max_request_bytes` under the configured policies, as every shard's core takes them (read once per isolate). */
let maxRequestBytes = 0;
let maxBatchBytes = 0;
/** The path of relay RPC in batches, whose bodies have `max_batch_bytes` instead. */
const BATCH_PATH = RelayCore.batchPath();
/** The body limit of a request to `path` (read once per isolate). @param {any} env @param {string} path */
const maxBytes = (env, path) =>
  path === BATCH_PATH
    ? (maxBatchBytes ||= RelayCore.maxBatchBytes(JSON.stringify(env.CONFIG?.policies ?? {})))
    : (maxRequestBytes ||= RelayCore.maxRequestBytes(JSON.stringify(env.CONFIG?.policies ?? {})));

/** The health checks (the core's answers): `live` here, `ready` from every shard. */
async function health(env, check, count) {
  if (check === 'ready') {
    for (let k = 0; k < count; k += 1) {
      const r = await shard(env, k).fetch('https://shard/readyz', { headers: { [SHARD]: String(k) } });
      if (r.status !== 200) return r;
    }
  }
  return respond(RelayCore.healthAnswer(check, null));
}

/**
 * The core's metrics of every shard; with more than one, merged by the core (each sample
 * gains a `shard` label, and each family's lines stay together).
 */
async function metrics(env, count) {
  if (count === 1) return shard(env, 0).fetch('https://shard/metrics', { headers: { [SHARD]: '0', [DOOR]: 'admin' } });
  const texts = [];
  for (let k = 0; k < count; k += 1) {
    const r = await shard(env, k).fetch('https://shard/metrics', { headers: { [SHARD]: String(k), [DOOR]: 'admin' } });
    if (r.status !== 200) return r;
    texts.push(await r.text());
  }
  return text(200, RelayCore.mergeShardMetrics(texts), RelayCore.metricsType());
}

export default {
  /**
   * Every request of both doors: read whole (within max_request_bytes), routed to its
   * shard's object as the core decides (`shardOf`), answered as that object answers.
   * @param {Request} request @param {any} env
   */
  async fetch(request, env) {
    const admin = env.DOOR === 'admin';
    let url;
    try {
      url = new URL(request.url);
    } catch {
      // A target workerd passed on but no URL reads (`http://[::1/v1/ws`): the core's 400.
      return respond(RelayCore.refused('unreadable_target', 0));
    }
    const count = Math.max(1, Number(env.CONFIG?.shards ?? 1));
    /** The shard's object and the request for it. @type {{k: number, init: RequestInit}} */
    let to;
    try {
      const check = RelayCore.healthCheck(request.method, url.pathname);
      if (check) return await health(env, check, count);
      if (admin && (request.method === 'GET' || request.method === 'HEAD') && url.pathname === '/metrics') return await metrics(env, count);
      let body = EMPTY;
      if (request.method === 'POST') {
        const b = await readBody(request, maxBytes(env, url.pathname));
        if (b instanceof Response) return b;
        body = b;
      }
      const query = url.search.slice(1);
      const k = shardOf(admin, request.method, url.pathname, query, headerText(request.headers), body, count);
      // Only what the core reads crosses, and what the Worker alone knows: the door, the
      // peer's address (Cloudflare's header; set by the socket on workerd), the shard.
      const headers = new Headers();
      for (const [n, v] of request.headers) if (REQUEST_NAMES.has(n)) headers.set(n, v);
      // workerd hands a Worker a WebSocket handshake with its Upgrade header (Connection, a
      // hop-by-hop header, need not survive): the core sees the handshake as a client sent it.
      if (request.headers.get('upgrade')?.toLowerCase() === 'websocket') {
        headers.set('upgrade', 'websocket');
        headers.set('connection', 'upgrade');
      }
      const origin = request.headers.get('cf-connecting-ip');
      // Every call but a WebSocket handshake goes to the object by JavaScript RPC: plain
      // data in (the request as the core reads it), plain data out (the core's answer).
      if (!headers.has('upgrade')) {
        const call = { shard: k, admin, method: request.method, path: url.pathname, query, headers: headerText(request.headers), body, origin };
        return shard(env, k)
          .request(call)
          .then(respond, (e) => {
            // Not answered as a call that accepted nothing: the object may have committed
            // before it failed, so the outcome is unknown, as a dropped connection's is.
            console.error(`shard ${k} failed: ${e?.message ?? e}`);
            return new Response(null, { status: 502 });
          });
      }
      if (admin) headers.set(DOOR, 'admin');
      if (origin) headers.set(ORIGIN, origin);
      headers.set(SHARD, String(k));
      to = { k, init: { method: request.method, headers, body: request.method === 'POST' ? body : undefined } };
    } catch (e) {
      console.error(`request failed: ${e?.stack ?? e}`);
      return respond(uncommitted());
    }
    // A failure of the object's call is not answered as one that accepted nothing: the
    // object may have committed before it failed. workerd's bare 500 leaves the outcome
    // unknown, as a dropped connection does on the other hosts.
    return shard(env, to.k).fetch(`https://shard${url.pathname}${url.search}`, to.init);
  },
};

// lines: process
/**
 * One shard of the relay: a relay core over this object's SQLite storage. The requests of one
 * turn of the event loop form a commit group (the core's `beginGroup`/`flushGroup`, as on the
 * other hosts) committed in one `transactionSync`; other calls run in one of their own. An
 * answer leaves only after its writes are durable, and a call or group that throws or traps
 * leaves nothing behind. The alarm carries the core's
 * next wake-up; WebSockets are hibernatable (`acceptWebSocket`), tagged with their account
 * and device, their session in the attachment.
 */
export class RelayShard extends DurableObject {
  /** @param {DurableObjectState} ctx @param {any} env */
  constructor(ctx, env) {
    super(ctx, env);
    this.settings = settingsOf(env);
    this.store = new SqlStore(ctx.storage.sql);
    this.index = new ShardIndex(ctx.storage.sql);
    /** @type {any} the RelayCore, made at first use in each generation of the wasm instance */
    this.core = null;
    this.gen = -1;
    /** When this object started: its attempts' `fetch`es live only as long as it does. */
    this.startedAt = Date.now();
    /** Why no core can be made (a store from a newer relay, a bad configuration), if so. */
    this.broken = null;
    /** The core's timer rules (earliest wins, backoff on failure), made per wasm generation. */
    this.alarmRules = null;
    this.alarmGen = -1;
    /** Outbound connections (attempts, key fetches, their connection probes): MAX_OUTBOUND at once. */
    this.outbound = new Turns(MAX_OUTBOUND);
    /** The open commit group (the kit's): the calls of one turn, committed in one `transactionSync`. */
    this.group = new CommitGroup({
      begin: () => this.core.beginGroup(),
      commit: () => this.#commitGroup(),
      later: (flush) => setTimeout(flush, 0),
      failed: (e, size) => {
        if (isTrap(e)) this.#trapped(e);
        else console.error(`group commit of ${size} calls rolled back: ${e?.message ?? e}`);
        this.#failed();
      },
      cap: GROUP_CAP,
    });
    /** Requests parked in the core (the kit's): the fetches it names, and their answers by ticket. */
    this.parking = new Parking({
      getKey: async ({ relay, url, timeout_ms: timeout }) => {
        const o = await this.#exchange('GET', url, {}, undefined, timeout);
        const why = failure(o);
        if (why) console.warn(`key fetch from ${relay} failed: ${why}`);
        return o;
      },
      keyFetched: (relay, o) => this.#report((c) => c.keyFetched(relay, o, Date.now())),
      // The core's request for the sibling shard: route.get of the account.
      getRoute: ({ shard: k, path, body }) => this.#internal(k, 'POST', path, '', encoder.encode(body)),
      routeFetched: (account, o) => this.#report((c) => c.routeFetched(account, o, Date.now())),
      run: (events) => this.#run(events),
    });
    /** What the core's events do here (the kit runs them). */
    this.handlers = {
      send: (e) => this.ctx.waitUntil(this.#attempt(e)),
      wake: (e) => this.#wake(e.at),
      // A call a sibling shard is handed whose answer nobody needs (a route shared with the shard of its account).
      shard_call: (e) => this.ctx.waitUntil(this.#internal(e.shard, 'POST', e.path, '', encoder.encode(e.body))),
      notify: (e) => {
        for (const ws of this.ctx.getWebSockets(e.account)) trySend(ws, e.frame);
      },
      // The audit trail: one JSON line per operator action, always (Workers Logs keeps console output).
      operator_action: (e) => console.log(JSON.stringify({ event: 'operator_action', who: 'admin listener', action: e.action, subject: e.subject, touched: e.touched })),
      close: (e) => {
        for (const ws of this.ctx.getWebSockets(`${e.account} ${e.device_id}`)) {
          try {
            ws.close(e.code, e.reason);
          } catch {
            // closed already
          }
        }
      },
    };
    ctx.blockConcurrencyWhile(async () => {
      const armed = await ctx.storage.getAlarm();
      if (armed !== null) this.#alarm().wakeAt(armed);
      // The other hosts tick at start; an object starts at its first request or alarm.
      if (this.index.get() !== null) this.#tick();
    });
  }

  /** The shard index the Worker names (kept: an object woken by its alarm learns it from storage). */
  #learn(k) {
    const n = Number(k ?? 0);
    if (this.index.get() !== n) this.index.set(n);
  }

  /** The core's answer while this object has no core: why it cannot start. */
  #cannotStart() {
    return RelayCore.cannotStart(this.broken ?? 'the core trapped');
  }

  /** The RelayCore of this generation, made over the storage when missing; null when none can be made. */
  #ensure() {
    if (this.core && this.gen === generation) return this.core;
    if (this.core && this.gen !== generation) {
      // Made in a replaced instance: let go of it without entering that instance again.
      this.core.__destroy_into_raw?.();
      this.core = null;
    }
    // A fresh core has no parked requests: those of the one before are answered as uncommitted.
    this.parking?.dropAll();
    const s = this.settings;
    const k = this.index.get() ?? 0;
    const config = {
      relay: s.relay,
      network: s.network,
      policies: s.policies,
      // Attempts in flight before this object started were carried by an instance that is gone.
      started_at: this.startedAt,
      ...s.engine,
      ...(s.shards > 1 ? { shard: { index: k, count: s.shards } } : {}),
    };
    try {
      this.core = this.#transaction(() => new RelayCore(JSON.stringify(config), this.store, s.seed, s.token));
      this.gen = generation;
      this.broken = null;
      this.maxBytes = RelayCore.maxRequestBytes(JSON.stringify(s.policies));
    } catch (e) {
      if (e instanceof WebAssembly.RuntimeError) reset();
      this.broken = String(e?.message ?? e);
      console.error(`shard ${k}: cannot start the relay core: ${this.broken}`);
      this.core = null;
    }
    return this.core;
  }

  // lines: storage
  /**
   * `f` in one `transactionSync`; the store learns whether it committed (its memory of what
   * the database holds keeps only committed writes).
   * @template T @param {() => T} f @returns {T}
   */
  #transaction(f) {
    let committed = false;
    try {
      const out = this.ctx.storage.transactionSync(f);
      committed = true;
      return out;
    } finally {
      this.store.settled(committed);
    }
  }

  /**
   * Runs `f` (a call into the core) in this object's commit group: the calls made in one turn
   * of the event loop (at most GROUP_CAP) leave their writes in the core's group, which one
   * `transactionSync` then commits, and each answer is released only after that commit.
   * The group's answers are null (nothing was accepted) when the call or the commit failed.
   * @template T @param {(core: any) => T} f @returns {Promise<T | null>}
   */
  #grouped(f) {
    // A group of a core that is gone (another object's trap replaced the instance) ends first.
    if (this.group.open && (!this.core || this.gen !== generation)) this.group.flush();
    const core = this.#ensure();
    if (!core) return Promise.resolve(null);
    this.group.enter();
    let out;
    try {
      out = f(core);
    } catch (e) {
      // A trap: the group's writes went with the instance, and its answers with them.
      this.#trapped(e);
      return Promise.resolve(null);
    }
    return this.group.hold(out);
  }

  /**
   * Reports a fetch a parked step named (`f` calls keyFetched or routeFetched) in the commit
   * group: what it resumed, released after the group commits (`lost` when it failed).
   * @param {(core: any) => import('../kit/requests.js').Resumed[]} f
   * @returns {Promise<import('../kit/requests.js').Report>}
   */
  async #report(f) {
    /** @type {import('../kit/requests.js').Resumed[]} */
    let raw = [];
    const held = await this.#grouped((c) => (raw = f(c)));
    return { resumed: raw, lost: held === null };
  }

  /** Commits the open group's writes in one transaction (throws when it could not). */
  #commitGroup() {
    this.store.failed = null;
    // The instance was replaced since the group opened (another object's trap): the
    // group's writes went with it.
    if (!this.core || this.gen !== generation) throw new Error('the core was replaced before its group committed');
    this.#transaction(() => {
      this.core.flushGroup();
      if (this.store.failed) throw this.store.failed;
    });
  }

  // lines: process
  /** After a trap (or a call that threw): the open group answers null, and a fresh instance stands at next use. */
  #trapped(e) {
    if (isTrap(e)) {
      console.error(`relay core trapped: ${e.message}; starting a fresh instance over the same storage`);
      this.core?.__destroy_into_raw?.();
      this.core = null;
      reset();
    } else {
      // Thrown through the core part-way (a storage read that threw): its group may hold part
      // of the call, so this object's core is let go of and a new one made at next use.
      console.error(`core call failed: ${e?.message ?? e}`);
      this.core?.__destroy_into_raw?.();
      this.core = null;
    }
    this.group.drop();
    this.#failed();
  }

  /**
   * Runs one call into the core in one transaction with its commits, after committing any open
   * group (so no answer or effect precedes a commit). A trap or a failed commit rolls the
   * transaction back and returns `fallback`; after a trap the instance is replaced and this
   * object ticks again soon (its fresh core arms the alarm).
   * @template T @param {(core: any) => T} f @param {T} fallback @returns {T}
   */
  #call(f, fallback) {
    this.group.flush();
    const core = this.#ensure();
    if (!core) return fallback;
    this.store.failed = null;
    try {
      return this.#transaction(() => {
        const out = f(core);
        // A commit that failed part-way: nothing of the call stays.
        if (this.store.failed) throw this.store.failed;
        return out;
      });
    } catch (e) {
      // A trap replaces the instance (as in a group); a failed commit only rolls back.
      if (isTrap(e)) this.#trapped(e);
      else {
        console.error(`core call rolled back: ${e?.message ?? e}`);
        this.#failed();
      }
      return fallback;
    }
  }

  // lines: sockets
  /** A request from the Worker (or from a sibling shard). @param {Request} request */
  async fetch(request) {
    const h = request.headers;
    this.#learn(h.get(SHARD));
    const url = new URL(request.url);
    // The Worker's own calls (a GET each): readiness, and the metrics of the admin door.
    if (request.method === 'GET' && url.pathname === '/readyz') {
      const why = this.#ensure() ? null : RelayCore.notReady(false, true, false) + (this.broken ? `: ${this.broken}` : '');
      return respond(RelayCore.healthAnswer('ready', why));
    }
    // No core (a store this relay must not open, a bad configuration): every call says why.
    if (!this.#ensure()) return respond(this.#cannotStart());
    const admin = h.get(DOOR) === 'admin';
    if (admin && request.method === 'GET' && url.pathname === '/metrics') {
      const m = this.#call((c) => c.metrics(Date.now()), null);
      const why = () => RelayCore.notReady(false, true, false) + (this.broken ? `: ${this.broken}` : '');
      return m === null ? respond(RelayCore.healthAnswer('ready', why())) : text(200, m, RelayCore.metricsType());
    }
    const req = {
      admin,
      method: request.method,
      path: url.pathname,
      query: url.search.slice(1),
      headers: headerText(h),
      body: request.method === 'POST' ? new Uint8Array(await request.arrayBuffer()) : EMPTY,
      origin: h.get(ORIGIN),
    };
    const s = await this.handle(req);
    if ('upgrade' in s) return this.#accept(s.upgrade, req.origin);
    return respond(s);
  }

  /**
   * A request from the Worker by JavaScript RPC (every call but a WebSocket handshake): the
   * request as the core reads it, answered `{status, headers, body}`.
   * @param {{shard: number, admin: boolean, method: string, path: string, query: string, headers: string, body: Uint8Array, origin: string | null}} req
   */
  async request(req) {
    this.#learn(req.shard);
    if (!this.#ensure()) return this.#cannotStart();
    const s = await this.handle(req);
    // An upgrade never comes this way (the Worker sends handshakes by fetch).
    if ('upgrade' in s) return RelayCore.misroutedHandshake();
    return { status: s.status, headers: s.headers, body: s.body };
  }

  /**
   * A request read whole, answered by the core: the answer, or the session a WebSocket
   * upgrade belongs to. A relay request whose source key is not known yet, or a call that
   * needs a sibling shard's route, is parked in the core until the fetch it names reports.
   * @returns {Promise<any>}
   */
  handle(req) {
    return answerOf(
      async (ticket) => {
        const out = await this.#grouped((c) => c.handle(req.admin, req.method, req.path, req.query, req.headers, req.body, req.origin, ticket, Date.now()));
        return out === null ? uncommitted() : out;
      },
      {
        parking: this.parking,
        backup: async () => RelayCore.noBackup('the edge host keeps no database file of its own; Durable Object storage is backed up by the platform'),
        run: (events) => this.#run(events),
        uncommitted,
      },
    );
  }

  /**
   * A request to a sibling shard's object, as a plain request of the public door from no
   * address: its answer, or unknown when it was sent without one.
   * @returns {Promise<import('../kit/outcome.js').Outcome>}
   */
  async #internal(k, method, path, headers, body) {
    try {
      const h = new Headers({ [SHARD]: String(k) });
      for (let lines = headers.split('\n'), i = 0; i + 1 < lines.length; i += 2) h.set(lines[i], lines[i + 1]);
      const res = await shard(this.env, k).fetch(`https://shard${path}`, { method, headers: h, body: method === 'POST' ? body : undefined });
      return answered(res.status, new Uint8Array(await res.arrayBuffer()));
    } catch (e) {
      console.warn(`shard ${k} did not answer: ${e?.message ?? e}`);
      return unknown(String(e?.message ?? e));
    }
  }

  /**
   * Accepts a WebSocket the core upgraded: hibernatable, tagged with the account and the
   * device (notifications and closes find it by tag), its session in the attachment (which
   * outlives hibernation); the alarm is set for its expiry.
   */
  #accept(u, origin) {
    const pair = new WebSocketPair();
    const [client, server] = [pair[0], pair[1]];
    this.ctx.acceptWebSocket(server, [u.account, `${u.account} ${u.device_id}`]);
    server.serializeAttachment({ token: u.token, account: u.account, device_id: u.device_id, expires_at: u.expires_at, close: u.expiry_close, origin });
    this.#wake(u.expires_at);
    return new Response(null, { status: 101, webSocket: client });
  }

  /**
   * A WebSocket text message (also after the object hibernated and came back): the core's
   * answer frame, and the close to follow it, if any. Over max_request_bytes: close 1009.
   * @param {WebSocket} ws @param {string | ArrayBuffer} message
   */
  async webSocketMessage(ws, message) {
    const a = ws.deserializeAttachment();
    if (!a) return;
    const size = typeof message === 'string' ? encoder.encode(message).byteLength : message.byteLength;
    if (!this.#ensure()) {
      ws.close(1011, 'the relay is not ready');
      return;
    }
    if (size > this.maxBytes) {
      ws.close(1009, 'message too big');
      return;
    }
    const textOf = typeof message === 'string' ? message : decoder.decode(message);
    const frame = await answerFrame(
      (ticket) => {
        const out = this.#call((c) => c.message(a.token, a.origin ?? null, textOf, ticket, Date.now()), null);
        return out;
      },
      { parking: this.parking, uncommitted: () => RelayCore.uncommittedFrame(textOf) },
    );
    trySend(ws, frame.text);
    if (frame.close) ws.close(frame.close[0], frame.close[1]);
    this.#run(frame.effects);
  }

  /** @param {WebSocket} ws @param {number} code @param {string} reason */
  webSocketClose(ws, code, reason) {
    try {
      ws.close(code, reason);
    } catch {
      // 1005 and 1006 cannot be sent back; the socket is gone either way
    }
  }

  webSocketError() {}

  // lines: timers
  /** The alarm: the core's tick, then the sessions that expired are closed. */
  async alarm() {
    this.#alarm().fire();
    this.#tick();
    const now = Date.now();
    let next = Infinity;
    for (const ws of this.ctx.getWebSockets()) {
      const a = ws.deserializeAttachment();
      if (!a) continue;
      if (a.expires_at <= now) ws.close(a.close.code, a.close.reason);
      else next = Math.min(next, a.expires_at);
    }
    if (next !== Infinity) this.#wake(next);
  }

  #tick() {
    const out = this.#call((c) => c.tick(Date.now()), null);
    if (out === null) return; // no core, or the call failed and `#call` armed the retry
    const t = out;
    for (const q of t.quarantined ?? []) {
      console.warn(`tick entry quarantined: it could not be processed and was set aside (admin.deliveries lists it): ${JSON.stringify(q)}`);
    }
    this.#run(t.events);
    if (t.error) {
      console.warn(`tick could not commit: ${t.error}; it runs again`);
      this.#failed();
    } else this.#alarm().succeeded();
  }

  /**
   * The core's alarm rules (`relay_core::transport::alarm`). They live in the wasm instance:
   * after a trap replaced it, fresh ones start unarmed and the trap's retry arms them.
   */
  #alarm() {
    if (this.alarmGen !== generation) [this.alarmRules, this.alarmGen] = [new Alarm(), generation];
    return this.alarmRules;
  }

  /** A tick or call failed: the alarm retries, from 100 ms doubling to 10 s while failures last. */
  #failed() {
    this.#alarm().failed(Date.now());
    this.#arm();
  }

  /** Arms the alarm for `at` unless it is armed for earlier (an early alarm only ticks early). */
  #wake(at) {
    if (this.#alarm().wakeAt(at)) this.#arm();
  }

  /** Sets the object's one alarm for the deadline the rules hold, if any. */
  #arm() {
    const at = this.#alarm().deadline();
    if (at !== undefined) this.ctx.storage.setAlarm(at);
  }

  // lines: process
  /** Runs the core's events: deliveries, wake-ups, calls to sibling shards, notifications, session ends (`this.handlers`). */
  #run(events) {
    runEvents(events, this.handlers);
  }

  // lines: sockets
  /** Carries a `send` event: to a sibling shard's object, or POSTed to its url; reports what became of it. */
  async #attempt(e) {
    const r = e.shard !== undefined && e.shard !== null ? await this.#toSibling(e.shard, e.url, encoder.encode(e.body)) : await this.#exchange('POST', e.url, e.headers, e.body, e.timeout_ms);
    // In the commit group of its turn, like a request: its events run after the commit.
    this.#run((await this.#grouped((c) => c.fetched(e.task, e.attempt, r, Date.now()))) ?? []);
  }

  /**
   * A send event for sibling shard `k`, by JavaScript RPC on its object (`sibling`): its
   * answer, or unknown when the call failed without one.
   * @returns {Promise<import('../kit/outcome.js').Outcome>}
   */
  async #toSibling(k, url, body) {
    try {
      const r = await shard(this.env, k).sibling(k, url, body);
      return answered(r.status, r.body);
    } catch (e) {
      console.warn(`shard ${k} did not answer: ${e?.message ?? e}`);
      return unknown(String(e?.message ?? e));
    }
  }

  /**
   * A sibling shard's send event for this shard (JavaScript RPC from its object): the core
   * runs it as the relay's own call, with no relay authentication (the shards share the
   * relay's key; nothing but a sibling's object reaches this method). `{status, body}`.
   * @param {number} k this shard's index @param {string} url @param {Uint8Array} body
   */
  async sibling(k, url, body) {
    this.#learn(k);
    if (!this.#ensure()) return this.#cannotStart();
    const out = await this.#grouped((c) => c.sibling(url, body, Date.now()));
    const s = out === null ? uncommitted() : out;
    this.#run(s.effects);
    return { status: s.status, body: s.body.slice() };
  }

  /**
   * One HTTP exchange with a peer: answered, not sent, or unknown (the kit's outcomes).
   * Never follows a redirect, never retries.
   *
   * workerd's fetch throws the same `Network connection lost.` for a refused connection as
   * for one reset after the request left, so a connection is opened first (`connect`, under
   * the same network rules as fetch): when it fails (refused, unresolved, an address the
   * rules refuse) the request is *not attempted*; once it succeeded, any failure is unknown.
   * `probe_peers: false` skips it (every failure is then unknown, which is safe).
   *
   * At most MAX_OUTBOUND exchanges of this object are open at once (Workers' limit on
   * simultaneous connections); the rest wait in order, and one that waited its whole time
   * is reported never sent.
   * @returns {Promise<import('../kit/outcome.js').Outcome>}
   */
  async #exchange(method, url, headers, body, timeout) {
    let u;
    try {
      u = new URL(url);
    } catch {
      return notSent('url');
    }
    const refused = RelayCore.refusedUrl(u.href, this.settings.network, this.settings.allowPrivatePeers);
    if (refused) {
      console.warn(`peer refused, not attempted: ${refused}`);
      return notSent('refused');
    }
    const queued = Date.now();
    await this.outbound.take();
    try {
      // Waited as long as the exchange may take: never sent, so the core retries it freely.
      if (Date.now() - queued >= timeout) return notSent('queued past its time');
      // The exchange's time starts now, when its connection opens, not when it was queued.
      const deadline = Date.now() + timeout;
      if (this.settings.probePeers && !(await reachable(u, timeout))) return notSent('unreachable');
      try {
        const res = await fetch(u, { method, headers, body, redirect: 'manual', signal: AbortSignal.timeout(Math.max(1, deadline - Date.now())) });
        const got = await readAll(res.body, RelayCore.maxAnswer());
        return got === null ? unknown('answer too large') : answered(res.status, got);
      } catch (e) {
        return unknown(String(e?.message ?? e));
      }
    } finally {
      this.outbound.give();
    }
  }
}

/** The core's answer (`{status, headers, body}`) as a Response, written as it is. */
function respond(a) {
  return new Response(a.body.byteLength ? a.body : null, { status: a.status, headers: a.headers });
}


/** Sends a frame unless the socket is gone. @param {WebSocket} ws @param {string} frame */
function trySend(ws, frame) {
  try {
    ws.send(frame);
  } catch {
    // closed meanwhile
  }
}

/** Whether a TCP connection to the URL's host and port opens within `timeout` ms. @param {URL} u */
async function reachable(u, timeout) {
  const port = Number(u.port || (u.protocol === 'https:' ? 443 : 80));
  let socket;
  let timer;
  try {
    // An IPv6 literal keeps its brackets: workerd reads `hostname:port` as one address, and
    // `::1:443` without them is no address at all.
    socket = connect({ hostname: u.hostname, port });
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error('connect timed out')), timeout);
    });
    await Promise.race([socket.opened, late]);
    return true;
  } catch (e) {
    console.warn(`peer not attempted: ${u.host}: ${e?.message ?? e}`);
    return false;
  } finally {
    clearTimeout(timer);
    socket?.close().catch(() => {});
  }
}
