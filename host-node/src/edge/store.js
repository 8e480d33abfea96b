// The core's storage over a Durable Object's SQLite (`ctx.storage.sql`): one table of keys
// and values, compared as bytes (SQLite orders BLOBs with memcmp, as the core needs).
//
// The object commits each group of core calls (the calls of one turn, or a lone call) inside
// one `transactionSync` and answers them only after it: the commit here writes, the
// transaction makes it durable.

/** Most rows in one write statement (two bound parameters each: SQLite's limit on a Durable Object is 100). */
const ROWS = 50;
/** `INSERT OR REPLACE` and `DELETE` statements of 1 to ROWS rows, by row count. */
const PUTS = Array.from({ length: ROWS + 1 }, (_, n) => `INSERT OR REPLACE INTO kv (k, v) VALUES ${Array(n).fill('(?, ?)').join(', ')}`);
const DELETES = Array.from({ length: ROWS + 1 }, (_, n) => `DELETE FROM kv WHERE k IN (${Array(n).fill('?').join(', ')})`);

/**
 * Most values the store remembers (a value or that a key is absent): a named bound, so an
 * object's memory does not grow with its data. Each entry holds one record (a few hundred
 * bytes), so the memory holds a few MB at most.
 */
export const READ_MEMORY = 16_384;

/** A key as a Map key: its bytes in latin1 (one char per byte). @param {Uint8Array} key */
const keyOf = (key) => String.fromCharCode.apply(null, /** @type {any} */ (key));

/**
 * The storage object `RelayCore` takes: synchronous `get`, `scan` (start inclusive, end
 * exclusive, in key order) and `commit` (a batch; a null value deletes).
 *
 * The object is its SQLite database's only writer, so what `get` read or a committed
 * transaction wrote is what the database holds until this store writes that key again: `get`
 * answers from that memory (bounded by READ_MEMORY) before asking SQLite. Writes of the
 * transaction in progress are held apart until the object says how it ended (`settled`): a
 * transaction that rolled back leaves the memory as it was.
 */
export class SqlStore {
  /** @param {SqlStorage} sql */
  constructor(sql) {
    this.sql = sql;
    sql.exec('CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID');
    /** The first commit that failed in the current core call: the call is rolled back whole. */
    this.failed = null;
    /** What the database holds, by key (null: absent), in the order first remembered. @type {Map<string, ArrayBuffer | null>} */
    this.known = new Map();
    /** Writes of the transaction in progress, by key. @type {Map<string, ArrayBuffer | null>} */
    this.pending = new Map();
  }

  /** @param {Uint8Array} key @returns {ArrayBuffer | null} */
  get(key) {
    const id = keyOf(key);
    if (this.pending.has(id)) return /** @type {ArrayBuffer | null} */ (this.pending.get(id));
    if (this.known.has(id)) return /** @type {ArrayBuffer | null} */ (this.known.get(id));
    const rows = this.sql.exec('SELECT v FROM kv WHERE k = ?', key).raw().toArray();
    const v = rows.length === 0 ? null : /** @type {ArrayBuffer} */ (rows[0][0]);
    this.#remember(id, v);
    return v;
  }

  /**
   * The transaction in progress ended: committed (its writes are what the database holds) or
   * rolled back (they never were). The object calls this after every `transactionSync`.
   * @param {boolean} committed
   */
  settled(committed) {
    if (committed) for (const [id, v] of this.pending) this.#remember(id, v);
    this.pending.clear();
  }

  /** Remembers a key's value, forgetting the oldest entries beyond READ_MEMORY. */
  #remember(id, v) {
    this.known.delete(id);
    this.known.set(id, v);
    if (this.known.size > READ_MEMORY) this.known.delete(this.known.keys().next().value);
  }

  /** @param {Uint8Array} start @param {Uint8Array} end @param {number} limit @returns {Array<[ArrayBuffer, ArrayBuffer]>} */
  scan(start, end, limit) {
    if (limit <= 0) return [];
    return /** @type {any} */ (this.sql.exec('SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT ?', start, end, limit).raw().toArray());
  }

  /** @param {Array<[Uint8Array, Uint8Array | null]>} writes */
  commit(writes) {
    try {
      // Runs of puts and of deletes, in order, each in statements of up to ROWS rows: one
      // `exec` per statement rather than per write (each is a call into the runtime).
      for (let i = 0; i < writes.length; ) {
        const put = writes[i][1] !== null;
        let j = i;
        while (j < writes.length && j - i < ROWS && (writes[j][1] !== null) === put) j += 1;
        const args = [];
        if (put) {
          for (let r = i; r < j; r += 1) args.push(writes[r][0], writes[r][1]);
          this.sql.exec(PUTS[j - i], ...args);
        } else {
          for (let r = i; r < j; r += 1) args.push(writes[r][0]);
          this.sql.exec(DELETES[j - i], ...args);
        }
        for (let r = i; r < j; r += 1) {
          const v = writes[r][1];
          // A copy: the value may be a view into memory its caller reuses.
          this.pending.set(keyOf(writes[r][0]), v === null ? null : v.slice().buffer);
        }
        i = j;
      }
    } catch (e) {
      // Some of the batch may be written: the object rolls the whole call back (and settles
      // the transaction as rolled back).
      this.failed ??= e;
      throw e;
    }
  }
}

/** The shard index an object serves, kept beside the relay's keys (it is told once, by the Worker). */
export class ShardIndex {
  /** @param {SqlStorage} sql */
  constructor(sql) {
    this.sql = sql;
    sql.exec('CREATE TABLE IF NOT EXISTS shard (one INTEGER PRIMARY KEY CHECK (one = 1), idx INTEGER NOT NULL)');
  }

  /** @returns {number | null} */
  get() {
    const rows = this.sql.exec('SELECT idx FROM shard').toArray();
    return rows.length === 0 ? null : Number(rows[0].idx);
  }

  /** @param {number} k */
  set(k) {
    this.sql.exec('INSERT OR REPLACE INTO shard (one, idx) VALUES (1, ?)', k);
  }
}
