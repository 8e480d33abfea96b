// `relay-edge serve` before workerd starts: reads the flags of `relay serve` that apply on
// workerd, makes the data directory and its secrets (as the other hosts do), picks the admin
// port, and writes DATA/workerd.capnp: the public and admin sockets, the Worker (twice: the
// public door and the admin door, one Durable Object namespace), its bindings, the objects'
// SQLite on local disk, and the network rules for outbound fetches. It prints workerd's
// path and the config's; bin/relay-edge then becomes workerd (exec), so the process the
// caller started is the relay and SIGKILL kills it.

import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import workerdPackage from 'workerd';
import { secret } from '../../host-node/src/secrets.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
/** The package the Worker ships in (relay-node): its module names are paths in it. */
const ROOT = path.resolve(HERE, '../../host-node');

/** The date the Worker is written for (wrangler.jsonc names the same). */
export const COMPATIBILITY_DATE = '2026-11-17';

/** The modules of the Worker: its name in workerd (as imports resolve it) and its file. */
const MODULES = [
  ['src/edge/worker.js', 'esModule'],
  ['src/edge/core.js', 'esModule'],
  ['src/edge/store.js', 'esModule'],
  ['src/kit/step.js', 'esModule'],
  ['src/kit/group.js', 'esModule'],
  ['src/kit/requests.js', 'esModule'],
  ['src/kit/outcome.js', 'esModule'],
  ['pkg/web/relay_wasm.js', 'esModule'],
  ['pkg/web/relay_wasm_bg.wasm', 'wasm'],
];

/** The command line every host shares (relay-settings, a wasm module the Worker never loads). */
let settings = null;
try {
  settings = await import('../../host-node/pkg/relay_settings.js');
} catch {
  settings = null;
}

/** `HOST:PORT` (`[v6]:PORT`). @param {string} addr */
export function parseAddr(addr) {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d+)$/.exec(addr);
  if (!m || Number(m[3]) > 65535) throw new Error(`an address is HOST:PORT, not ${addr}`);
  return { host: m[1] ?? m[2], port: Number(m[3]), v6: m[1] !== undefined };
}

/**
 * `relay-edge serve` arguments as settings: the flags of `relay serve` that apply on workerd
 * (the shared definition, relay-settings, refuses the others), or `{print}` for --help.
 * @param {string[]} argv
 */
export function parseArgs(argv) {
  if (!settings) throw new Error(`${path.join(ROOT, 'pkg')} is missing: build it with \`./x serve-edge\` (xtask bindgen-edge)`);
  const parsed = JSON.parse(settings.parseCommand('relay-edge', ['serve', ...argv], (f) => fs.readFileSync(f, 'utf8'), process.cwd()));
  return parsed.serve ?? parsed;
}

/** Whether `port` can be bound on `host` now. @param {string} host @param {number} port */
function bindable(host, port) {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, host, () => srv.close(() => resolve(true)));
  });
}

/**
 * A free port for a socket workerd binds later (it cannot tell which port it bound before
 * admin.url must name it). Not one the system hands out for port 0 or for outgoing
 * connections: a port outside its ephemeral range, free now, cannot be taken by those in
 * the moment between this check and workerd's bind (two relays starting at once on a busy
 * machine lost that race). The ephemeral range itself only when nothing else is free.
 * @param {string} host
 * @returns {Promise<number>}
 */
async function freePort(host) {
  let [lo, hi] = [32768, 60999];
  try {
    [lo, hi] = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
  } catch {
    // not Linux: its default range
  }
  const below = [Math.max(1024, lo - 12288), lo - 1];
  const above = [hi + 1, 65535];
  for (let i = 0; i < 64; i += 1) {
    const [a, b] = below[1] - below[0] >= above[1] - above[0] ? below : above;
    if (b < a) break;
    const port = a + Math.floor(Math.random() * (b - a + 1));
    if (await bindable(host, port)) return port;
  }
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, host, () => {
      const a = /** @type {net.AddressInfo} */ (srv.address());
      srv.close(() => resolve(a.port));
    });
  });
}

/** A capnp text literal. @param {string} s */
const lit = (s) => JSON.stringify(s);
/** An address as workerd takes it. @param {{host: string, port: number, v6: boolean}} a */
const addr = (a) => (a.v6 ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`);

/**
 * The workerd config for these settings. `data` is absolute; files are embedded by paths
 * relative to it (where the config lives).
 * @param {ReturnType<typeof parseArgs>} s
 * @param {{data: string, listen: string, admin: string, url: string}} at
 */
export function capnp(s, at) {
  const rel = (f) => lit(path.relative(at.data, f));
  const modules = MODULES.map(([name, kind]) => `(name = ${lit(name)}, ${kind} = embed ${rel(path.join(ROOT, name))})`).join(',\n    ');
  const config = {
    relay: at.url,
    network: s.network,
    policies: s.policies,
    ...s.engine,
    shards: s.shards,
    allow_private_peers: s.allowPrivatePeers,
    probe_peers: s.probePeers,
  };
  // Outbound as on the other hosts: on dev (or with --allow-private-peers) any address;
  // otherwise public addresses only (workerd checks every address a name resolves to).
  const allow = s.network === 'dev' || s.allowPrivatePeers ? '["public", "private", "local"]' : '["public"]';
  const secrets = `(name = "RELAY_KEY", text = embed "relay.key"),
    (name = "ADMIN_TOKEN", text = embed "admin.token"),
    (name = "CONFIG", json = ${lit(JSON.stringify(config))})`;
  return `# Written by relay-edge serve at every start; edits are lost.
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "relay", worker = .relay),
    (name = "relay-admin", worker = .admin),
    (name = "objects", disk = (path = ${lit(path.join(at.data, 'objects'))}, writable = true)),
    (name = "internet", network = (allow = ${allow}, tlsOptions = (trustBrowserCas = true))),
  ],
  sockets = [
    # workerd does not tell a Worker its peer's address: every anonymous caller of this
    # socket shares one anonymous_rate budget (a client's own cf-connecting-ip is replaced).
    (name = "public", address = ${lit(at.listen)}, service = "relay",
     http = (injectRequestHeaders = [(name = "cf-connecting-ip", value = "local")])),
    (name = "admin", address = ${lit(at.admin)}, service = "relay-admin", http = ()),
  ],
);

