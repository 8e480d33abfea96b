// The Node host's native crypto: the core's own strict Ed25519 and SHA-256, compiled
// natively (host-node/native, a Node-API addon built into pkg/relay_native.node).
//
// The wasmtime host offers the core native verification through its imports; this
// is the same offer for Node. The addon runs the very functions the core would run
// in wasm, so verdicts are identical; without it the core does the work itself.

import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const ADDON = new URL('../pkg/relay_native.node', import.meta.url);

/** @type {{verifyEd25519?: Function, sha256Into?: Function} | null | undefined} */
let loaded;

/**
 * The host crypto to give the core, or null when the addon is missing or fails to load.
 * `RELAY_OWN_VERIFY=1` and `RELAY_OWN_SHA256=1` leave that part to the core (for measuring),
 * as they do on the wasmtime host.
 * @returns {{verifyEd25519?: Function, sha256Into?: Function} | null}
 */
export function hostCrypto() {
  if (loaded !== undefined) return loaded;
  const native = addon();
  if (!native) return (loaded = null);
  const crypto = {};
  if (process.env.RELAY_OWN_VERIFY !== '1') crypto.verifyEd25519 = native.verifyEd25519;
  if (process.env.RELAY_OWN_SHA256 !== '1') crypto.sha256Into = native.sha256Into;
  return (loaded = crypto);
}

/** The addon itself (also for tests that compare it with the core's own verification), or null. */
export function addon() {
  try {
    return require(ADDON.pathname);
  } catch (e) {
    if (process.env.RELAY_NATIVE_REQUIRED === '1') throw e;
    return null;
  }
}
