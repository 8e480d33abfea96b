// Storages for the core: SQLite (the runtime's own, or better-sqlite3: sqlite.js) and in memory.
//
// The core needs get, ordered scan and an atomic batch commit, all
// synchronous. Keys are compared as bytes. The keys and values the core hands over are
// fresh Uint8Arrays of their own, so they are kept and bound as they are, never copied.

import { sqliteDriver } from './sqlite.js';
import SortedBTree from 'sorted-btree';
import fs from 'node:fs';
import path from 'node:path';

// sorted-btree is CommonJS with an ES-style default export.
const BTree = SortedBTree.default ?? SortedBTree;

/** A key as a string whose UTF-16 code units are its bytes: string order is byte order. */
function id(key) {
  return Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString('latin1');
}

/** In-memory storage: an ordered B+ tree (sorted-btree) keyed by the key's bytes, for tests and embedding. */
export class MemoryStorage {
  constructor() {
    /** @type {BTree<string, Uint8Array>} */
    this.tree = new BTree();
  }
  get(key) {
    return this.tree.get(id(key)) ?? null;
  }
  scan(start, end, limit) {
    const out = [];
    const hi = id(end);
    if (limit <= 0) return out;
    this.tree.forRange(id(start), hi, false, (k, v) => {
      out.push([Buffer.from(k, 'latin1'), v]);
      if (out.length >= limit) return { break: true };
      return undefined;
    });
    return out;
  }
  commit(writes) {
    for (const [key, value] of writes) {
      if (value === null) this.tree.delete(id(key));
      else this.tree.set(id(key), value instanceof Uint8Array ? value : Buffer.from(value));
    }
  }
  /** Number of keys. */
  get size() {
    return this.tree.size;
  }
}

/**
 * SQLite storage: WAL, synchronous=FULL, one transaction per commit (durable before it returns).
 *
 * It is `durable`: the host groups the commits of concurrent calls through the core's
 * group commit (the overlay lives in the core), which hands it one commit per group.
 */
export class SqliteStorage {
  /**
   * @param {string} file
   * @param {{exclusive?: boolean, driver?: string}} [opts] exclusive (the default): hold the database lock while open;
   *   driver: `node:sqlite`, `bun:sqlite` or `better-sqlite3` (default: the first the runtime offers, in that order but Bun's first)
   */
  constructor(file, { exclusive = true, driver } = {}) {
    const sqlite = sqliteDriver(driver);
    fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    // Created 0600 before SQLite opens it (SQLite gives its journal files the database's mode).
    fs.closeSync(fs.openSync(file, 'a', 0o600));
    // A relay that holds the database keeps it: waiting long for it only delays the error.
    this.db = sqlite.open(file);
    /** Which SQLite the runtime gave (`node:sqlite`, `bun:sqlite`, `better-sqlite3`). */
    this.driver = sqlite.name;
    try {
      this.db.exec('PRAGMA busy_timeout = 1000');
      // The relay is the database's only user (as in the wasmtime host): no lock calls per
      // read, the WAL index in the heap (set before WAL mode is entered), a second relay on
      // the same directory fails at start instead of interleaving, and reads go through a
      // memory map.
      if (exclusive) this.db.exec('PRAGMA locking_mode = EXCLUSIVE');
      this.db.exec('PRAGMA journal_mode = WAL');
      this.db.exec('PRAGMA synchronous = FULL');
      this.db.exec(`PRAGMA mmap_size = ${256 * 1024 * 1024}`);
      // Take the lock now, not at the first write.
      if (exclusive) this.db.exec('BEGIN EXCLUSIVE; COMMIT;');
    } catch (e) {
      this.db.close();
      if (/SQLITE_BUSY|SQLITE_LOCKED|database is locked/.test(`${e.code} ${e.message}`)) throw new Error(`${file}: ${e.message} (is another relay using it?)`);
      throw e;
    }
    /** Commits cost an fsync: the host groups them (core.js). */
    this.durable = true;
    this.db.exec('CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID');
    this.getStmt = this.db.prepare('SELECT v FROM kv WHERE k = ?');
    // No `LIMIT ?`: SQLite (3.46 and later) recompiles a statement every time a LIMIT
    // parameter is bound. Rows come in key order, so `rows` stops stepping at the limit.
    this.scanStmt = this.db.prepare('SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k');
    // A literal LIMIT is compiled once, unlike a bound one.
    this.firstStmt = this.db.prepare('SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT 1');
    this.putStmt = this.db.prepare('INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)');
    this.delStmt = this.db.prepare('DELETE FROM kv WHERE k = ?');
    /** Operations in the commit being made: the host sets it while the core flushes a group. */
    this.batch = 1;
    /**
     * Told of each durable commit: `(operations, seconds)`.
     * @type {((size: number, seconds: number) => void) | null}
     */
    this.onCommit = null;
    this.tx = this.db.transaction((writes) => {
      for (const [k, v] of writes) {
        if (v === null) this.delStmt.run(k);
        else this.putStmt.run(k, v);
      }
    });
  }
  get(key) {
    return this.getStmt.value(key) ?? null;
  }
  scan(start, end, limit) {
    return this.rows(start, end, limit);
  }
  /** The first `limit` stored rows with start <= key < end, in key order. */
  rows(start, end, limit) {
    if (limit <= 0) return [];
    // The engine's most frequent scan asks for one row (the next wake-up, twice per
    // operation): a single step, without an iterator.
    if (limit === 1) {
      const row = this.firstStmt.first(start, end);
      return row === undefined ? [] : [row];
    }
    const out = [];
    for (const row of this.scanStmt.rows(start, end)) {
      out.push(row);
      if (out.length >= limit) break;
    }
    return out;
  }
  commit(writes) {
    if (!this.onCommit || writes.length === 0) return this.tx(writes);
    const started = performance.now();
    this.tx(writes);
    return this.onCommit(this.batch, (performance.now() - started) / 1000);
  }
  /** Whether the database is open. */
  get isOpen() {
    return this.db.isOpen();
  }
  /**
   * Copies the database to `file` with SQLite's online backup API while the relay runs.
   * Writes through this connection during the copy are carried into it as they commit, so
   * the copy holds exactly the transactions committed when it ends (a group still open is
   * not in it: its callers have no answer yet). The copy is made in `FILE.partial` (created
   * 0600), made one self-contained file (journal mode DELETE), synced, and renamed over
   * `file`, so `file` is never half-written; as the wasmtime host does.
   * @param {string} file
   * @returns {Promise<{path: string, bytes: number}>}
   */
  async backup(file) {
    const partial = `${file}.partial`;
    fs.rmSync(partial, { force: true });
    fs.closeSync(fs.openSync(partial, 'wx', 0o600));
    try {
      await this.db.backup(partial);
      const copy = sqliteDriver(this.driver).open(partial);
      try {
        copy.exec('PRAGMA journal_mode = DELETE');
      } finally {
        copy.close();
      }
      const fd = fs.openSync(partial, 'r+');
      try {
        fs.fsyncSync(fd);
      } finally {
        fs.closeSync(fd);
      }
      fs.renameSync(partial, file);
      const dir = fs.openSync(path.dirname(file), 'r');
      try {
        fs.fsyncSync(dir);
      } finally {
        fs.closeSync(dir);
      }
      return { path: file, bytes: fs.statSync(file).size };
    } catch (e) {
      fs.rmSync(partial, { force: true });
      throw e;
    }
  }
  close() {
    this.db.close();
  }
}
