// `relay-node serve`: the same flags as the wasmtime host's `relay serve`; `relay-node admin`:
// the operator's calls to a running relay, over its admin listener.

import fs from 'node:fs';
import path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { createRelay } from './relay.js';
import { serve, parseAddr } from './server.js';
import { RelayThread } from './relay-thread.js';
import { Log, messageOf } from './log.js';
import { LIMITS, LIMIT_FLAGS } from './limits.js';

const USAGE = `relay-node serve [--listen ADDR] [--url URL] [--data DIR | --memory] [--network NAME]
                 [--policy NAME=VALUE]... [--attempt-timeout MS] [--admin-listen ADDR]
                 [--log-format text|json] [--config FILE]
                 [--tls-cert FILE --tls-key FILE] [--ca FILE]... [--allow-private-peers]
                 [--header-timeout MS] [--body-timeout MS] [--idle-timeout MS] [--ws-ping-interval MS]
                 [--max-connections N] [--max-connections-per-ip N] [--ws-send-queue N] [--max-pending N]
relay-node admin [--data DIR] [--admin-url URL] deliveries [pending|failed]
relay-node admin [--data DIR] [--admin-url URL] backup FILE
relay-node admin [--data DIR] [--admin-url URL] metrics`;

/**
 * Reads a TOML config: `listen`, `url`, `data`, `memory`, `network`, `admin_listen`,
 * `log_format`, `attempt_timeout`, the limits (`header_timeout`, ... as limits.js lists),
 * `tls_cert`, `tls_key`, `ca` (a file or a list), `allow_private_peers`, and a `[policy]` table.
 */
export function readConfig(text) {
  const c = parseToml(text);
  const known = new Set([
    'listen', 'url', 'data', 'memory', 'network', 'component', 'attempt_timeout', 'admin_listen', 'log_format', 'policy',
    'tls_cert', 'tls_key', 'ca', 'allow_private_peers', ...LIMIT_FLAGS.map((l) => l.key),
  ]);
  for (const k of Object.keys(c)) if (!known.has(k)) throw new Error(`config: unknown key ${k}`);
  return { ...c, policy: c.policy ?? {} };
}

/** @param {string} v */
function logFormat(v) {
  if (v !== 'text' && v !== 'json') throw new Error(`--log-format takes text or json, not ${v}`);
  return v;
}

/** A positive integer flag or key. @param {string} name @param {unknown} v */
function positive(name, v) {
  const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v;
  if (!Number.isSafeInteger(n) || /** @type {number} */ (n) < 1) throw new Error(`${name} takes a positive integer, not ${v}`);
  return /** @type {number} */ (n);
}

/** Turns argv into settings. */
export function parseArgs(argv) {
  const s = {
    listen: '127.0.0.1:8080', url: null, data: '.relay', network: 'dev', policies: {}, adminListen: '127.0.0.1:0', logFormat: 'text',
    limits: { ...LIMITS }, tlsCert: null, tlsKey: null, ca: [], allowPrivatePeers: false,
  };
  const rest = [...argv];
  const take = (flag) => {
    const v = rest.shift();
    if (v === undefined) throw new Error(`${flag} needs a value`);
    return v;
  };
  const cfgAt = rest.indexOf('--config');
  if (cfgAt >= 0) {
    const c = readConfig(fs.readFileSync(rest[cfgAt + 1], 'utf8'));
    for (const k of ['listen', 'url', 'data', 'network']) if (c[k] !== undefined) s[k] = c[k];
    if (c.memory === true) s.data = null;
    if (c.attempt_timeout !== undefined) s.attemptTimeout = Number(c.attempt_timeout);
    if (c.admin_listen !== undefined) s.adminListen = String(c.admin_listen);
    if (c.log_format !== undefined) s.logFormat = logFormat(c.log_format);
    for (const l of LIMIT_FLAGS) if (c[l.key] !== undefined) s.limits[l.option] = positive(l.key, c[l.key]);
    if (c.tls_cert !== undefined) s.tlsCert = String(c.tls_cert);
    if (c.tls_key !== undefined) s.tlsKey = String(c.tls_key);
    if (c.ca !== undefined) s.ca.push(...(Array.isArray(c.ca) ? c.ca : [c.ca]).map(String));
    if (c.allow_private_peers !== undefined) {
      if (typeof c.allow_private_peers !== 'boolean') throw new Error('config: allow_private_peers is true or false');
      s.allowPrivatePeers = c.allow_private_peers;
    }
    Object.assign(s.policies, c.policy);
  }
  const limitFlag = new Map(LIMIT_FLAGS.map((l) => [l.flag, l.option]));
  while (rest.length) {
    const a = rest.shift();
    if (a === '--listen') s.listen = take(a);
    else if (a === '--url') s.url = take(a);
    else if (a === '--data') s.data = take(a);
    else if (a === '--memory') s.data = null;
    else if (a === '--network') s.network = take(a);
    else if (a === '--config') take(a);
    else if (a === '--admin-listen') s.adminListen = take(a);
    else if (a === '--log-format') s.logFormat = logFormat(take(a));
    else if (limitFlag.has(a)) s.limits[limitFlag.get(a)] = positive(a, take(a));
    else if (a === '--tls-cert') s.tlsCert = take(a);
    else if (a === '--tls-key') s.tlsKey = take(a);
    else if (a === '--ca') s.ca.push(take(a));
    else if (a === '--allow-private-peers') s.allowPrivatePeers = true;
    else if (a === '--attempt-timeout') {
      const v = take(a);
      if (!/^\d+$/.test(v)) throw new Error('--attempt-timeout takes milliseconds');
      s.attemptTimeout = Number(v);
    }
    else if (a === '--policy') {
      const [k, v] = take(a).split('=');
      if (!k || v === undefined || !/^\d+$/.test(v.trim())) throw new Error('--policy takes NAME=INTEGER');
      s.policies[k.trim()] = Number(v.trim());
    } else throw new Error(`unknown flag ${a}\n${USAGE}`);
  }
  parseAddr(s.adminListen);
  if (Boolean(s.tlsCert) !== Boolean(s.tlsKey)) throw new Error('--tls-cert and --tls-key go together');
  return s;
}

