// What the core hands back, the same on every JavaScript host: typed objects that mirror the
// WIT's records (the binding's .d.ts declares them), used as they come.

/** No bytes. */
export const EMPTY = new Uint8Array(0);

/**
 * An answer to write as it is (the WIT's `http-response`): status, headers, the effects it
 * carries, the body's bytes.
 * @typedef {{status: number, headers: Record<string, string>, effects?: Event[], body: Uint8Array}} Answer
 * @typedef {{token: string, account: string, device_id: string, expires_at: number, expiry_close: {code: number, reason: string}}} Upgrade
 * @typedef {{relay: string, url: string, timeout_ms: number}} KeyFetch
 * @typedef {{account: string, shard: number, path: string, body: string}} RouteFetch
 * @typedef {{key?: KeyFetch, route?: RouteFetch}} Parked the fetch a parked request needs started (neither: one under way brings it)
 * @typedef {Answer | {parked: Parked} | {upgrade: Upgrade} | {backup: string}} Step
 * @typedef {{text: string, close?: [number, string], effects?: Event[], parked?: Parked}} Frame
 * @typedef {{type: string, [field: string]: any}} Event
 */

/** Whether an error is a trap of the core's wasm (a Rust panic is `unreachable`): its instance is lost. @param {unknown} e */
export const isTrap = (e) => e instanceof WebAssembly.RuntimeError;
