//! Storage for the core: SQLite (WAL, synchronous=FULL) by default, in memory on request.

use relay_core::engine::storage::{Entry, Write};
use relay_core::engine::{MemoryStore, Storage, StorageError};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes of the database file read through a memory map.
const MMAP_SIZE: i64 = 256 << 20;

/// A range of keys in order; the caller stops stepping at its limit.
const SCAN: &str = "SELECT k, v FROM kv WHERE k >= ?1 AND k < ?2 ORDER BY k";

/// SQLite key-value storage: one table, one transaction per commit, durable before it returns.
pub struct SqliteStore {
    conn: Connection,
}

fn err(e: rusqlite::Error) -> StorageError {
    StorageError(e.to_string())
}

impl SqliteStore {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore, StorageError> {
        // Created 0600 before SQLite opens it: SQLite gives its -wal and -shm files the
        // database file's mode, so every file of the store is its owner's only.
        private_file(path, false).map_err(|e| StorageError(format!("{}: {e}", path.display())))?;
        let conn = Connection::open(path).map_err(err)?;
        // A relay that holds the database keeps it: waiting long for it only delays the error.
        conn.busy_timeout(std::time::Duration::from_secs(1))
            .map_err(err)?;
        Self::setup(&conn).map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StorageError(format!(
                    "{}: {e} (is another relay using it?)",
                    path.display()
                ))
            }
            _ => err(e),
        })?;
        Ok(SqliteStore { conn })
    }

    fn setup(conn: &Connection) -> rusqlite::Result<()> {
        // The relay is the database's only user: holding the lock for the connection's
        // life spares two fcntl calls per read, keeps the WAL index in the heap (set
        // before WAL mode is entered), and makes a second relay on the same data
        // directory fail at start instead of interleaving. Reads through a memory map
        // spare a pread per page missed in SQLite's cache. Together +20-30% HTTP sends
        // per second (docs/performance.md).
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // An answer that says accepted must survive power loss: fsync on every commit.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
        // Take the lock now, not at the first write.
        conn.execute_batch(
            "BEGIN EXCLUSIVE; COMMIT;
             CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;",
        )
    }
}

impl SqliteStore {
    /// Copies the database as it stands (every committed transaction, nothing else) to
    /// `path` with SQLite's online backup API, over this connection (which holds the
    /// database's exclusive lock, so no other process could read it). The copy is written
    /// beside `path` with mode 0600, made a plain rollback-journal database (one file,
    /// no WAL), synced, then renamed over `path`; the bytes written.
    pub fn backup_to(&self, path: &Path) -> Result<u64, String> {
        let name = path
            .file_name()
            .ok_or_else(|| format!("{}: not a file name", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut partial_name = name.to_os_string();
        partial_name.push(".partial");
        let partial = dir.join(partial_name);
        let _ = std::fs::remove_file(&partial);
        let result = Self::copy_into(&self.conn, &partial).and_then(|bytes| {
            std::fs::rename(&partial, path).map_err(|e| {
                format!("renaming {} to {}: {e}", partial.display(), path.display())
            })?;
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(bytes)
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        result
    }

    fn copy_into(conn: &Connection, partial: &Path) -> Result<u64, String> {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", partial.display());
        private_file(partial, true).map_err(|e| at(&e))?;
        let mut dst = Connection::open(partial).map_err(|e| at(&e))?;
        {
            let backup = rusqlite::backup::Backup::new(conn, &mut dst).map_err(|e| at(&e))?;
            // All pages in one step: the caller runs between commit groups, so nothing
            // writes the database meanwhile and the copy is one consistent state.
            match backup.step(-1).map_err(|e| at(&e))? {
                rusqlite::backup::StepResult::Done => {}
                other => return Err(at(&format!("the backup did not finish ({other:?})"))),
            }
        }
        // The copy carries the source's WAL flag: make it one self-contained file.
        dst.pragma_update(None, "journal_mode", "DELETE")
            .map_err(|e| at(&e))?;
        drop(dst);
        let f = std::fs::File::open(partial).map_err(|e| at(&e))?;
        f.sync_all().map_err(|e| at(&e))?;
        Ok(f.metadata().map_err(|e| at(&e))?.len())
    }
}

impl Storage for SqliteStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT v FROM kv WHERE k = ?1")
            .map_err(err)?;
        st.query_row(params![key], |r| r.get::<_, Vec<u8>>(0))
            .optional()
            .map_err(err)
    }

    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        // No `LIMIT ?`: SQLite (3.46 and later) recompiles a statement whenever a LIMIT
        // parameter is bound, which was every scan. Rows come in key order from the
        // primary key, so stepping stops after `limit` without reading further.
        let mut st = self.conn.prepare_cached(SCAN).map_err(err)?;
        let rows = st
            .query_map(params![start, end], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
            })
            .map_err(err)?;
        rows.take(limit).collect::<Result<Vec<_>, _>>().map_err(err)
    }

    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut put = tx
                .prepare_cached("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)")
                .map_err(err)?;
            let mut del = tx
                .prepare_cached("DELETE FROM kv WHERE k = ?1")
                .map_err(err)?;
            for (k, v) in &batch {
                match v {
                    Some(v) => put.execute(params![k, v]).map_err(err)?,
                    None => del.execute(params![k]).map_err(err)?,
                };
            }
        }
        tx.commit().map_err(err)
    }
}

