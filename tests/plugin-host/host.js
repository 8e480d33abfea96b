// A relay host written from wit/relay.wit alone, the measure of what a new host costs: the
// core component transpiled by jco (`jco transpile relay_core.wasm --instantiation async`),
// the `host` interface it imports implemented over an ordered in-memory map, and a loop that
// carries out the core's events (timers, deliveries to peers, notifications). Every protocol
// decision (routing, statuses, retries, what an outcome means) is the core's.
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

// lines: storage
/** Keys as hex: string order of hex is byte order, as the core's scans need. */
const hex = (b) => Buffer.from(b).toString('hex');

/** A relay's `store` resource (relay:core/host): an ordered in-memory map of its own. */
export class Store {
  constructor(map) {
    this.map = map;
  }
  get(key) {
    return this.map.get(hex(key))?.[1];
  }
  scan(start, end, limit) {
    const [lo, hi] = [hex(start), hex(end)];
    const keys = [...this.map.keys()].filter((k) => k >= lo && k < hi).sort();
    return keys.slice(0, limit).map((k) => ({ key: this.map.get(k)[0], value: this.map.get(k)[1] }));
  }
  // All of the writes or none: they are applied only after every one was read.
  commit(writes) {
    const staged = writes.map((w) => [hex(w.key), w.key, w.value]);
    for (const [k, key, value] of staged) {
      if (value === undefined) this.map.delete(k);
      else this.map.set(k, [key, value]);
    }
  }
}

// lines: process
/** The log lines of every relay of this process. */
const logs = [];

/** The rest of `relay:core/host`: logging, entropy, and crypto left to the core. */
const host = {
  Store,
  log: (level, message) => logs.push(`${level}: ${message}`),
  entropy: (len) => crypto.getRandomValues(new Uint8Array(len)),
  // `declined`/`undefined`: the core verifies and hashes with its own code.
  verifyEd25519: () => 'declined',
  sha256: () => undefined,
};

/** One instance of the component per transpiled directory: every relay opened from it lives there. */
const instances = new Map();
function instance(out) {
  if (!instances.has(out)) {
    const compile = (name) => WebAssembly.compile(fs.readFileSync(path.join(out, name)));
    const load = import(path.join(out, 'relay.js')).then((m) => m.instantiate(compile, { 'relay:core/host': host }));
    instances.set(out, load);
  }
  return instances.get(out);
}

// lines: sockets
/** What became of an exchange, as the core's `fetch` variant. */
async function exchange(url, init, timeoutMs) {
  let res;
  try {
    res = await fetch(url, { ...init, redirect: 'manual', signal: AbortSignal.timeout(Number(timeoutMs)) });
  } catch (e) {
    // fetch cannot tell a refused connection from a lost answer: unknown is always safe.
    return e?.cause?.code === 'ECONNREFUSED' ? { tag: 'not-sent' } : { tag: 'unknown' };
  }
  try {
    return { tag: 'answered', val: [res.status, new Uint8Array(await res.arrayBuffer())] };
  } catch {
    return { tag: 'unknown' };
  }
}

// lines: process
/**
 * A relay on this host: `relay` is a `relay` resource of the component's instance for `out`
 * (shared by every relay started from it); `notes` collects the notifications it asked to send.
 * @param {{out: string, config: object, seed: Uint8Array, operator?: string}} opts
 */
export async function startHost({ out, config, seed, operator }) {
  const store = new Map();
  const notes = [];
  const core = await instance(out);
  // A relay resource over a store of its own (a typed `error` is thrown if it cannot open).
  const relay = core.relay.Relay.open(new Store(store), JSON.stringify(config), seed, operator);
  const now = () => BigInt(Date.now());
  let timer = null;
  const inflight = new Set();

  /** Carries out the core's events. */
  function run(events) {
    for (const e of events ?? []) {
      if (e.tag === 'wake-at') {
        clearTimeout(timer);
        timer = setTimeout(() => run(relay.tick(now()).events), Math.max(0, Number(e.val - now())));
      } else if (e.tag === 'send') {
        const p = e.val;
        const done = exchange(p.url, { method: 'POST', headers: p.headers, body: p.body }, p.timeoutMs).then((f) => {
          run(relay.fetched(p.task, p.attempt, f, now()));
        });
        inflight.add(done);
        done.finally(() => inflight.delete(done));
      } else if (e.tag === 'notify') {
        notes.push(e.val);
      } else if (e.tag !== 'accepted' && e.tag !== 'delivery-ended') {
        logs.push(`event ${e.tag}`);
      }
    }
  }

  /**
   * A request through `handle`: a parked one waits for its ticket to come back from the
   * report of the fetch the core named (the core coalesces fetches and bounds the waits).
   */
  const waiting = new Map();
  let tickets = 0;
  function start(need) {
    if (need?.tag !== 'key') return;
    const k = need.val;
    exchange(k.url, { method: 'GET' }, k.timeoutMs).then((f) => {
      for (const r of relay.keyFetched(k.relay, f, now())) {
        const done = waiting.get(r.ticket);
        if (done) done(r.resumption.val);
        else if (r.resumption.val.tag === 'respond') run(r.resumption.val.val.events);
      }
    });
  }
  async function handle(request) {
    const ticket = (tickets = (tickets + 1) >>> 0);
    let step = relay.handle(request, ticket, now());
    while (step.tag === 'parked') {
      start(step.val.start);
      step = await new Promise((done) => waiting.set(ticket, done));
      waiting.delete(ticket);
    }
    if (step.tag !== 'respond') return { status: 501, headers: [], body: new Uint8Array(), events: [] };
    run(step.val.events);
    return step.val;
  }

  // lines: sockets
  /** Serves the relay over HTTP on `port` (no WebSocket, no TLS: a plugin host needs neither). */
  function serve(port) {
    // The headers the core reads (wit: http-request).
    const names = ['authorization', 'connection', 'upgrade', 'relay-id', 'relay-timestamp', 'relay-nonce', 'relay-signature', 'relay-route-revision'];
    const server = http.createServer(async (req, res) => {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      const url = new URL(req.url, 'http://host');
      const a = await handle({
        listener: 'public',
        method: req.method,
        path: url.pathname,
        query: url.search.slice(1),
        headers: names.filter((n) => req.headers[n] !== undefined).map((n) => [n, String(req.headers[n])]),
        body: new Uint8Array(Buffer.concat(chunks)),
        origin: req.socket.remoteAddress ?? undefined,
      });
      res.writeHead(a.status, Object.fromEntries(a.headers));
      res.end(a.body);
    });
    return new Promise((ok) => server.listen(port, '127.0.0.1', () => ok(server)));
  }

  // lines: process
  run(relay.tick(now()).events);
  return {
    relay,
    core,
    run,
    serve,
    logs,
    notes,
    store,
    /** Stops the timer and waits for deliveries in flight. */
    async close() {
      clearTimeout(timer);
      await Promise.all([...inflight]);
    },
  };
}
