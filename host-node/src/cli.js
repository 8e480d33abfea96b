// `relay-node serve`: the same flags as the wasmtime host's `relay serve`.

import fs from 'node:fs';
import { createRelay } from './relay.js';
import { serve } from './server.js';

const USAGE = `relay-node serve [--listen ADDR] [--url URL] [--data DIR | --memory] [--network NAME]
                 [--policy NAME=VALUE]... [--config FILE]`;

/** Parses a tiny TOML subset: `key = "string" | number | true|false` lines and a [policy] table. */
export function parseToml(text) {
  const out = { policy: {} };
  let table = null;
  for (const raw of text.split('\n')) {
    const line = raw.replace(/#.*$/, '').trim();
    if (!line) continue;
    const t = /^\[([a-z_]+)\]$/.exec(line);
    if (t) {
      table = t[1];
      continue;
    }
    const kv = /^([a-z_]+)\s*=\s*(.+)$/.exec(line);
    if (!kv) throw new Error(`config: cannot read line ${JSON.stringify(raw)}`);
    const v = JSON.parse(kv[2]);
    if (table === 'policy') out.policy[kv[1]] = v;
    else if (table === null) out[kv[1]] = v;
    else throw new Error(`config: unknown table [${table}]`);
  }
  return out;
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
    const c = parseToml(fs.readFileSync(rest[cfgAt + 1], 'utf8'));
    for (const k of ['listen', 'url', 'data', 'network']) if (c[k] !== undefined) s[k] = c[k];
    if (c.memory === true) s.data = null;
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
  const relay = await createRelay({ relay: url, network: s.network, policies: s.policies, data: s.data ?? undefined });
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