/// Either storage behind one type.
pub enum AnyStore {
    Sqlite(SqliteStore),
    Memory(MemoryStore),
    /// A store with faults on request (tests).
    Faulty(Box<AnyStore>, std::sync::Arc<Faults>),
}

/// Faults switched on and off while a relay runs (`Settings::faults`, for tests of how the
/// host recovers): reads or commits of the storage fail, or every tick traps.
#[derive(Debug, Default)]
pub struct Faults {
    /// Every `get` and `scan` fails.
    pub fail_reads: AtomicBool,
    /// Every commit fails (a group commit is undone).
    pub fail_commits: AtomicBool,
    /// Every tick traps (its epoch deadline has passed before it starts).
    pub trap_ticks: AtomicBool,
}

impl Faults {
    fn on(flag: &AtomicBool) -> bool {
        flag.load(Ordering::Relaxed)
    }
}

impl AnyStore {
    /// The store under any fault injection.
    pub fn base(&self) -> &AnyStore {
        match self {
            AnyStore::Faulty(s, _) => s.base(),
            s => s,
        }
    }
}

impl Storage for AnyStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self {
            AnyStore::Sqlite(s) => s.get(key),
            AnyStore::Memory(s) => s.get(key),
            AnyStore::Faulty(_, f) if Faults::on(&f.fail_reads) => {
                Err(StorageError("injected read fault".into()))
            }
            AnyStore::Faulty(s, _) => s.get(key),
        }
    }
    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        match self {
            AnyStore::Sqlite(s) => s.scan(start, end, limit),
            AnyStore::Memory(s) => s.scan(start, end, limit),
            AnyStore::Faulty(_, f) if Faults::on(&f.fail_reads) => {
                Err(StorageError("injected read fault".into()))
            }
            AnyStore::Faulty(s, _) => s.scan(start, end, limit),
        }
    }
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        match self {
            AnyStore::Sqlite(s) => s.commit(batch),
            AnyStore::Memory(s) => s.commit(batch),
            AnyStore::Faulty(_, f) if Faults::on(&f.fail_commits) => {
                Err(StorageError("injected commit fault".into()))
            }
            AnyStore::Faulty(s, _) => s.commit(batch),
        }
    }
}

