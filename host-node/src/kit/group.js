// Group commit, as every JavaScript host holds it: the calls made in one turn of the event
// loop leave their writes in the core's open group (`beginGroup`), one storage commit
// (`flushGroup`) makes them durable together, and each call's answer (with its effects) is
// released only after that commit. A failed commit or a trap releases every answer of the
// group as null: nothing of it was accepted.

/**
 * @template T
 */
export class CommitGroup {
  /**
   * @param {object} host
   * @param {() => void} host.begin opens the core's group
   * @param {(size: number) => void} host.commit commits it durably (throws when it could not)
   * @param {(flush: () => void) => void} host.later runs `flush` at the end of this turn
   * @param {(error: unknown, size: number) => void} host.failed told of a commit that failed (after its answers went out as null)
   * @param {number} [host.cap] most calls in one group: a full group commits at once
   */
  constructor({ begin, commit, later, failed, cap = Infinity }) {
    this.begin = begin;
    this.commit = commit;
    this.later = later;
    this.failed = failed;
    this.cap = cap;
    /** @type {Array<[T, (value: T | null) => void]> | null} the open group's answers */
    this.held = null;
  }

  /** Whether a group is open. */
  get open() {
    return this.held !== null;
  }

  /** Opens a group unless one is open (its flush is set for the end of the turn). */
  enter() {
    if (this.held) return;
    this.begin();
    this.held = [];
    this.later(() => this.flush());
  }

  /**
   * Holds a call's answer until its group commits: resolves to it, or to null when the commit
   * failed or the group was dropped. Call `enter` before the call that made it.
   * @param {T} answer @returns {Promise<T | null>}
   */
  hold(answer) {
    if (!this.held) return Promise.resolve(null);
    const p = new Promise((resolve) => this.held.push([answer, resolve]));
    if (this.held.length >= this.cap) this.flush();
    return p;
  }

  /**
   * Commits the open group, then releases its answers (all null when the commit threw, and
   * the host is told why). Returns whether the group is durable.
   * @returns {boolean}
   */
  flush() {
    const group = this.held;
    if (!group) return true;
    this.held = null;
    let error = null;
    try {
      this.commit(group.length);
    } catch (e) {
      error = e ?? new Error('the commit failed');
    }
    for (const [answer, resolve] of group) resolve(error ? null : answer);
    if (error) this.failed(error, group.length);
    return !error;
  }

  /** Releases every held answer as null without committing (the core trapped: the group's writes are gone). */
  drop() {
    const group = this.held;
    this.held = null;
    for (const [, resolve] of group ?? []) resolve(null);
  }
}