/** A PEM file's text, or an error naming the file and the flag. @param {string} file @param {string} flag */
function pem(file, flag) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new Error(`${flag} ${file}: cannot read it: ${messageOf(e)}`);
  }
  if (!text.includes('-----BEGIN ')) throw new Error(`${flag} ${file}: not a PEM file`);
  return text;
}

/** Uncaught exceptions on the transports' thread that are tolerated within a minute; one more stops the relay. */
const UNCAUGHT_PER_MINUTE = 10;

/**
 * The last resort for what no handler caught (issue 18), on the thread that carries the
 * transports. An unhandled rejection is logged, and serving goes on: a promise nobody waits
 * for failed, which leaves no state half-changed. An uncaught exception is logged; serving
 * goes on only when the state is known good: the relay (core, storage, commits) runs on a
 * thread of its own that this exception did not touch, that thread is still there, and
 * fewer than UNCAUGHT_PER_MINUTE such exceptions came within the last minute. Otherwise
 * (the relay on this thread, where the exception may have cut an operation short, or the
 * thread gone, or a storm of them) the process exits with status 70, as the wasmtime host
 * fails closed: whatever was not committed was never answered as accepted.
 * @param {Log} log
 * @param {{threaded: boolean, healthy: () => boolean}} state
 * @param {(code: number) => void} [exit]
 * @returns {{rejection: (e: unknown) => void, exception: (e: unknown) => void}}
 */
export function lastResort(log, state, exit = (code) => process.exit(code)) {
  /** @type {number[]} */
  let recent = [];
  return {
    rejection(e) {
      log.error(`unhandled rejection (logged; serving goes on): ${e instanceof Error ? e.stack : String(e)}`);
    },
    exception(e) {
      const now = Date.now();
      recent = recent.filter((t) => now - t < 60_000);
      recent.push(now);
      const why = !state.threaded
        ? 'the relay runs on this thread, so its state is not known good'
        : !state.healthy()
          ? 'the relay thread is gone'
          : recent.length > UNCAUGHT_PER_MINUTE
            ? `${recent.length} uncaught exceptions within a minute`
            : null;
      if (why) {
        log.error(`uncaught exception; stopping (status 70): ${why}: ${e instanceof Error ? e.stack : String(e)}`);
        exit(70);
        return;
      }
      log.error(`uncaught exception on the transports' thread (logged; the relay thread is untouched, serving goes on): ${e instanceof Error ? e.stack : String(e)}`);
    },
  };
}

/**
 * `relay-node admin` arguments: the data directory (admin.token, admin.url), an admin URL
 * that overrides admin.url (`--admin-url`, or `--url` as `relay admin` spells it), and the command.
 * @param {string[]} argv
 * @returns {{data: string, adminUrl: string | null, command: string[]}}
 */
