// The SQLite the runtime offers, behind the few calls SqliteStorage makes.
//
// Picked in order, so that installing the package compiles nothing on any runtime:
// `bun:sqlite` on Bun; `node:sqlite` where the runtime has it without a flag (Node 22.13 and
// later, Deno 2.2 and later); else `better-sqlite3` when the user installed it (an optional
// peer dependency: on Node 20, which has no `node:sqlite`, it is the one way to disk storage);
// else an Error that names the fix. `storage: 'memory'` needs none of them.

import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

/** The driver names, in the order they are tried. */
export const DRIVERS = /** @type {const} */ (['bun:sqlite', 'node:sqlite', 'better-sqlite3']);

/**
 * A statement over `(k, v)` rows: the value of the first row, the first row, every row (in
 * order, lazily), or a write.
 * @typedef {object} Statement
 * @property {(...args: unknown[]) => Uint8Array | undefined} value
 * @property {(...args: unknown[]) => [Uint8Array, Uint8Array] | undefined} first
 * @property {(...args: unknown[]) => Iterable<[Uint8Array, Uint8Array]>} rows
 * @property {(...args: unknown[]) => void} run
 */

/**
 * An open database.
 * @typedef {object} Database
 * @property {string} driver which driver opened it
 * @property {(sql: string) => void} exec
 * @property {(sql: string) => Statement} prepare
 * @property {<A extends unknown[]>(f: (...args: A) => void) => (...args: A) => void} transaction
 * @property {(file: string) => Promise<void>} backup copies the database into `file` (which exists, empty) while it is in use
 * @property {() => boolean} isOpen
 * @property {() => void} close
 */

/**
 * The driver the runtime offers, or why there is none.
 * @param {string} [wanted] a name of `DRIVERS` to insist on (default: the first available)
 * @returns {{name: string, open: (file: string) => Database}}
 */
export function sqliteDriver(wanted) {
  const tried = [];
  for (const name of wanted ? [wanted] : DRIVERS) {
    if (!DRIVERS.includes(/** @type {any} */ (name))) throw new Error(`unknown SQLite driver ${name}: one of ${DRIVERS.join(', ')}`);
    if (name === 'bun:sqlite' && !('Bun' in globalThis)) {
      tried.push('bun:sqlite (not Bun)');
      continue;
    }
    let mod;
    try {
      mod = require(name);
    } catch (e) {
      tried.push(`${name} (${e.code ?? e.message})`);
      continue;
    }
    const open = name === 'better-sqlite3' ? betterSqlite3(mod) : name === 'node:sqlite' ? nodeSqlite(mod) : bunSqlite(mod);
    return { name, open };
  }
  const node = typeof process !== 'undefined' && process.versions?.node;
  throw new Error(
    `disk storage needs SQLite, and this runtime offers none (tried ${tried.join(', ')}). ` +
      `Node ${node ?? '?'}: node:sqlite comes with Node 22.13 and later; on Node 20 install the optional ` +
      `better-sqlite3 (npm install better-sqlite3@12; it compiles from source where no prebuilt binary reaches you). ` +
      `Deno 2.2+ and Bun have SQLite built in. Or use storage: 'memory'.`,
  );
}

/** better-sqlite3: rows as arrays (`raw`), single values (`pluck`), its own transactions and online backup. */
function betterSqlite3(Database) {
  return (file) => {
    const db = new Database(file);
    return {
      driver: 'better-sqlite3',
      exec: (sql) => db.exec(sql),
      prepare(sql) {
        const reads = /^\s*select/i.test(sql);
        const rows = reads ? db.prepare(sql).raw() : null;
        const one = reads ? db.prepare(sql).pluck() : null;
        const write = reads ? null : db.prepare(sql);
        return {
          value: (...a) => one.get(...a),
          first: (...a) => rows.get(...a),
          rows: (...a) => rows.iterate(...a),
          run: (...a) => void write.run(...a),
        };
      },
      transaction: (f) => db.transaction(f),
      // Large steps: few turns of the event loop between them; commits may run in between.
      backup: async (to) => void (await db.backup(to, { progress: () => 4096 })),
      isOpen: () => db.open,
      close: () => db.close(),
    };
  };
}

