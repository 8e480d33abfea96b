// Test helpers: client identities (keys and signed objects from the core's own builders).
import fs from 'node:fs';
import { spawnSync } from 'node:child_process';
import { Identity } from '../pkg/relay_wasm.js';

export const NET = 'dev';

/** An account with one device, registered at `relay` (a Relay, in-process). */
export function register(relay, discoverable = true) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const route = id.route(NET, relay.relay, 1, Date.now());
  const r = relay.call({ kind: 'anonymous' }, 'account.register', `{"route":${route},"certificate":${cert},"discoverable":${discoverable}}`);
  if (r.status !== 200) throw new Error(JSON.stringify(r.body));
  const s = relay.call({ kind: 'anonymous' }, 'session.open', id.sessionOpen(NET, relay.relay, Date.now()));
  if (s.status !== 200) throw new Error(JSON.stringify(s.body));
  return { id, cert, route, session: s.body.session, relay };
}

export const as = (user) => ({ kind: 'session', value: user.session });

/** message.send params from `from` to `to`. */
export function message(from, to, text, senderBoxes = false) {
  return from.id.message(NET, to.id.accountId(), `[${to.cert}]`, text, Date.now(), senderBoxes);
}

/** The decrypted texts of a user's timeline (in-process). */
export function texts(user) {
  const r = user.relay.call(as(user), 'message.timeline.sync', '{"after":0}');
  if (r.status !== 200) throw new Error(JSON.stringify(r.body));
  return r.body.entries.map((e) => user.id.openEntry(JSON.stringify(e)));
}

/** POSTs JSON to a URL; returns {status, body}. */
export async function post(url, body, session) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(session ? { authorization: `Bearer ${session}` } : {}) },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

/** Polls until `f()` is truthy. */
export async function eventually(f, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 50));
  }
}

let nextPort = 0;
/**
 * A loopback port that is free now, chosen below the kernel's ephemeral range: a port the
 * kernel hands out for `listen(0)` (as every relay's admin listener binds) could be handed
 * out again between this probe and the caller's bind. Each test process starts at its own
 * offset so parallel test files rarely try the same ports.
 * @returns {Promise<number>}
 */
export async function freePort() {
  const fs = await import('node:fs');
  const net = await import('node:net');
  let lo = 32768;
  try {
    lo = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || lo;
  } catch {}
  const span = Math.min(12288, lo - 1024);
  const first = Math.max(1024, lo - 12288);
  const bindable = (port) =>
    new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
    });
  if (span > 0) {
    const start = (process.pid * 7919) % span;
    for (let i = 0; i < 256; i++) {
      const port = first + ((start + nextPort++) % span);
      if (await bindable(port)) return port;
    }
  }
  throw new Error('no free loopback port below the ephemeral range');
}

/**
 * The JavaScript runtimes the package is tested on, from the npm registry (host-node/runtimes,
 * installed once per lock file): the path of a file in their node_modules.
 * @param {string} file e.g. `node22/bin/node`
 */
export function runtime(file) {
  const dir = new URL('../runtimes/', import.meta.url).pathname;
  const stamp = `${dir}node_modules/.package-lock.json`;
  if (!fs.existsSync(stamp) || fs.statSync(`${dir}package-lock.json`).mtimeMs > fs.statSync(stamp).mtimeMs) {
    const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: dir, encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`npm ci in host-node/runtimes failed: ${r.stderr}`);
  }
  return `${dir}node_modules/${file}`;
}
