// The relay's log: plain text lines, or one JSON object per line (`--log-format json`).
//
// Levels as in the wasmtime host: RELAY_LOG=error|warn|info|debug (default info; a
// tracing-style filter such as `relay=debug` is read for its last level word). In json,
// every line is an object `{timestamp, level, message, ...fields}` (the keys and level names
// of the wasmtime host's tracing json, so one parser reads both); the per-message events (`accepted`,
// `delivery_ended`) are info lines of their own, and in text they appear at debug only, so
// a relay that logs text pays nothing for them. Events carry ids only, never bodies or keys.

const LEVELS = /** @type {const} */ (['error', 'warn', 'info', 'debug']);

/** @typedef {'error' | 'warn' | 'info' | 'debug'} Level */
/** @typedef {'text' | 'json'} LogFormat */
/** @typedef {Record<string, string | number | boolean | null | undefined | object>} Fields */

/**
 * The level RELAY_LOG asks for.
 * @param {string | undefined} v
 * @returns {Level}
 */
export function levelOf(v) {
  /** @type {Level} */
  let level = 'info';
  for (const word of String(v ?? '').split(/[^a-z]+/)) if (LEVELS.includes(/** @type {Level} */ (word))) level = /** @type {Level} */ (word);
  return level;
}

/** @param {string} line */
const stderr = (line) => {
  process.stderr.write(`${line}\n`);
};

export class Log {
  /**
   * @param {{format?: LogFormat, level?: Level, write?: (line: string) => void}} [opts]
   *   `write` receives each line without its newline (default: stderr)
   */
  constructor({ format = 'text', level = levelOf(process.env.RELAY_LOG), write = stderr } = {}) {
    if (format !== 'text' && format !== 'json') throw new Error(`log format must be text or json, not ${format}`);
    this.format = format;
    this.write = write;
    this.rank = LEVELS.indexOf(level);
    /** Whether per-message events are written: json at info, or text at debug. */
    this.events = format === 'json' ? this.rank >= 2 : this.rank >= 3;
  }

  /** @param {Level} level @param {string} msg @param {Fields} [fields] */
  line(level, msg, fields) {
    if (LEVELS.indexOf(level) > this.rank) return;
    if (this.format === 'json') {
      this.write(JSON.stringify({ timestamp: new Date().toISOString(), level: level.toUpperCase(), message: msg, ...fields }));
    } else {
      const extra = fields ? Object.entries(fields).filter(([, v]) => v !== undefined).map(([k, v]) => ` ${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`).join('') : '';
      this.write(`${new Date().toISOString()} ${level.toUpperCase().padStart(5)} ${msg}${extra}`);
    }
  }

  /** @param {string} msg @param {Fields} [fields] */
  error(msg, fields) {
    this.line('error', msg, fields);
  }
  /** @param {string} msg @param {Fields} [fields] */
  warn(msg, fields) {
    this.line('warn', msg, fields);
  }
  /** @param {string} msg @param {Fields} [fields] */
  info(msg, fields) {
    this.line('info', msg, fields);
  }
  /** @param {string} msg @param {Fields} [fields] */
  debug(msg, fields) {
    this.line('debug', msg, fields);
  }

  /**
   * One structured event (`{event: 'accepted' | 'delivery_ended', ...ids}`); callers check
   * `events` first, so nothing is built when events are off.
   * @param {{event: string} & Fields} e
   */
  event(e) {
    if (!this.events) return;
    if (this.format === 'json') this.write(JSON.stringify({ timestamp: new Date().toISOString(), level: 'INFO', ...e }));
    else this.line('debug', e.event, { ...e, event: undefined });
  }
}

/** A message from anything thrown (wasm-bindgen throws strings). @param {unknown} e */
export function messageOf(e) {
  return e instanceof Error ? e.message : String(e);
}
