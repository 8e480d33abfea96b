//! Group commit: the writes of several operations become one durable transaction.
//!
//! One mechanism for every host: the wasmtime host wraps its SQLite store in it
//! below the component's storage import, and the JS binding wraps the JS storage
//! in it inside the wasm module, so neither host keeps an overlay of its own.
//!
//! While a group is open, each operation's commit lands in an overlay that
//! later operations read through (so they see earlier operations' writes),
//! and nothing reaches the disk. [`Grouped::flush`] writes the overlay in one
//! SQLite transaction, one fsync for the whole group. The caller releases
//! the group's answers and effects only after `flush` returned `Ok`; if it
//! fails, the overlay is dropped, so every operation of the group is undone
//! together and each answers as not accepted.

use super::storage::{Entry, Storage, StorageError, Write};
use std::collections::{BTreeMap, HashMap};

/// A store whose commits can be grouped.
pub struct Grouped<S: Storage> {
    inner: S,
    overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// What reads of the store returned while the group is open. Nothing writes the
    /// store then (commits land in the overlay), so these stay exact until `flush`.
    read: HashMap<Vec<u8>, Option<Vec<u8>>>,
    open: bool,
}

impl<S: Storage> Grouped<S> {
    /// `inner`, with no group open (every commit goes straight through).
    pub fn new(inner: S) -> Grouped<S> {
        Grouped {
            inner,
            overlay: BTreeMap::new(),
            read: HashMap::new(),
            open: false,
        }
    }

    /// Opens a group: commits from now on wait for [`Grouped::flush`].
    pub fn begin(&mut self) {
        self.open = true;
    }

    /// Whether the open group holds writes (its flush will be a transaction).
    pub fn has_writes(&self) -> bool {
        !self.overlay.is_empty()
    }

    /// The store under the groups; only while no group holds writes.
    pub fn inner(&self) -> Option<&S> {
        self.overlay.is_empty().then_some(&self.inner)
    }

    /// Commits the group's writes in one transaction and closes the group; on error they are gone.
    pub fn flush(&mut self) -> Result<(), StorageError> {
        self.open = false;
        self.read.clear();
        if self.overlay.is_empty() {
            return Ok(());
        }
        let writes: Vec<Write> = std::mem::take(&mut self.overlay).into_iter().collect();
        self.inner.commit(writes)
    }
}

