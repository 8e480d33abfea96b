// The transport limits of issue 18 (protocol.md §6), with their defaults: the same flags,
// TOML keys and defaults as the wasmtime host, as camelCase options of createRelay and serve.

/** The defaults; every one can be set by a flag, a TOML key and an option. */
export const LIMITS = Object.freeze({
  /** Request line and headers must arrive within it (ms), else 408 and close. `--header-timeout` */
  headerTimeout: 10_000,
  /** The whole body within it (ms) once the headers are in, else 408 and close. `--body-timeout` */
  bodyTimeout: 30_000,
  /** A keep-alive connection idle this long (ms) is closed. `--idle-timeout` */
  idleTimeout: 60_000,
  /** Every WebSocket is pinged this often (ms); no frame since the last ping closes it. `--ws-ping-interval` */
  wsPingInterval: 30_000,
  /** Open TCP connections at most (public listener); beyond it new ones are closed at accept. `--max-connections` */
  maxConnections: 1000,
  /** Open TCP connections per peer IP address at most; same treatment. `--max-connections-per-ip` */
  maxConnectionsPerIp: 64,
  /** Outbound messages queued per WebSocket at most; past it the socket is dropped. `--ws-send-queue` */
  wsSendQueue: 256,
  /** Requests waiting to enter the core at most; beyond it 503 unavailable, Retry-After 1. `--max-pending` */
  maxPending: 1024,
});

/** The option names with their flags and TOML keys, in the order the usage lists them. */
export const LIMIT_FLAGS = Object.freeze(
  Object.keys(LIMITS).map((option) => {
    const snake = option.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
    return { option, key: snake, flag: `--${snake.replace(/_/g, '-')}`, unit: /Timeout|Interval/.test(option) ? 'MS' : 'N' };
  }),
);

/**
 * The limits in force: each option given (a positive integer) over the default.
 * @param {...Record<string, unknown> | undefined} sources later ones win
 * @returns {typeof LIMITS}
 */
export function limitsOf(...sources) {
  /** @type {Record<string, number>} */
  const out = { ...LIMITS };
  for (const s of sources) {
    if (!s) continue;
    for (const k of Object.keys(LIMITS)) {
      const v = s[k];
      if (v === undefined || v === null) continue;
      if (!Number.isSafeInteger(v) || /** @type {number} */ (v) < 1) throw new Error(`${k} must be a positive integer, not ${v}`);
      out[k] = /** @type {number} */ (v);
    }
  }
  return /** @type {typeof LIMITS} */ (out);
}
