// The Node build in-process over a fixture of pre-signed requests written by the bench driver.
// node host-node/bench/inprocess.js FIXTURE.json SCRATCH_DIR SYNCS  → a JSON array of samples on stdout.
// Runs on Deno and Bun too (`deno run -A`, `bun`); each sqlite sample names the SQLite driver it ran on.
import fs from 'node:fs';
import { createRelay } from '../src/index.js';

const [fixtureFile, scratch, syncArg] = process.argv.slice(2);
const fx = JSON.parse(fs.readFileSync(fixtureFile, 'utf8'));
const syncs = Number(syncArg ?? 200);
const PAGE = 50;
const policies = {
  send_rate: 0,
  deliver_rate: 0,
  deliver_rate_per_account: 0,
  deliver_rate_per_sender: 0,
  account_request_rate: 0,
};

function sample(storage, op, lat, wallNs, driver) {
  lat.sort((a, b) => a - b);
  const pct = (p) => lat[Math.round((lat.length - 1) * p)] / 1e6;
  return { storage, driver, op, n: lat.length, per_s: lat.length / (Number(wallNs) / 1e9), p50_ms: pct(0.5), p99_ms: pct(0.99) };
}

function timed(n, f) {
  const lat = new Array(n);
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    f(i);
    lat[i] = Number(process.hrtime.bigint() - t);
  }
  return [lat, process.hrtime.bigint() - t0];
}

function expect(r, what) {
  if (r.status !== 200) throw new Error(`${what}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

const out = [];
for (const storage of ['memory', 'sqlite']) {
  fs.rmSync(scratch, { recursive: true, force: true });
  const opts = storage === 'sqlite' ? { data: scratch } : { storage: 'memory' };
  const relay = await createRelay({ relay: fx.relay, policies, ...opts });
  const driver = relay.storage.driver ?? null;
  const tokens = fx.accounts.map((a) => {
    expect(relay.call({ kind: 'anonymous' }, 'account.register', a.register), 'register');
    return expect(relay.call({ kind: 'anonymous' }, 'session.open', a.session_open), 'session.open').session;
  });
  const [sl, sw] = timed(fx.sends.length, (i) => {
    const s = fx.sends[i];
    const b = expect(relay.call({ kind: 'session', value: tokens[s.sender] }, 'message.send', s.params), 'message.send');
    if (b.status !== 'target_accepted') throw new Error(`message.send: ${b.status}`);
  });
  out.push(sample(storage, 'message.send', sl, sw, driver));
  const [dl, dw] = timed(fx.delivers.length, (i) => {
    expect(relay.call({ kind: 'relay', value: fx.peer, routeRevision: fx.route_revision }, 'message.deliver', fx.delivers[i]), 'message.deliver');
  });
  out.push(sample(storage, 'message.deliver', dl, dw, driver));
  const total = fx.sends.length + fx.delivers.length;
  const recipient = tokens[tokens.length - 1];
  const [yl, yw] = timed(syncs, (i) => {
    const after = (i * PAGE) % Math.max(1, total - PAGE);
    const b = expect(relay.call({ kind: 'session', value: recipient }, 'message.timeline.sync', `{"after":${after},"limit":${PAGE}}`), 'sync');
    if (b.entries.length !== PAGE) throw new Error(`sync: ${b.entries.length} entries`);
  });
  out.push(sample(storage, 'message.timeline.sync (50)', yl, yw, driver));
  await relay.close();
}
fs.rmSync(scratch, { recursive: true, force: true });
process.stdout.write(JSON.stringify(out));
