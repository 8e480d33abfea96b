// The transport limits (protocol.md §6) come from the core's one table
// (`relay_core::transport::limits`): the same names, TOML keys, flags and defaults as every
// host, as camelCase options of createRelay and serve.

import { transportLimits } from './core.js';

const TABLE = transportLimits();
const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/**
 * The defaults by option (`headerTimeout`, `maxPending`, ...); every one can be set by a
 * flag, a TOML key and an option. Times are in ms.
 * @type {Readonly<Record<string, number>>}
 */
export const LIMITS = Object.freeze(Object.fromEntries(TABLE.map((l) => [camel(l.name), l.default])));

/** The option names with their flags and TOML keys, in the order the usage lists them. */
export const LIMIT_FLAGS = Object.freeze(
  TABLE.map((l) => ({ option: camel(l.name), key: l.name, flag: `--${l.name.replace(/_/g, '-')}`, unit: l.unit === 'ms' ? 'MS' : 'N' })),
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
  return out;
}
