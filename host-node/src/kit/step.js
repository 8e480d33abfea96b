// What the core hands back, read the same way on every JavaScript host.
//
// The core answers a call with one buffer: a JSON head line, then (for an answer) the body's
// bytes as they are to be written. A WebSocket message comes back as text: a head line (empty
// when there is nothing but the frame), then the frame.

const decoder = new TextDecoder();

/** No bytes. */
export const EMPTY = new Uint8Array(0);

/**
 * An answer to write as it is: status, headers, the effects it carries, the body's bytes.
 * @typedef {{status: number, headers: Record<string, string>, effects?: Event[], body: Uint8Array}} Answer
 * @typedef {{token: string, account: string, device_id: string, expires_at: number, expiry_close: {code: number, reason: string}}} Upgrade
 * @typedef {{relay: string, url: string, timeout_ms: number}} KeyFetch
 * @typedef {{account: string, shard: number, path: string, body: string}} RouteFetch
 * @typedef {{key?: KeyFetch, route?: RouteFetch}} Parked the fetch a parked request needs started (neither: one under way brings it)
 * @typedef {Answer | {parked: Parked} | {upgrade: Upgrade} | {backup: string}} Step
 * @typedef {{text: string, close?: [number, string], effects?: Event[], parked?: Parked}} Frame
 * @typedef {{type: string, [field: string]: any}} Event
 */

/**
 * A call's buffer read as a step: an answer, a request parked in the core (with the fetch to
 * start, if any), a WebSocket upgrade, or a backup to write.
 * @param {Uint8Array} bytes @returns {Step}
 */
export function stepOf(bytes) {
  const nl = bytes.indexOf(10);
  const head = JSON.parse(decoder.decode(bytes.subarray(0, nl)));
  if (head.status !== undefined) head.body = bytes.subarray(nl + 1);
  return head;
}

/**
 * A WebSocket message's answer read: the frame, and the close or effects the head names (or
 * that it is parked: no frame yet).
 * @param {string} out
 * @returns {Frame}
 */
export function frameOf(out) {
  const nl = out.indexOf('\n');
  return nl === 0 ? { text: out.slice(1) } : { ...JSON.parse(out.slice(0, nl)), text: out.slice(nl + 1) };
}

/** Whether an error is a trap of the core's wasm (a Rust panic is `unreachable`): its instance is lost. @param {unknown} e */
export const isTrap = (e) => e instanceof WebAssembly.RuntimeError;
