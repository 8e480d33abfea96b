// What became of an exchange with a peer, as every JavaScript host reports it to the core.
//
// The host only classifies: answered (the peer's status and body), not sent (the request
// cannot have reached the peer: no connection was made), or unknown (it may have; the core
// treats it as possibly delivered). What each means for the delivery is the core's decision.
// The outcomes are the core's `FetchOutcome` (the WIT's `fetch`), passed to `keyFetched`,
// `routeFetched` and `fetched` as they are; `why` is for the host's log.

import { EMPTY } from './step.js';

/**
 * @typedef {{kind: 'answered', status: number, body: Uint8Array} | {kind: 'not_sent', why: string} | {kind: 'unknown', why: string}} Outcome
 */

/** @param {number} status @param {Uint8Array} body @returns {Outcome} */
export const answered = (status, body) => ({ kind: 'answered', status, body });
/** @param {string} why @returns {Outcome} */
export const notSent = (why) => ({ kind: 'not_sent', why });
/** @param {string} why @returns {Outcome} */
export const unknown = (why) => ({ kind: 'unknown', why });

/** Why the outcome is not a 200 answer, for a log line (null when it is one). @param {Outcome} o */
export function failure(o) {
  if (o.kind === 'answered') return o.status === 200 ? null : `status ${o.status}`;
  return o.why;
}

/**
 * A web stream read whole, or null when it is over `limit` bytes (the rest is not read): a
 * peer's answer over the core's `maxAnswer` is an unknown outcome.
 * @param {ReadableStream<Uint8Array> | null} stream @param {number} limit
 * @returns {Promise<Uint8Array | null>}
 */
export async function readAll(stream, limit) {
  if (!stream) return EMPTY;
  const chunks = [];
  let size = 0;
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      reader.cancel().catch(() => {});
      return null;
    }
    chunks.push(value);
  }
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}
