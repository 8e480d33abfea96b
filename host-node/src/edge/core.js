// The relay core (the wasm-bindgen web build of relay-wasm, the same wasm as the Node host's)
// for workerd: one wasm instance per isolate, shared by every object of the isolate.
//
// A trap (a Rust panic is a wasm `unreachable`) leaves the instance unusable; nothing the
// trapped call did was committed (its transaction rolls back). `reset()` replaces the instance
// with a fresh one of the same module (`__wbg_reset_state`): every `RelayCore` of the old one
// is dropped unused, and each object makes a new one over its storage when it sees the
// generation change.

import * as glue from '../../pkg/web/relay_wasm.js';
import wasm from '../../pkg/web/relay_wasm_bg.wasm';

glue.initSync({ module: wasm });
// No native crypto on workerd: the core verifies and hashes in wasm.
glue.setHostCrypto(null);

export const { Alarm, RelayCore } = glue;

/** How many times the instance was replaced: a `RelayCore` made in another generation is gone. */
export let generation = 0;

/** Replaces the trapped instance with a fresh one. */
export function reset() {
  glue.__wbg_reset_state();
  generation += 1;
}


/** The answer for a call lost before it committed (500 internal: nothing was accepted). */
export const uncommitted = () => RelayCore.uncommitted();

/** The request headers the core reads (lowercase). */
export const REQUEST_HEADERS = RelayCore.requestHeaders().split(',');

/** A request's headers as the core takes them: `name\nvalue\n` for each one it reads. @param {Headers} h */
export function headerText(h) {
  let out = '';
  for (const n of REQUEST_HEADERS) {
    const v = h.get(n);
    if (v !== null) out += `${n}\n${v}\n`;
  }
  return out;
}

/**
 * The shard (of `count`) a request belongs to, as the core decides it; 0 when the relay has one.
 * @param {boolean} admin @param {string} method @param {string} path @param {string} query @param {string} headers @param {Uint8Array} body @param {number} count
 */
export function shardOf(admin, method, path, query, headers, body, count) {
  if (count <= 1) return 0;
  return RelayCore.shardOf(admin, method, path, query, headers, body, count);
}
