// What the transports ask of a relay, answered by a relay on this thread: the one place
// both the in-process server and the relay thread (relay-thread.js) route requests.

import crypto from 'node:crypto';
import path from 'node:path';
import { messageOf } from './log.js';

const RELAY_METHODS = new Set(['message.deliver', 'route.get', 'route.publish', 'device.list']);

/** The error body of protocol.md §4. */
export function errorBody(code, message) {
  return { error: { code, message } };
}

/**
 * @typedef {object} Answer an HTTP answer: `body` is JSON text or a value to serialize
 * @property {number} status
 * @property {string | object} body
 */

/**
 * Whether `token` is the operator token, in constant time: both are hashed first, so the
 * comparison runs over equal-length buffers whatever was sent.
 * @param {string | null} token @param {string} expected
 */
export function isOperator(token, expected) {
  if (token === null || token === undefined) return false;
  const a = crypto.createHash('sha256').update(token).digest();
  const b = crypto.createHash('sha256').update(expected).digest();
  return crypto.timingSafeEqual(a, b);
}

/** Routes transport requests to a `Relay` on the calling thread. */
export class Dispatch {
  /** @param {import('./relay.js').Relay} relay */
  constructor(relay) {
    this.relay = relay;
    this.maxRequestBytes = relay.maxRequestBytes;
    /** `/.well-known/relay`: fixed by the configuration and the relay key for the relay's life. */
    this.wellKnown = relay.wellKnown();
    this.data = relay.data;
    this.adminListen = relay.adminListen;
    this.log = relay.log;
  }

  /** Listens to the relay's `notify` and `end_device_sessions` events. */
  on(event, listener) {
    this.relay.on(event, listener);
    return this;
  }

  /**
   * A POST to `/{space}/{method}` whose body passed the size and UTF-8 checks (`admin/v1`
   * comes only from the admin listener).
   * @param {'v1'|'admin/v1'|'relay/v1'} space
   * @param {string} method
   * @param {string | null} token the bearer token, if any
   * @param {Record<string, string | string[] | undefined>} headers by lowercase name
   * @param {string} text the body
   * @param {string | null} [origin] the peer's IP address (`req.socket.remoteAddress`)
   * @returns {Promise<Answer>}
   */
  async request(space, method, token, headers, text, origin = null) {
    const relay = this.relay;
    // The core's own strict parser judges the body before the relay is called.
    const bad = relay.core.checkJson(text);
    if (bad) return bad;
    if (space === 'v1') {
      if (method.startsWith('admin.')) return { status: 404, body: errorBody('not_found', 'unknown method') };
      return relay.callGrouped(token ? { kind: 'session', value: token, origin } : { kind: 'anonymous', origin }, method, text);
    }
    if (space === 'admin/v1') {
      if (!isOperator(token, relay.adminToken)) return { status: 401, body: errorBody('unauthenticated', 'operator token required') };
      if (method === 'backup') return this.backup(text);
      return relay.call({ kind: 'operator', origin }, `admin.${method}`, text);
    }
    if (!RELAY_METHODS.has(method)) return { status: 404, body: errorBody('not_found', 'not a relay method') };
    const auth = await relay.authenticateRelay(headers, method, text);
    if (!auth.ok) return auth.reply;
    return relay.callGrouped({ kind: 'relay', value: auth.source, origin }, method, text);
  }

  /**
   * The holder of a session token (a WebSocket upgrade).
   * @returns {{ok: true, info: {account: string, device_id: string, expires_at: number}} | {ok: false, reply: object}}
   */
  session(token) {
    return this.relay.session(token);
  }

  /**
   * A WebSocket frame `{id, method, params}` from a session: the frame to answer with, and
   * whether the session has ended (the socket then closes). `origin` as for `request`.
   * @returns {{reply: string, ended: boolean}}
   */
  frame(token, text, origin = null) {
    const f = this.relay.core.parseFrame(text);
    const error = f.error ?? (f.method.startsWith('admin.') ? errorBody('not_found', 'unknown method').error : null);
    if (error) return { reply: JSON.stringify({ id: f.id, error }), ended: false };
    const r = this.relay.call({ kind: 'session', value: token, origin }, f.method, f.params);
    const reply = JSON.stringify(r.status === 200 ? { id: f.id, result: r.body } : { id: f.id, error: r.body.error });
    return { reply, ended: r.status === 401 };
  }

  /**
   * `POST /admin/v1/backup {"path": FILE}`: a consistent copy of the running relay's
   * database at FILE (absolute; written whole with mode 0600, replacing any file there).
   * @param {string} text
   * @returns {Promise<Answer>}
   */
  async backup(text) {
    const p = JSON.parse(text);
    if (typeof p.path !== 'string' || !path.isAbsolute(p.path)) return { status: 400, body: errorBody('invalid_params', 'backup takes {"path": an absolute file name}') };
    try {
      return { status: 200, body: await this.relay.backup(p.path) };
    } catch (e) {
      this.log.error(`backup to ${p.path}: ${messageOf(e)}`);
      return { status: 500, body: errorBody('internal', `backup: ${messageOf(e)}`) };
    }
  }

  /** Whether the relay can serve (/readyz). @returns {{ready: boolean, reason?: string}} */
  ready() {
    return this.relay.ready();
  }

  /** The core's and the relay's metrics, Prometheus text. @returns {Promise<string>} */
  metrics() {
    return this.relay.metricsText();
  }

  /** Stops the relay: timers, deliveries in flight, the storage. */
  close() {
    return this.relay.close();
  }
}
