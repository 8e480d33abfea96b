// The host's own Prometheus metrics (prom-client), beside the core's counters.
//
// The core counts what only it knows (acceptances, refusals, attempts, terminal outcomes,
// pending deliveries) and renders them itself; these are what only the host sees. Each relay
// has registries of its own, never prom-client's global one, so two relays in one process
// keep apart. Recording is cheap: a histogram observation per commit group, attempt or
// tick (never per request), and the gauges are plain integers read at scrape time.
//
// Who holds what: `RelayMetrics` lives where the relay runs (its thread, when it has one):
// attempts, commits, ticks, traps and restarts. `TransportMetrics` lives where the
// transports run: open connections and WebSockets. `/metrics` is the core's text, then
// the relay's, then the transports'.

import client from 'prom-client';

const { Registry, Histogram, Counter, Gauge } = client;

/** The outcomes an attempt reports to the core, as the `outcome` label. */
export const OUTCOMES = /** @type {const} */ (['answered', 'rejected', 'unknown', 'not_attempted']);

/** @typedef {typeof OUTCOMES[number]} AttemptOutcome */

/** Latency buckets in seconds, 0.5 ms to about 33 s by factors of 2 (as the wasmtime host's). */
const SECONDS = Array.from({ length: 17 }, (_, i) => 0.0005 * 2 ** i);
/** Operations per commit group: 1 to 256 by factors of 2 (as the wasmtime host's). */
const GROUP_SIZES = Array.from({ length: 9 }, (_, i) => 2 ** i);

/** The relay's side: what happens where the core runs. */
export class RelayMetrics {
  constructor() {
    this.registry = new Registry();
    const registers = [this.registry];
    this.attempt = new Histogram({
      name: 'relay_attempt_duration_seconds',
      help: 'Time of one delivery attempt to another relay, by the outcome reported to the core.',
      labelNames: ['outcome'],
      buckets: SECONDS,
      registers,
    });
    /** @type {Record<AttemptOutcome, {observe: (v: number) => void}>} */
    this.attemptBy = /** @type {Record<AttemptOutcome, {observe: (v: number) => void}>} */ ({});
    for (const outcome of OUTCOMES) {
      this.attempt.zero({ outcome });
      this.attemptBy[outcome] = this.attempt.labels({ outcome });
    }
    this.groupSize = new Histogram({
      name: 'relay_commit_group_size',
      help: 'Operations per commit that wrote (one SQLite transaction, one fsync; an operation outside a group counts as one).',
      buckets: GROUP_SIZES,
      registers,
    });
    this.commitDuration = new Histogram({
      name: 'relay_commit_duration_seconds',
      help: 'Time of one durable commit (the transaction and its fsync).',
      buckets: SECONDS,
      registers,
    });
    this.traps = new Counter({ name: 'relay_guest_traps_total', help: 'Traps of the core instance (each answered internal).', registers });
    this.restarts = new Counter({ name: 'relay_core_restarts_total', help: 'Fresh core instances started after a trap.', registers });
    this.tick = new Histogram({
      name: 'relay_tick_duration_seconds',
      help: 'Time of one tick of the core (due attempts, timeouts, deadlines, expiry).',
      buckets: SECONDS,
      registers,
    });
  }

  /** One durable commit of `size` operations that took `seconds`. @param {number} size @param {number} seconds */
  commit(size, seconds) {
    this.groupSize.observe(size);
    this.commitDuration.observe(seconds);
  }

  /** The text exposition of these metrics. @returns {Promise<string>} */
  text() {
    return this.registry.metrics();
  }
}

/** The transports' side: open connections on the HTTP listeners, and WebSockets. */
export class TransportMetrics {
  constructor() {
    this.registry = new Registry();
    /** Open TCP connections on the HTTP listeners (public and admin; WebSockets included). */
    this.connections = 0;
    /** Open WebSockets. */
    this.websockets = 0;
    /** Connections closed at accept, by cause: the open-connection cap, or the per-address cap. */
    this.refused = { limit: 0, perIp: 0 };
    /** Requests and frames answered 503 because `maxPending` were waiting for the core. */
    this.busy = 0;
    /** WebSockets dropped because their client did not read (send queue full). */
    this.dropped = 0;
    const self = this;
    new Counter({
      name: 'relay_connections_refused_total',
      help: 'Connections closed at accept: over --max-connections (limit) or --max-connections-per-ip (per_ip).',
      labelNames: ['cause'],
      registers: [this.registry],
      collect() {
        this.reset();
        this.inc({ cause: 'limit' }, self.refused.limit);
        this.inc({ cause: 'per_ip' }, self.refused.perIp);
      },
    });
    new Counter({
      name: 'relay_busy_total',
      help: 'Requests and WebSocket frames answered 503 unavailable because --max-pending were waiting for the core.',
      registers: [this.registry],
      collect() {
        this.reset();
        this.inc(self.busy);
      },
    });
    new Counter({
      name: 'relay_websockets_dropped_total',
      help: 'WebSockets dropped because their client did not read (over --ws-send-queue frames queued).',
      registers: [this.registry],
      collect() {
        this.reset();
        this.inc(self.dropped);
      },
    });
    new Gauge({
      name: 'relay_open_connections',
      help: 'TCP connections open on the HTTP listeners (public and admin, WebSockets included).',
      registers: [this.registry],
      collect() {
        this.set(self.connections);
      },
    });
    new Gauge({
      name: 'relay_open_websockets',
      help: 'Open WebSocket sessions.',
      registers: [this.registry],
      collect() {
        this.set(self.websockets);
      },
    });
  }

  /** @returns {Promise<string>} */
  text() {
    return this.registry.metrics();
  }
}

/** The Prometheus text format's content type. */
export const CONTENT_TYPE = Registry.PROMETHEUS_CONTENT_TYPE;
