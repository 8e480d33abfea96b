// A request through the core to its answer, the same loop on every JavaScript host.
//
// The core may answer a request with what it needs first: a relay's key document (to check a
// relay's signature) or, on a sharded relay, an account's route from a sibling shard. The host
// fetches it, hands it to the core, and the request goes in again; the core counts the rounds
// and answers busy past its bound. Requests waiting for the same relay's key share one GET.

/**
 * @typedef {import('./step.js').Step} Step
 * @typedef {import('./step.js').Answer} Answer
 * @typedef {import('./step.js').Upgrade} Upgrade
 * @typedef {import('./step.js').KeyFetch} KeyFetch
 * @typedef {import('./step.js').RouteFetch} RouteFetch
 * @typedef {import('./step.js').Event} Event
 * @typedef {import('./outcome.js').Outcome} Outcome
 */

/** Most relays whose last key fetch is remembered (for the mark below); past it, all are forgotten. */
const REMEMBERED = 65536;

/** The key fetches of one relay core: at most one GET per relay in flight. */
export class KeyFetches {
  /**
   * @param {(fetch: KeyFetch) => Promise<Outcome>} get the GET of a relay's key document
   * @param {(relay: string, outcome: Outcome) => void} report hands the outcome to the core (`keyFetched`)
   */
  constructor(get, report) {
    this.get = get;
    this.report = report;
    /** @type {Map<string, Promise<void>>} */
    this.inFlight = new Map();
    /** When (in `ended`, the count of fetches ended) each relay's last fetch ended. */
    this.endedAt = new Map();
    this.ended = 0;
  }

  /** A mark taken before a call whose answer may ask for a key. */
  mark() {
    return this.ended;
  }

  /**
   * Waits for the key the core asked for: the fetch of that relay in flight, or a new one. A
   * fetch of that relay that ended after `mark` (the answer waited for its commit group
   * meanwhile) is waited for no more: the request goes in again at once.
   * @param {KeyFetch} fetch @param {number} mark
   */
  wait(fetch, mark) {
    const { relay } = fetch;
    let p = this.inFlight.get(relay);
    if (!p && (this.endedAt.get(relay) ?? -1) >= mark) return Promise.resolve();
    if (!p) {
      p = this.get(fetch).then((o) => {
        this.inFlight.delete(relay);
        if (this.endedAt.size >= REMEMBERED) this.endedAt.clear();
        this.endedAt.set(relay, this.ended++);
        this.report(relay, o);
      });
      this.inFlight.set(relay, p);
    }
    return p;
  }
}

/**
 * A request through the core's rounds to its answer (or the session a WebSocket upgrade
 * belongs to). `call(round)` makes one call into the core; the host's parts carry out what
 * the core asks for.
 * @param {(round: number) => Promise<Step>} call
 * @param {object} host
 * @param {KeyFetches} host.keys
 * @param {(route: RouteFetch) => Promise<void>} [host.route] a sibling shard's route (a sharded relay)
 * @param {(path: string) => Promise<Answer>} host.backup writes the backup the operator asked for
 * @param {(events: Event[] | undefined) => void} host.run runs the answer's effects
 * @param {() => Answer} host.uncommitted the core's answer for a call that accepted nothing
 * @returns {Promise<Answer | {upgrade: Upgrade}>}
 */
export async function answer(call, host) {
  for (let round = 0; ; round += 1) {
    const mark = host.keys.mark();
    const s = await call(round);
    if ('fetch' in s) {
      await host.keys.wait(s.fetch, mark);
      continue;
    }
    if ('route' in s && host.route) {
      await host.route(s.route);
      continue;
    }
    if ('upgrade' in s) return s;
    if ('backup' in s) return host.backup(s.backup);
    // A step this host does not carry out accepted nothing.
    if (!('status' in s)) return host.uncommitted();
    host.run(s.effects);
    return s;
  }
}

/**
 * Runs the core's events with the host's handlers, one per event type it carries: `send` (an
 * attempt to carry to a peer), `wake` (tick at `at`), `notify` (a timeline changed),
 * `close` (a device's sessions end), `shard_call` (a call for a sibling shard),
 * `operator_action` (the audit trail), `accepted` and `delivery_ended` (per-message log
 * events). A type the host has no handler for is not its to carry.
 * @param {Event[] | undefined} events @param {Record<string, (e: Event) => void>} on
 */
export function runEvents(events, on) {
  for (const e of events ?? []) on[e.type]?.(e);
}
