// Envelope signatures verified on the transports' thread ahead of a relay thread, as the
// wasmtime host's HTTP workers do. What is verified and remembered is
// relay_core::wire::preverify, through the native addon; here are the two memories.
//
// The main thread, which only carries HTTP, verifies a message.send envelope under the
// device key the core used for that session's previous envelope, or a message.deliver
// envelope under the certificate it carries, and sends the digest of a success with the
// request. When the core on the relay thread asks to verify exactly those bytes under that
// key, the answer comes from the memory, once. The core still picks the key from its own
// records, and only successes of its own strict verification on those exact bytes are
// remembered, so a guess (or a forged request) can only cost a miss, never change a verdict.

/** Verified signatures waiting for the core, at most; when full, the memory starts over. */
export const MAX_WAITING = 16384;
/** Session tokens whose device key is known, at most; when full, the memory starts over. */
export const MAX_KEYS = 65536;

/** The verdict code of a valid signature (relay_core::wire::signature::code::VALID). */
const VALID = 0;

/** On the relay thread: successes waiting for the core, and the session keys it teaches. */
export class Preverified {
  /**
   * @param {{envelopeDigest: (key: Uint8Array, msg: Uint8Array, sig: Uint8Array) => string | null, isEnvelopeInput: (msg: Uint8Array) => boolean}} native
   * @param {(token: string, key: Uint8Array) => void} learn told the key the core verified a session's envelope with
   */
  constructor(native, learn) {
    this.native = native;
    this.learn = learn;
    /** @type {Set<string>} */
    this.waiting = new Set();
    /** The session token of the message.send in the core now, if any. */
    this.sending = null;
    /** Verifications answered from the memory. */
    this.hits = 0;
  }

  /** A success the transports' thread verified, by its digest. */
  add(digest) {
    if (this.waiting.size >= MAX_WAITING) this.waiting.clear();
    this.waiting.add(digest);
  }

  /** The host verifier to give the core: `verify` (the addon's), answered from the memory where it can be. */
  wrap(verify) {
    return (key, msg, sig) => {
      if (this.waiting.size > 0) {
        const d = this.native.envelopeDigest(key, msg, sig);
        if (d !== null && this.waiting.delete(d)) {
          this.hits += 1;
          return VALID;
        }
      }
      const verdict = verify(key, msg, sig);
      // A miss during a session's message.send: next time the main thread can verify.
      // The core passes views of its memory, so the key is copied.
      if (verdict === VALID && this.sending !== null && this.native.isEnvelopeInput(msg)) this.learn(this.sending, key.slice());
      return verdict;
    };
  }
}

/** On the transports' thread: the session keys learned, and the verification of requests. */
export class SessionKeys {
  /** @param {{preverifySend: Function, preverifyDeliver: Function}} native */
  constructor(native) {
    this.native = native;
    /** @type {Map<string, Uint8Array>} */
    this.keys = new Map();
  }

  /** The key the core verified `token`'s last envelope with. */
  learn(token, key) {
    if (this.keys.size >= MAX_KEYS) this.keys.clear();
    this.keys.set(token, key);
  }

  /**
   * The digest of a verified envelope in a request to `path`, or null (nothing known, or it
   * does not verify). A hint only: the core routes and judges the request itself.
   * @param {string} path @param {string | null} token @param {Uint8Array} body
   */
  check(path, token, body) {
    if (path === '/v1/message.send' && token) {
      const key = this.keys.get(token);
      return key ? this.native.preverifySend(key, Buffer.from(body.buffer, body.byteOffset, body.length).toString('utf8')) : null;
    }
    if (path === '/relay/v1/message.deliver') return this.native.preverifyDeliver(Buffer.from(body.buffer, body.byteOffset, body.length).toString('utf8'));
    return null;
  }
}

/** Whether pre-verification is on: the addon has it and `RELAY_PREVERIFY=0` (for measuring) is not set. */
export function preverifying(native) {
  return Boolean(native?.preverifySend && native.isEnvelopeInput) && process.env.RELAY_PREVERIFY !== '0';
}
