// What became of an exchange with a peer, as every JavaScript host reports it to the core.
//
// The host only classifies: answered (the peer's status and body), not sent (the request
// cannot have reached the peer: no connection was made), or unknown (it may have; the core
// treats it as possibly delivered). What each means for the delivery is the core's decision.

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

/**
 * The outcome as the core's calls take it (`keyFetched`, `fetched`): the answer's status and
 * body, or -1 never sent, -2 sent without an answer.
 * @param {Outcome} o @returns {[number, Uint8Array]}
 */
export function reported(o) {
  if (o.kind === 'answered') return [o.status, o.body];
  return [o.kind === 'not_sent' ? -1 : -2, EMPTY];
}

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