/// Opens `path` for writing, its owner's only (mode 0600 on Unix): a new file when `new`
/// (failing if it exists), else the file as it is, made if missing.
pub fn private_file(path: &Path, new: bool) -> std::io::Result<std::fs::File> {
    let mut open = std::fs::OpenOptions::new();
    if new {
        open.write(true).create_new(true);
    } else {
        open.append(true).create(true);
    }
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    open.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_core::engine::group::Grouped;

    #[test]
    fn a_second_store_on_the_same_database_is_refused() {
        let dir = std::env::temp_dir().join(format!("relay-store-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("relay.sqlite");
        let _first = SqliteStore::open(&file).expect("first open");
        let second = SqliteStore::open(&file);
        let Err(e) = second else {
            panic!("a second store opened the same database");
        };
        assert!(e.0.contains("another relay"), "{}", e.0);
        drop(_first);
        SqliteStore::open(&file).expect("open again once the first is closed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A scan is compiled once: no parameter of it makes SQLite recompile it per call.
    #[test]
    fn scans_and_reads_reuse_their_compiled_statements() {
        let dir = std::env::temp_dir().join(format!("relay-store-stmt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let mut s = SqliteStore::open(&dir.join("relay.sqlite")).expect("open");
        for i in 0..200u32 {
            s.commit(vec![(i.to_be_bytes().to_vec(), Some(vec![7u8; 64]))])
                .expect("commit");
            let from = i.saturating_sub(5).to_be_bytes();
            let got = s
                .scan(&from, &(i + 1).to_be_bytes(), 1 + (i as usize % 3))
                .expect("scan");
            assert_eq!(got.len(), (1 + i as usize % 3).min(i as usize + 1).min(6));
            assert_eq!(
                got[0].0,
                from.to_vec(),
                "scans start at the first key in range"
            );
            assert!(s.get(&i.to_be_bytes()).expect("get").is_some());
        }
        for sql in [SCAN, "SELECT v FROM kv WHERE k = ?1"] {
            let st = s.conn.prepare_cached(sql).expect("cached");
            assert_eq!(st.get_status(rusqlite::StatementStatus::Run), 200, "{sql}");
            assert_eq!(
                st.get_status(rusqlite::StatementStatus::RePrepare),
                0,
                "{sql} was recompiled"
            );
        }
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_backup_holds_every_committed_write_wal_included() {
        let dir = std::env::temp_dir().join(format!("relay-store-backup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let mut s = SqliteStore::open(&dir.join("relay.sqlite")).expect("open");
        for i in 0..3000u32 {
            s.commit(vec![(i.to_be_bytes().to_vec(), Some(vec![7u8; 300]))])
                .expect("commit");
        }
        let file = dir.join("copy.sqlite");
        s.backup_to(&file).expect("backup");
        let copy = Connection::open(&file).unwrap();
        let n: u32 = copy
            .query_row("SELECT count(*) FROM kv", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3000);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!dir.join("copy.sqlite.partial").exists());
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The core's group commit over SQLite agrees with a plain store.
    #[test]
    fn reads_through_groups_agree_with_a_plain_store_deletes_and_limits_included() {
        // The grouped store over SQLite, against a MemoryStore given the same writes directly.
        let dir = std::env::temp_dir().join(format!("relay-group-model-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let sqlite = SqliteStore::open(&dir.join("relay.sqlite")).expect("open");
        let mut g = Grouped::new(sqlite);
        let mut model = MemoryStore::new();
        // xorshift32: deterministic, so a failure replays.
        fn rnd(seed: &mut u32, n: u32) -> u32 {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 17;
            *seed ^= *seed << 5;
            *seed % n
        }
        // Keys share prefixes and include a byte above 0x7f: order is byte order.
        fn key(seed: &mut u32) -> Vec<u8> {
            let c = [0x2f, 0xe9][rnd(seed, 2) as usize];
            vec![b'a' + rnd(seed, 3) as u8, c, b'0' + rnd(seed, 10) as u8]
        }
        let mut seed = 7u32;
        let mut multi_row = 0;
        for round in 0..40 {
            g.begin();
            for op in 0..25 {
                let k = key(&mut seed);
                let v = (rnd(&mut seed, 4) != 0).then(|| format!("v{round}.{op}").into_bytes());
                g.commit(vec![(k.clone(), v.clone())]).unwrap();
                model.commit(vec![(k, v)]).unwrap();
                let (mut a, mut b) = (key(&mut seed), key(&mut seed));
                if a > b {
                    std::mem::swap(&mut a, &mut b);
                }
                let limit = 1 + rnd(&mut seed, 6) as usize;
                let want = model.scan(&a, &b, limit).unwrap();
                assert_eq!(
                    g.scan(&a, &b, limit).unwrap(),
                    want,
                    "scan {a:?}..{b:?} limit {limit}"
                );
                multi_row += usize::from(want.len() > 1);
                let k = key(&mut seed);
                assert_eq!(g.get(&k).unwrap(), model.get(&k).unwrap(), "get {k:?}");
            }
            g.flush().unwrap();
        }
        assert!(
            multi_row > 100,
            "only {multi_row} scans returned more than one row"
        );
        drop(g);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