export function parseAdminArgs(argv) {
  const s = { data: '.relay', adminUrl: null, command: [] };
  const rest = [...argv];
  while (rest.length) {
    const a = rest.shift();
    if (a === '--data' || a === '--admin-url' || a === '--url') {
      const v = rest.shift();
      if (v === undefined) throw new Error(`${a} needs a value`);
      if (a === '--data') s.data = v;
      else s.adminUrl = v.replace(/\/+$/, '');
    } else if (a.startsWith('--')) throw new Error(`unknown flag ${a}\n${USAGE}`);
    else s.command.push(a);
  }
  const [what, ...args] = s.command;
  const ok =
    (what === 'deliveries' && args.length <= 1 && (args.length === 0 || ['pending', 'failed'].includes(args[0]))) ||
    (what === 'backup' && args.length === 1) ||
    (what === 'metrics' && args.length === 0);
  if (!ok) throw new Error(USAGE);
  return s;
}

/** Runs `relay-node admin ...` against the relay whose data directory is given. @returns {Promise<number>} */
async function admin(argv) {
  const s = parseAdminArgs(argv);
  const token = fs.readFileSync(path.join(s.data, 'admin.token'), 'utf8').trim();
  let base = s.adminUrl;
  if (!base) {
    try {
      base = fs.readFileSync(path.join(s.data, 'admin.url'), 'utf8').trim();
    } catch (e) {
      throw new Error(`${path.join(s.data, 'admin.url')}: ${e.code === 'ENOENT' ? 'missing (is the relay running? --admin-url URL names its admin listener)' : e.message}`);
    }
  }
  const [what, arg] = s.command;
  let res;
  if (what === 'metrics') {
    res = await fetch(`${base}/metrics`);
  } else {
    const params = what === 'backup' ? { path: path.resolve(arg) } : arg ? { state: arg } : {};
    res = await fetch(`${base}/admin/v1/${what}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify(params),
    });
  }
  const text = await res.text();
  if (res.ok) {
    process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
    return 0;
  }
  process.stderr.write(`relay-node admin ${what}: status ${res.status}: ${text}\n`);
  return 1;
}

export async function main(argv) {
  const [cmd, ...args] = argv;
  if (cmd === 'admin') return admin(args);
  if (cmd !== 'serve') {
    console.error(USAGE);
    return 2;
  }
  const s = parseArgs(args);
  const log = new Log({ format: s.logFormat });
  const { host, port } = parseAddr(s.listen);
  const url = s.url ?? `${s.tlsCert ? 'https' : 'http'}://${s.listen}`;
  const engine = s.attemptTimeout !== undefined ? { attempt_timeout: s.attemptTimeout } : undefined;
  let tls = {};
  let ca;
  try {
    if (s.tlsCert) tls = { tlsCert: pem(s.tlsCert, '--tls-cert'), tlsKey: pem(s.tlsKey, '--tls-key') };
    if (s.ca.length) ca = s.ca.map((f) => pem(f, '--ca'));
  } catch (e) {
    log.error(`relay-node: cannot start: ${messageOf(e)}`);
    return 1;
  }
  const opts = {
    relay: url, network: s.network, policies: s.policies, data: s.data ?? undefined, engine, adminListen: s.adminListen, logFormat: s.logFormat,
    allowPrivatePeers: s.allowPrivatePeers, ...(ca ? { ca } : {}),
  };
  const threaded = process.env.RELAY_NODE_THREAD !== '0';
  // The relay runs on a thread of its own and this one carries HTTP and WebSocket, so the
  // two overlap; RELAY_NODE_THREAD=0 runs both on this thread (to measure what it pays).
  let relay;
  try {
    if (!threaded) {
      relay = await createRelay({ ...opts, log });
    } else {
      relay = await RelayThread.start({ ...opts, log });
      relay.on('lost', (e) => {
        log.error(`relay-node: ${e.message}; stopping`);
        process.exit(1);
      });
    }
  } catch (e) {
    log.error(`relay-node: cannot start: ${messageOf(e)}`);
    return 1;
  }
  const last = lastResort(log, { threaded, healthy: () => !relay.gone });
  process.on('unhandledRejection', last.rejection);
  process.on('uncaughtException', last.exception);
  let srv;
  try {
    srv = await serve(relay, { host, port, ...s.limits, ...tls });
  } catch (e) {
    log.error(`relay-node: cannot serve: ${messageOf(e)}`);
    await relay.close().catch(() => {});
    return 1;
  }
  if (s.logFormat === 'json') console.log(JSON.stringify({ timestamp: new Date().toISOString(), level: 'INFO', message: 'listening', listen: `${host}:${srv.port}`, url, admin_url: srv.adminUrl }));
  else console.log(`relay-node listening on ${host}:${srv.port} as ${url} (admin ${srv.adminUrl})`);
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    log.info('shutting down: finishing in-flight requests');
    await srv.close();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  return null;
}
