// A request through the core to its answer, the same way on every JavaScript host.
//
// The core may need something before it can answer: a relay's key document (to check a
// relay's signature) or, on a sharded relay, an account's route from a sibling shard. It then
// parks the request under the ticket the host gave it and names the fetch to start (none when
// one already under way brings it: the core coalesces). The host starts that fetch, reports
// what came, and the report hands back the parked requests' steps by ticket. The host never
// resubmits a request, counts rounds or coalesces fetches: the core does.

/**
 * @typedef {import('./step.js').Step} Step
 * @typedef {import('./step.js').Answer} Answer
 * @typedef {import('./step.js').Upgrade} Upgrade
 * @typedef {import('./step.js').KeyFetch} KeyFetch
 * @typedef {import('./step.js').RouteFetch} RouteFetch
 * @typedef {import('./step.js').Parked} Parked
 * @typedef {import('./step.js').Frame} Frame
 * @typedef {import('./step.js').Event} Event
 * @typedef {import('./outcome.js').Outcome} Outcome
 * @typedef {{ticket: number, step: Step} | {ticket: number, frame: Frame}} Resumed
 * @typedef {{resumed: Resumed[], lost: boolean}} Report what a fetch's report resumed, and
 *   whether its commit group failed (then none of it was accepted)
 */

/** The next resumption of one parked ticket: what came before it was asked for waits in `queue`. */
class Waiter {
  constructor() {
    /** @type {Array<Resumed | null>} */
    this.queue = [];
    /** @type {((r: Resumed | null) => void) | null} */
    this.take = null;
  }

  /** @param {Resumed | null} r */
  push(r) {
    const take = this.take;
    if (take) {
      this.take = null;
      take(r);
    } else this.queue.push(r);
  }

  /** @returns {Promise<Resumed | null>} */
  next() {
    if (this.queue.length) return Promise.resolve(/** @type {Resumed | null} */ (this.queue.shift()));
    return new Promise((resolve) => (this.take = resolve));
  }
}

/** Whether a resumption parks its request again (it keeps waiting under the same ticket). @param {Resumed} r */
const parkedAgain = (r) => ('step' in r ? 'parked' in r.step : Boolean(r.frame.parked));

/** The requests of one relay core that wait in it, by ticket, and the fetches they need. */
export class Parking {
  /**
   * @param {object} host
   * @param {(fetch: KeyFetch) => Promise<Outcome>} host.getKey GETs a relay's key document
   * @param {(relay: string, outcome: Outcome) => Promise<Report>} host.keyFetched reports it to the core, in a commit group
   * @param {(events: Event[] | undefined) => void} host.run runs the effects of an answer whose request is gone
   * @param {(route: RouteFetch) => Promise<Outcome>} [host.getRoute] asks a sibling shard for a route (a sharded relay)
   * @param {(account: string, outcome: Outcome) => Promise<Report>} [host.routeFetched] reports it to the core, as `keyFetched`
   */
  constructor({ getKey, keyFetched, run, getRoute, routeFetched }) {
    this.host = { getKey, keyFetched, run, getRoute, routeFetched };
    /** @type {Map<number, Waiter>} */
    this.waiting = new Map();
    this.next = 0;
  }

  /** A ticket no waiting request holds, opened so that resumptions for it are kept. @returns {number} */
  open() {
    do this.next = (this.next + 1) >>> 0;
    while (this.waiting.has(this.next));
    this.waiting.set(this.next, new Waiter());
    return this.next;
  }

  /** The ticket's request is answered (or went away): resumptions for it are dropped. @param {number} ticket */
  close(ticket) {
    this.waiting.delete(ticket);
  }

  /**
   * The next resumption of a parked ticket: null when the core lost it (a trap, a commit that
   * failed), so nothing was accepted.
   * @param {number} ticket @returns {Promise<Resumed | null>}
   */
  resumption(ticket) {
    return this.waiting.get(ticket)?.next() ?? Promise.resolve(null);
  }

  /**
   * Starts the fetch a parked step names, if any, on its own: its report's resumptions reach
   * their tickets.
   * @param {Parked} parked
   */
  start(parked) {
    const { getKey, keyFetched, getRoute, routeFetched } = this.host;
    if (parked.key) {
      const k = parked.key;
      void getKey(k).then((o) => keyFetched(k.relay, o)).then((r) => this.deliver(r));
    } else if (parked.route && getRoute && routeFetched) {
      const w = parked.route;
      void getRoute(w).then((o) => routeFetched(w.account, o)).then((r) => this.deliver(r));
    }
  }

  /**
   * Hands each resumption to its ticket. When the report's group failed, each of them learns
   * that nothing was accepted; an answer whose request is gone still has its effects run.
   * @param {Report} report
   */
  deliver({ resumed, lost }) {
    for (const r of resumed) {
      const w = this.waiting.get(r.ticket);
      if (w) w.push(lost ? null : r);
      else if (!lost) this.host.run('step' in r ? ('status' in r.step ? r.step.effects : undefined) : r.frame.effects);
    }
  }

  /** The core restarted (its parked requests are gone) or a report was lost: every waiting request is answered as uncommitted. */
  dropAll() {
    for (const w of this.waiting.values()) w.push(null);
  }
}

/**
 * A request through the core to its answer (or the session a WebSocket upgrade belongs to).
 * `call(ticket)` makes the one call into the core; a parked request waits for its ticket's
 * resumption while the fetch the core named runs.
 * @param {(ticket: number) => Promise<Step>} call
 * @param {object} host
 * @param {Parking} host.parking
 * @param {(path: string) => Promise<Answer>} host.backup writes the backup the operator asked for
 * @param {(events: Event[] | undefined) => void} host.run runs the answer's effects
 * @param {() => Answer} host.uncommitted the core's answer for a call that accepted nothing
 * @returns {Promise<Answer | {upgrade: Upgrade}>}
 */
export async function answer(call, host) {
  const ticket = host.parking.open();
  try {
    let s = await call(ticket);
    while ('parked' in s) {
      host.parking.start(s.parked);
      const r = await host.parking.resumption(ticket);
      if (r === null || !('step' in r)) return host.uncommitted();
      s = r.step;
    }
    if ('upgrade' in s) return s;
    if ('backup' in s) return host.backup(s.backup);
    // A step this host does not carry out accepted nothing.
    if (!('status' in s)) return host.uncommitted();
    host.run(s.effects);
    return s;
  } finally {
    host.parking.close(ticket);
  }
}

/**
 * A WebSocket text message through the core to its answer frame, as `answer` takes a request.
 * @param {(ticket: number) => Frame | null} call the one call into the core (null: it trapped)
 * @param {object} host
 * @param {Parking} host.parking
 * @param {() => string} host.uncommitted the core's frame for a message that accepted nothing
 * @returns {Promise<Frame>}
 */
export async function answerFrame(call, host) {
  const ticket = host.parking.open();
  try {
    let f = call(ticket);
    while (f?.parked) {
      host.parking.start(f.parked);
      const r = await host.parking.resumption(ticket);
      f = r !== null && 'frame' in r ? r.frame : null;
    }
    return f ?? { text: host.uncommitted() };
  } finally {
    host.parking.close(ticket);
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