impl<S: Storage> Storage for Grouped<S> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(v) = self.overlay.get(key) {
            return Ok(v.clone());
        }
        if !self.open {
            return self.inner.get(key);
        }
        // The operations of a group read the same few records (the recipient's account,
        // route and devices, for every send to it): the store answers each key once.
        if let Some(v) = self.read.get(key) {
            return Ok(v.clone());
        }
        let v = self.inner.get(key)?;
        self.read.insert(key.to_vec(), v.clone());
        Ok(v)
    }

    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        if start >= end || limit == 0 {
            return Ok(Vec::new());
        }
        let mut mine = self.overlay.range(start.to_vec()..end.to_vec()).peekable();
        if mine.peek().is_none() {
            return self.inner.scan(start, end, limit);
        }
        // Two ordered streams merged until `limit`: the group's writes in range (a deletion
        // hides the stored row of its key) and the stored rows, read `limit` at a time. Each
        // operation asks for the first due or expiring key, and every send of a group writes
        // one of the latter: collecting the whole range per scan made a group's cost grow
        // with its square.
        let mut out = Vec::new();
        let mut stored = std::collections::VecDeque::new();
        let mut from = start.to_vec();
        let mut stored_done = false;
        while out.len() < limit {
            if stored.is_empty() && !stored_done {
                let rows = self.inner.scan(&from, end, limit)?;
                stored_done = rows.len() < limit;
                if let Some((last, _)) = rows.last() {
                    // The next read starts just after the last key (its successor in byte order).
                    from = last.clone();
                    from.push(0);
                }
                stored.extend(rows);
            }
            let take_mine = match (mine.peek(), stored.front()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((k, _)), Some((d, _))) => match k.as_slice().cmp(d.as_slice()) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Greater => false,
                    std::cmp::Ordering::Equal => {
                        // The group's write of this key replaces the stored row.
                        stored.pop_front();
                        true
                    }
                },
            };
            if take_mine {
                if let Some((k, Some(v))) = mine.next() {
                    out.push((k.clone(), v.clone()));
                }
            } else if let Some(row) = stored.pop_front() {
                out.push(row);
            }
        }
        Ok(out)
    }

    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        if !self.open {
            return self.inner.commit(batch);
        }
        for (k, v) in batch {
            self.overlay.insert(k, v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::MemoryStore;

    /// A store whose commits fail on request, to undo a group.
    struct Failing(MemoryStore, bool);

    impl Storage for Failing {
        fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
            self.0.get(key)
        }
        fn scan(&mut self, s: &[u8], e: &[u8], l: usize) -> Result<Vec<Entry>, StorageError> {
            self.0.scan(s, e, l)
        }
        fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
            if self.1 {
                return Err(StorageError("disk full".into()));
            }
            self.0.commit(batch)
        }
    }

    fn put(k: &str, v: &str) -> Write {
        (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()))
    }

    #[test]
    fn reads_in_a_group_see_earlier_commits_and_the_disk_sees_them_only_after_flush() {
        let mem = MemoryStore::new();
        let mut g = Grouped::new(mem.clone());
        g.commit(vec![put("a", "1"), put("c", "3")]).unwrap();
        g.begin();
        g.commit(vec![put("b", "2"), (b"c".to_vec(), None)])
            .unwrap();
        assert_eq!(g.get(b"b").unwrap(), Some(b"2".to_vec()));
        assert_eq!(g.get(b"c").unwrap(), None);
        let keys: Vec<Vec<u8>> = g
            .scan(b"a", b"z", 2)
            .unwrap()
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(mem.len(), 2, "nothing reaches the store before flush");
        g.flush().unwrap();
        assert_eq!(mem.len(), 2);
        assert_eq!(mem.snapshot().get(b"b".as_slice()), Some(&b"2".to_vec()));
        assert!(!mem.snapshot().contains_key(b"c".as_slice()));
    }

    #[test]
    fn a_failed_flush_undoes_the_whole_group() {
        let mut g = Grouped::new(Failing(MemoryStore::new(), false));
        g.commit(vec![put("a", "1")]).unwrap();
        g.begin();
        g.commit(vec![put("b", "2")]).unwrap();
        g.commit(vec![(b"a".to_vec(), None)]).unwrap();
        g.inner.1 = true;
        assert!(g.flush().is_err());
        g.inner.1 = false;
        assert_eq!(g.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(g.get(b"b").unwrap(), None);
    }

    /// A store that counts the reads that reach it.
    struct Counting(MemoryStore, usize);

    impl Storage for Counting {
        fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
            self.1 += 1;
            self.0.get(key)
        }
        fn scan(&mut self, s: &[u8], e: &[u8], l: usize) -> Result<Vec<Entry>, StorageError> {
            self.0.scan(s, e, l)
        }
        fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
            self.0.commit(batch)
        }
    }

    #[test]
    fn a_group_reads_each_key_from_the_store_once_and_sees_its_own_writes_over_it() {
        let mut g = Grouped::new(Counting(MemoryStore::new(), 0));
        g.commit(vec![put("a", "1")]).unwrap();
        g.begin();
        for _ in 0..3 {
            assert_eq!(g.get(b"a").unwrap(), Some(b"1".to_vec()));
            assert_eq!(g.get(b"missing").unwrap(), None);
        }
        assert_eq!(g.inner.1, 2, "one store read per key, absent keys included");
        g.commit(vec![put("a", "2"), put("missing", "3")]).unwrap();
        assert_eq!(g.get(b"a").unwrap(), Some(b"2".to_vec()));
        assert_eq!(g.get(b"missing").unwrap(), Some(b"3".to_vec()));
        g.flush().unwrap();
        // Outside a group every read goes to the store, which now holds the group's writes.
        g.inner.0.commit(vec![put("a", "4")]).unwrap();
        assert_eq!(g.get(b"a").unwrap(), Some(b"4".to_vec()));
        assert_eq!(g.inner.1, 3);
        // A new group forgets what the last one read.
        g.begin();
        assert_eq!(g.get(b"a").unwrap(), Some(b"4".to_vec()));
        assert_eq!(g.inner.1, 4);
    }

    /// Reads through groups agree with a plain store, over many deletes and small limits.
    #[test]
    fn merged_scans_agree_with_a_plain_store() {
        let mut g = Grouped::new(MemoryStore::new());
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
    }
}
