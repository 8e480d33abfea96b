// `relay-node serve`: the same flags as the wasmtime host's `relay serve`; `relay-node admin`:
// the operator's calls to a running relay, over its admin listener.

import fs from 'node:fs';
import net from 'node:net';
import { createRelay } from './relay.js';
import { serve, parseAddr } from './server.js';
import { RelayThread } from './relay-thread.js';
import { Log, messageOf } from './log.js';
import { parseCommand, renderAnswer } from '../pkg/relay_settings.js';
import { tuning } from './tuning.js';

/**
 * What `serve` is given: the settings of `relay serve` (camelCase), the policies as given.
 * @typedef {{listen: string, adminListen: string, logFormat: 'text' | 'json', url: string | null, data: string | null,
 *   network: string, policies: Record<string, number>, component: string | null,
 *   engine: {attempt_timeout?: number, max_in_flight_per_destination?: number}, limits: Record<string, number>, tlsCert: string | null, tlsKey: string | null,
 *   ca: string[], allowPrivatePeers: boolean, shards: number, probePeers: boolean}} Settings
 */
/**
 * A `relay-node` command line, read by the definition every host shares (the relay-settings
 * crate, in a wasm module of its own): `{serve: settings}`, `{admin: call}` or `{print: text}`.
 * A line that cannot be taken throws, its message naming the flag or key and the usage.
 * @param {string[]} argv
 * @returns {{serve?: Settings, admin?: {method: string, url: string, authorization: string | null, body: string, view: string}, print?: string}}
 */
export function command(argv) {
  return JSON.parse(parseCommand('relay-node', argv, (file) => fs.readFileSync(file, 'utf8'), process.cwd()));
}

/**
 * `relay-node serve` arguments as settings: the flags of `relay serve` that apply here, over
 * the `--config` TOML file, over the defaults.
 * @param {string[]} argv
 */
export const parseArgs = (argv) => command(['serve', ...argv]).serve;

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
 * Makes an admin call (the request the shared definition built) and prints its answer.
 * @param {{method: string, url: string, authorization: string | null, body: string, view: string}} call
 * @returns {Promise<number>}
 */
async function admin(call) {
  const headers = call.authorization ? { 'content-type': 'application/json', authorization: call.authorization } : {};
  const res = await fetch(call.url, call.method === 'GET' ? {} : { method: call.method, headers, body: call.body });
  const text = await res.text();
  if (res.ok) {
    process.stdout.write(renderAnswer(call.view, text));
    return 0;
  }
  process.stderr.write(`relay-node admin: status ${res.status}: ${text}\n`);
  return 1;
}

/** A server bound to a port the system picks on `host`. @param {string} host @returns {Promise<net.Server>} */
function boundAnyPort(host) {
  return new Promise((resolve, reject) => {
    // Nothing is served until the relay takes the socket over (the port is not announced yet).
    const srv = net.createServer((c) => c.destroy());
    srv.once('error', reject);
    srv.listen(0, host, () => resolve(srv));
  });
}

export async function main(argv) {
  let parsed;
  try {
    parsed = command(argv);
  } catch (e) {
    process.stderr.write(`${messageOf(e).trimEnd()}\n`);
    return 2;
  }
  if (parsed.print !== undefined) {
    process.stdout.write(parsed.print);
    return 0;
  }
  if (parsed.admin) return admin(parsed.admin);
  const s = parsed.serve;
  const log = new Log({ format: s.logFormat });
  const { host, port } = parseAddr(s.listen);
  // Port 0 without --url: the public port is bound here first, so the relay id names the
  // port the system gave (as the wasmtime host's does).
  let handle;
  try {
    if (port === 0 && !s.url) handle = await boundAnyPort(host);
  } catch (e) {
    log.error(`relay-node: cannot serve: ${messageOf(e)}`);
    return 1;
  }
  const at = handle ? s.listen.replace(/:0$/, `:${/** @type {net.AddressInfo} */ (handle.address()).port}`) : s.listen;
  const url = s.url ?? `${s.tlsCert ? 'https' : 'http'}://${at}`;
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
    relay: url, network: s.network, policies: s.policies, data: s.data ?? undefined, engine: s.engine, adminListen: s.adminListen, logFormat: s.logFormat,
    allowPrivatePeers: s.allowPrivatePeers, ...(ca ? { ca } : {}),
  };
  let threaded;
  try {
    // The environment knobs (README): a malformed one stops the start, naming it.
    threaded = tuning().nodeThread;
  } catch (e) {
    log.error(`relay-node: cannot start: ${messageOf(e)}`);
    return 2;
  }
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
    srv = await serve(relay, { host, port, handle, ...s.limits, ...tls });
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