const relay :Workerd.Worker = (
  modules = [
    ${modules}
  ],
  compatibilityDate = ${lit(COMPATIBILITY_DATE)},
  bindings = [
    (name = "RELAY", durableObjectNamespace = "RelayShard"),
    ${secrets},
  ],
  durableObjectNamespaces = [(className = "RelayShard", uniqueKey = "relay-shard", enableSql = true)],
  durableObjectStorage = (localDisk = "objects"),
);

const admin :Workerd.Worker = (
  modules = [
    ${modules}
  ],
  compatibilityDate = ${lit(COMPATIBILITY_DATE)},
  bindings = [
    (name = "RELAY", durableObjectNamespace = (className = "RelayShard", serviceName = "relay")),
    ${secrets},
    (name = "DOOR", text = "admin"),
  ],
);
`;
}

/**
 * The shard count is fixed at the data's first start (DATA/shards): a start with another
 * count is refused here, before workerd runs, as the wasmtime host refuses it. (Each object's
 * core refuses a store of another count too, but only when the object is first called.)
 * @param {string} data @param {number} shards
 */
function fixedShards(data, shards) {
  const file = path.join(data, 'shards');
  let held;
  try {
    held = fs.readFileSync(file, 'utf8').trim();
  } catch (e) {
    if (/** @type {NodeJS.ErrnoException} */ (e).code !== 'ENOENT') throw e;
    fs.writeFileSync(file, `${shards}\n`, { mode: 0o600 });
    return;
  }
  if (held !== String(shards)) {
    throw new Error(`${file}: this data was made with ${held} shard(s) and this start asks for ${shards}: the shard count is fixed at a relay's first start, since changing it would move accounts between shards; start it with --shards ${held}`);
  }
}

/** Prepares a start; returns workerd's path and the config's. @param {string[]} argv */
export async function prepare(argv) {
  const s = parseArgs(argv);
  if (s.print !== undefined) return { print: s.print };
  const data = path.resolve(s.data);
  // The data directory holds the relay key and the operator token: its owner's only.
  fs.mkdirSync(path.join(data, 'objects'), { recursive: true, mode: 0o700 });
  fs.chmodSync(data, fs.statSync(data).mode & 0o777 & ~0o077);
  secret(path.join(data, 'relay.key'), 32);
  secret(path.join(data, 'admin.token'), 24);
  fixedShards(data, s.shards);
  const pub = parseAddr(s.listen);
  const adm = parseAddr(s.adminListen);
  if (pub.port === 0) pub.port = await freePort(pub.host);
  if (adm.port === 0) adm.port = await freePort(adm.host);
  const at = { data, listen: addr(pub), admin: addr(adm), url: s.url ?? `http://${addr(pub)}` };
  // admin.url names this start's admin listener (written before the public port listens, so
  // whoever sees the relay up finds it).
  const adminUrl = path.join(data, 'admin.url');
  fs.writeFileSync(`${adminUrl}.tmp`, `http://${at.admin}\n`, { mode: 0o600 });
  fs.renameSync(`${adminUrl}.tmp`, adminUrl);
  const config = path.join(data, 'workerd.capnp');
  fs.writeFileSync(`${config}.tmp`, capnp(s, at), { mode: 0o600 });
  fs.renameSync(`${config}.tmp`, config);
  if (!/(^|[=,])(warn|error)$/.test(process.env.RELAY_LOG ?? '')) process.stderr.write(`relay-edge: ${at.url} on ${at.listen} (admin http://${at.admin}), data ${data}, ${s.shards} shard${s.shards === 1 ? '' : 's'}\n`);
  // The native binary itself (its package is CommonJS: the default export is its exports).
  const bin = /** @type {any} */ (workerdPackage).default ?? workerdPackage;
  return { workerd: String(bin), config };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  try {
    const { workerd: bin, config, print } = await prepare(process.argv.slice(2));
    if (print !== undefined) process.stderr.write(print);
    else process.stdout.write(`${bin}\n${config}\n`);
  } catch (e) {
    process.stderr.write(`relay-edge: cannot start: ${e instanceof Error ? e.message : e}\n`);
    process.exit(1);
  }
}
