// `relay-node serve`: the same flags as the wasmtime host's `relay serve`.

import fs from 'node:fs';
import { parse as parseToml } from 'smol-toml';
import { createRelay } from './relay.js';
import { serve } from './server.js';
import { RelayThread } from './relay-thread.js';

const USAGE = `relay-node serve [--listen ADDR] [--url URL] [--data DIR | --memory] [--network NAME]
                 [--policy NAME=VALUE]... [--attempt-timeout MS] [--config FILE]`;

/** Reads a TOML config: `listen`, `url`, `data`, `memory`, `network`, and a `[policy]` table. */
export function readConfig(text) {
  const c = parseToml(text);
  const known = new Set(['listen', 'url', 'data', 'memory', 'network', 'component', 'attempt_timeout', 'policy']);
  for (const k of Object.keys(c)) if (!known.has(k)) throw new Error(`config: unknown key ${k}`);
  return { ...c, policy: c.policy ?? {} };
}

/** Turns argv into settings. */
export function parseArgs(argv) {
  const s = { listen: '127.0.0.1:8080', url: null, data: '.relay', network: 'dev', policies: {} };
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
    Object.assign(s.policies, c.policy);
  }
  while (rest.length) {
    const a = rest.shift();
    if (a === '--listen') s.listen = take(a);
    else if (a === '--url') s.url = take(a);
    else if (a === '--data') s.data = take(a);
    else if (a === '--memory') s.data = null;
    else if (a === '--network') s.network = take(a);
    else if (a === '--config') take(a);
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
  return s;
}

export async function main(argv) {
  const [cmd, ...args] = argv;
  if (cmd !== 'serve') {
    console.error(USAGE);
    return 2;
  }
  const s = parseArgs(args);
  const [host, port] = s.listen.split(/:(?=\d+$)/);
  const url = s.url ?? `http://${s.listen}`;
  const engine = s.attemptTimeout !== undefined ? { attempt_timeout: s.attemptTimeout } : undefined;
  const opts = { relay: url, network: s.network, policies: s.policies, data: s.data ?? undefined, engine };
  // The relay runs on a thread of its own and this one carries HTTP and WebSocket, so the
  // two overlap; RELAY_NODE_THREAD=0 runs both on this thread (to measure what it pays).
  let relay;
  if (process.env.RELAY_NODE_THREAD === '0') {
    relay = await createRelay(opts);
  } else {
    relay = await RelayThread.start(opts);
    relay.on('lost', (e) => {
      console.error(`relay-node: ${e.message}; stopping`);
      process.exit(1);
    });
  }
  const srv = await serve(relay, { host, port: Number(port) });
  console.log(`relay-node listening on ${host}:${srv.port} as ${url}`);
  const stop = async () => {
    console.error('shutting down: finishing in-flight requests');
    await srv.close();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  return null;
}
