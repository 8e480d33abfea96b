// The Node host's native crypto: the core's own strict Ed25519 and SHA-256, compiled
// natively (host-node/native, a Node-API addon).
//
// The wasmtime host offers the core native verification through its imports; this is the
// same offer for Node. The addon runs the very functions the core would run in wasm, so
// verdicts are identical; without it the core does the work itself (about half the send rate:
// docs/performance.md).
//
// It ships the napi-rs way: one npm package per platform (`relay-node-linux-x64-gnu`, ...),
// each an optional dependency of relay-node that npm installs only where its `os`, `cpu` and
// `libc` match. This module loads the package named for the running platform and no other;
// in a checkout it loads the one `./x test` built into `npm/<platform>/`.

import fs from 'node:fs';
import { createRequire } from 'node:module';
import { tuning } from './tuning.js';

const require = createRequire(import.meta.url);

/** @type {{verifyEd25519?: Function, sha256Into?: Function} | null | undefined} */
let loaded;

/**
 * The running platform as npm packages name it (`linux-x64-gnu`, `darwin-arm64`, ...).
 * @returns {string}
 */
export function platform() {
  const { platform: os, arch } = process;
  if (os !== 'linux') return `${os}-${arch}`;
  /** @type {any} */
  const report = process.report?.getReport?.();
  const glibc = report?.header?.glibcVersionRuntime;
  const musl = !glibc && fs.existsSync(`/lib/ld-musl-${arch === 'x64' ? 'x86_64' : 'aarch64'}.so.1`);
  return `linux-${arch}-${musl ? 'musl' : 'gnu'}`;
}

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
  if (!tuning().ownVerify) crypto.verifyEd25519 = native.verifyEd25519;
  if (!tuning().ownSha256) crypto.sha256Into = native.sha256Into;
  return (loaded = crypto);
}

/** The addon's module once found (null: none for this platform); undefined until then. */
let found;
/** Why none was found, for RELAY_NATIVE_REQUIRED. */
let missing = '';

/**
 * The addon itself (also for tests that compare it with the core's own verification), or
 * null. Found once per process (thread): naming the platform reads a diagnostic report,
 * about 10 ms, and a relay thread asks at every start.
 */
export function addon() {
  if (found === undefined) {
    const name = platform();
    const tried = [];
    found = null;
    for (const where of [`relay-node-${name}`, new URL(`../npm/${name}/relay_native.node`, import.meta.url).pathname]) {
      try {
        found = require(where);
        break;
      } catch (e) {
        tried.push(`${where}: ${e.code ?? e.message}`);
      }
    }
    if (found === null) missing = `no native crypto for ${name} (${tried.join('; ')})`;
  }
  if (found === null && tuning().nativeRequired) throw new Error(missing);
  return found;
}
