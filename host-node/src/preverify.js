// Envelope signatures verified on the transports' thread ahead of the relay thread, as the
// wasmtime host's HTTP workers do. What is answered and verified ahead is
// relay_core::transport::ahead's, and the memory it is kept in relay_core::wire::preverify's
// (the wasmtime host's too): the native addon holds one per relay, which both threads reach
// by its id.
//
// The transports' thread verifies a message.send envelope (over HTTP or a WebSocket) under
// the device key the core used for that session's previous envelope, or a message.deliver
// envelope under the certificate it carries, and remembers a success. When the core on the relay thread asks to verify exactly
// those bytes under that key, the answer comes from the memory, once. The core still picks
// the key from its own records, and only successes of its own strict verification on those
// exact bytes are remembered, so a guess (or a forged request) can only cost a miss, never
// change a verdict.

import { tuning } from './tuning.js';

/** The verdict code of a valid signature (relay_core::wire::signature::code::VALID). */
const VALID = 0;

/** On the relay thread: the core's verifier, answered from memory `id` where it can be. */
export class Preverified {
  /** @param {any} native the addon @param {number} id the relay's memory */
  constructor(native, id) {
    this.native = native;
    this.id = id;
    /** The session token of the message.send in the core now, if any. */
    this.sending = null;
    /** Verifications answered from the memory. */
    this.hits = 0;
  }

  /** The host verifier to give the core: `verify` (the addon's), answered from the memory where it can be. */
  wrap(verify) {
    return (key, msg, sig) => {
      if (this.native.preverifyTake(this.id, key, msg, sig)) {
        this.hits += 1;
        return VALID;
      }
      const verdict = verify(key, msg, sig);
      // A miss during a session's message.send: next time the transports' thread can verify.
      if (verdict === VALID && this.sending !== null) this.native.preverifyLearn(this.id, this.sending, key, msg);
      return verdict;
    };
  }
}

/**
 * On the transports' thread: the core's rules for a request before the relay thread takes
 * it (relay_core::transport::ahead, natively): what the core answers without its state is
 * answered here, and the envelopes it will verify are verified here, into the memory.
 */
export class Ahead {
  /** @param {any} native the addon */
  constructor(native) {
    this.native = native;
    /** The relay's memory, for the relay thread to answer from. */
    this.id = native.preverifyOpen();
  }

  /** The relay stands: its rules, from the config JSON its core was built from. @param {string} config */
  open(config) {
    this.native.aheadOpen(this.id, config);
  }

  /**
   * An answer to write now, or none: then `sending` is the session of a message.send to name
   * to the relay thread's verifier.
   * @param {import('./relay.js').Request} req
   * @returns {{status?: number | null, headers?: Record<string, string> | null, body?: Uint8Array | null, sending?: string | null}}
   */
  request(req) {
    return this.native.aheadRequest(this.id, req.admin, req.method, req.path, req.headers, req.body, Date.now());
  }

  /** Whether WebSocket text `text` of session `token` is a message.send (verified ahead where it can be). @param {string} token @param {string} text */
  frame(token, text) {
    return this.native.aheadFrame(this.id, token, text);
  }

  /** Forgets the memory (the relay stopped). */
  close() {
    this.native.preverifyClose(this.id);
  }
}

/** Whether pre-verification is on: the addon has it and `RELAY_PREVERIFY=0` (for measuring) is not set. */
export function preverifying(native) {
  return Boolean(native?.preverifyOpen) && tuning().preverify;
}