/** node:sqlite (Node 22.13+, Deno 2.2+): `DatabaseSync`, rows as objects unless arrays are offered. */
function nodeSqlite({ DatabaseSync, backup }) {
  // Node 22's node:sqlite binds an empty Uint8Array without a backing store (TextEncoder's,
  // or one copied out of wasm) as NULL, so `k >= ?` with an empty start matched nothing: an
  // empty key is bound as this one instead (test/sqlite.test.js).
  const EMPTY_KEY = new Uint8Array(0);
  const args = (a) => a.map((x) => (x instanceof Uint8Array && x.byteLength === 0 ? EMPTY_KEY : x));
  return (file) => {
    const db = new DatabaseSync(file);
    let open = true;
    return {
      driver: 'node:sqlite',
      exec: (sql) => db.exec(sql),
      prepare(sql) {
        const s = db.prepare(sql);
        const arrays = typeof s.setReturnArrays === 'function';
        if (arrays) s.setReturnArrays(true);
        const pair = arrays ? (r) => r : (r) => Object.values(r);
        return {
          value: (...a) => {
            const r = s.get(...args(a));
            return r === undefined ? undefined : pair(r)[0];
          },
          first: (...a) => {
            const r = s.get(...args(a));
            return r === undefined ? undefined : pair(r);
          },
          *rows(...a) {
            for (const r of s.iterate(...args(a))) yield pair(r);
          },
          run: (...a) => void s.run(...args(a)),
        };
      },
      transaction: (f) => manualTransaction(db, f),
      // The online backup where the runtime has it (Node 22.16+), else VACUUM INTO (Deno).
      backup: async (to) => {
        if (typeof backup === 'function') await backup(db, to, { rate: 4096 });
        else db.prepare('VACUUM INTO ?').run(to);
      },
      isOpen: () => open && (db.isOpen ?? true),
      close: () => {
        open = false;
        db.close();
      },
    };
  };
}

/** bun:sqlite: rows as arrays (`values`) or objects (`iterate`), its own transactions, no online backup (VACUUM INTO instead). */
function bunSqlite({ Database }) {
  return (file) => {
    const db = new Database(file);
    let open = true;
    // Bun's close defers while a statement is alive (its lock with it): they are finalized first.
    const statements = [];
    return {
      driver: 'bun:sqlite',
      exec: (sql) => db.exec(sql),
      prepare(sql) {
        const s = db.prepare(sql);
        statements.push(s);
        return {
          // `values` gives rows as arrays.
          value: (...a) => s.values(...a)[0]?.[0],
          first: (...a) => s.values(...a)[0],
          *rows(...a) {
            for (const r of s.iterate(...a)) yield Object.values(r);
          },
          run: (...a) => void s.run(...a),
        };
      },
      transaction: (f) => db.transaction(f),
      backup: async (to) => void db.prepare('VACUUM INTO ?').run(to),
      isOpen: () => open,
      close: () => {
        open = false;
        for (const s of statements) s.finalize();
        db.close();
      },
    };
  };
}

/** A transaction by hand (node:sqlite has no helper): all of `f`'s writes, or none of them. */
function manualTransaction(db, f) {
  return (...args) => {
    db.exec('BEGIN');
    try {
      f(...args);
    } catch (e) {
      db.exec('ROLLBACK');
      throw e;
    }
    try {
      db.exec('COMMIT');
    } catch (e) {
      // A commit that failed (busy, I/O) may leave the transaction open: end it, none applied.
      try {
        db.exec('ROLLBACK');
      } catch {
        // already rolled back by SQLite
      }
      throw e;
    }
  };
}
