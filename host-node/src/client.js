// A client's side in JavaScript: the core's client builders (`Identity`) and the account
// moves `relayctl account move` makes (protocol.md, "Home relay changes"), over HTTP with the
// global fetch. Imported as `relay-node/client`, apart from the relay, so that a relay does not
// load the client builders' wasm.
//
// The builders come from the ES-module build of the core (pkg/relay_wasm.js), not from the
// relay's own instances (core.js): a relay's instance may be dropped and replaced after a
// trap, and an Identity must outlive that.
import { Identity } from '../pkg/relay_wasm.js';

export { Identity };

/** A relay's refusal: the protocol error (`code`, `data`) and the HTTP status it came with. */
export class RelayError extends Error {
  /**
   * @param {string} relay @param {string} method @param {number} status
   * @param {{code: string, message?: string, data?: object}} error
   */
  constructor(relay, method, status, error) {
    super(`${method} at ${relay}: ${error.code}${error.message ? `: ${error.message}` : ''}`);
    this.name = 'RelayError';
    this.code = error.code;
    this.status = status;
    this.data = error.data;
    this.relay = relay;
    this.method = method;
  }
}

/** A JSON text as it is, anything else as JSON: signed objects keep the text they were signed as. */
const jsonText = (v) => (typeof v === 'string' ? v : JSON.stringify(v));

/**
 * Calls `method` at `relay` (`POST {relay}/v1/{method}`); returns the result object, or
 * throws a RelayError for a protocol error and an Error for an answer that is none.
 * @param {string} relay @param {string} method @param {string} params JSON text
 * @param {string} [session] a session token (Authorization: Bearer)
 */
async function call(relay, method, params, session) {
  const headers = { 'content-type': 'application/json' };
  if (session) headers.authorization = `Bearer ${session}`;
  const res = await fetch(`${relay}/v1/${method}`, { method: 'POST', headers, body: params });
  const text = await res.text();
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    throw new Error(`${method} at ${relay}: HTTP ${res.status}, not JSON`);
  }
  if (body?.error && typeof body.error.code === 'string') throw new RelayError(relay, method, res.status, body.error);
  if (res.status !== 200) throw new Error(`${method} at ${relay}: HTTP ${res.status} without a protocol error`);
  return body;
}

/**
 * Opens a session for the identity's device at `relay` (its home, or a former home, which
 * keeps answering status, sync and retries for what it accepted). Returns the token.
 * @param {{identity: Identity, network: string, relay: string}} opts
 * @returns {Promise<string>}
 */
export async function openSession({ identity, network, relay }) {
  const r = await call(relay, 'session.open', identity.sessionOpen(network, relay, Date.now()));
  return r.session;
}

/**
 * Whether a refusal says the session belongs to an earlier home span of the relay that gave
 * it: `not_home_relay` with a route naming that same relay (the account moved away and back
 * since the session was opened; protocol.md, "Home relay changes", rule 6). A new session
 * there serves.
 * @param {unknown} e
 */
export function olderSpan(e) {
  return e instanceof RelayError && e.code === 'not_home_relay' && e.data?.route?.relay === e.relay;
}

/**
 * A device's calls at one relay with a session it keeps: opened at the first call, and
 * opened again once when a call is refused `unauthenticated` (expired, or the relay forgot
 * it) or because the session belongs to an earlier home span ({@link olderSpan}).
 */
export class DeviceSession {
  /** @param {{identity: Identity, network: string, relay: string}} opts */
  constructor({ identity, network, relay }) {
    this.identity = identity;
    this.network = network;
    this.relay = relay;
    /** @type {string | null} the session token in use */
    this.session = null;
  }

  /**
   * Calls `method` with `params` (JSON text, or a value sent as JSON); returns the result or
   * throws the RelayError.
   * @param {string} method @param {unknown} params
   */
  async call(method, params) {
    const body = jsonText(params);
    this.session ??= await openSession(this);
    try {
      return await call(this.relay, method, body, this.session);
    } catch (e) {
      if (!(e instanceof RelayError && (e.code === 'unauthenticated' || olderSpan(e)))) throw e;
      this.session = await openSession(this);
      return call(this.relay, method, body, this.session);
    }
  }
}

/**
 * Moves the account's home from `from` to `to`, as `relayctl account move` does: signs a
 * route naming `to` at `revision` (the next one: higher than any route of the account),
 * registers the account at `to` with `certificates[0]` (this device's, with `manage`),
 * registers each further certificate there (a device already registered there with a newer
 * certificate counts as registered), then publishes the route at `from` (which from then on
 * answers only for what it accepted) and at `to`. Throws a RelayError (`err.code`) on the
 * first refusal; the steps before it stay done.
 * @param {{identity: Identity, network: string, from: string, to: string, revision: number,
 *   certificates: Array<string | object>, discoverable?: boolean}} opts
 * @returns {Promise<{route: string, revision: number, session: string}>} the signed route
 *   (JSON text), its revision, and a session at `to`
 */
export async function moveAccount({ identity, network, from, to, revision, certificates, discoverable }) {
  if (!Number.isSafeInteger(revision) || revision < 1) throw new TypeError('revision must be a positive integer');
  if (!Array.isArray(certificates) || certificates.length === 0) throw new TypeError("certificates must hold at least this device's certificate");
  const route = identity.route(network, to, revision, Date.now());
  const flag = discoverable === undefined ? '' : `,"discoverable":${Boolean(discoverable)}`;
  await call(to, 'account.register', `{"route":${route},"certificate":${jsonText(certificates[0])}${flag}}`);
  const session = await openSession({ identity, network, relay: to });
  for (const cert of certificates.slice(1)) {
    try {
      await call(to, 'device.register', `{"certificate":${jsonText(cert)}}`, session);
    } catch (e) {
      if (!(e instanceof RelayError && e.code === 'state_conflict')) throw e;
    }
  }
  for (const at of [from, to]) await call(at, 'route.publish', `{"route":${route}}`);
  return { route, revision, session };
}
