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
 * The storage object `RelayCore` takes: synchronous `get`, `scan` (start inclusive, end
 * exclusive, in key order) and `commit` (a batch; a null value deletes).
 */
export class SqlStore {
  /** @param {SqlStorage} sql */
  constructor(sql) {
    this.sql = sql;
    sql.exec('CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID');
    /** The first commit that failed in the current core call: the call is rolled back whole. */
    this.failed = null;
  }

  /** @param {Uint8Array} key @returns {ArrayBuffer | null} */
  get(key) {
    const rows = this.sql.exec('SELECT v FROM kv WHERE k = ?', key).raw().toArray();
    return rows.length === 0 ? null : /** @type {ArrayBuffer} */ (rows[0][0]);
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
        i = j;
      }
    } catch (e) {
      // Some of the batch may be written: the object rolls the whole call back.
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
