// Types of relay-node/client: a client's side (identities, sessions, account moves).
import { Identity } from '../pkg/relay_wasm.js';
import type { Json, ProtocolError } from './index.js';

/**
 * A client identity (an account key and one device key) with the core's client builders:
 * `certificate`, `route`, `sessionOpen`, `message`, `openEntry`, ... Each returns the signed
 * object (or params) as JSON text.
 */
export { Identity };

/** A relay's refusal of a client call: the protocol error and the HTTP status it came with. */
export class RelayError extends Error {
  readonly code: ProtocolError['code'];
  /** E.g. `data.route` (the highest route the relay holds) with `not_home_relay` (421). */
  readonly data?: { [member: string]: Json };
  readonly status: number;
  /** The relay (its id, the base URL) and the method that refused. */
  readonly relay: string;
  readonly method: string;
}

/**
 * Opens a session for the identity's device at `relay` (`POST {relay}/v1/session.open`) and
 * returns its token. A former home (the account moved away) still opens sessions, for
 * `message.delivery.status`, `message.timeline.sync` and retries of what it accepted.
 * Throws a RelayError on a refusal.
 */
export function openSession(opts: { identity: Identity; network: string; relay: string }): Promise<string>;

/**
 * Whether a refusal says the session belongs to an earlier home span of the relay that gave
 * it: `not_home_relay` whose `data.route` names that same relay (the account moved away and
 * back since the session was opened). A new session there serves.
 */
export function olderSpan(e: unknown): boolean;

/**
 * A device's calls at one relay with a session it keeps: opened at the first call, opened
 * again once when a call is refused `unauthenticated` or for an older home span.
 */
export class DeviceSession {
  constructor(opts: { identity: Identity; network: string; relay: string });
  readonly identity: Identity;
  readonly network: string;
  readonly relay: string;
  /** The session token in use (none before the first call). */
  session: string | null;
  /** Calls `method` with `params` (JSON text, or a value sent as JSON): the result, or a RelayError thrown. */
  call(method: string, params: string | { [member: string]: Json }): Promise<{ [member: string]: Json }>;
}

/** What `moveAccount` did. */
export interface Moved {
  /** The signed route naming the new home, as JSON text: the account's route from now on. */
  route: string;
  /** Its revision (the one passed in). */
  revision: number;
  /** A session at the new home. */
  session: string;
}

/**
 * Moves the account's home from `from` to `to` (relay ids: their base URLs), as
 * `relayctl account move` does (protocol.md, "Home relay changes"): signs a route naming `to`
 * at `revision` (the next one, higher than any of the account's), `account.register`s at `to`
 * with `certificates[0]` (this device's, with `manage`) and `discoverable` (left out: false),
 * `device.register`s each further certificate there (one registered there already with an
 * equal or newer certificate counts), then `route.publish`es the route at `from` and at `to`.
 * Certificates are JSON text (as `Identity.certificate` returns) or objects. Throws a
 * RelayError (`err.code`) at the first refusal; the steps before it stay done.
 */
export function moveAccount(opts: {
  identity: Identity;
  network: string;
  from: string;
  to: string;
  revision: number;
  certificates: Array<string | { [member: string]: Json }>;
  discoverable?: boolean;
}): Promise<Moved>;
