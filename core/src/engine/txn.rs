//! One operation's transaction: reads see its own writes; commit is all or nothing.

use super::storage::{Entry, Storage, StorageError};
use serde::{de::DeserializeOwned, Serialize};
use std::collections::BTreeMap;

/// Pending writes over a store.
pub(crate) struct Txn<'s, S: Storage> {
    store: &'s mut S,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Keys the store is known not to hold (a few per operation at most): deleting one
    /// drops its pending write instead of writing a delete.
    absent: Vec<Vec<u8>>,
    /// Whether the store itself failed a read (a fault that may pass), as opposed to a
    /// record that could not be decoded (which stays bad).
    store_failed: bool,
}

impl<'s, S: Storage> Txn<'s, S> {
    pub(crate) fn new(store: &'s mut S) -> Txn<'s, S> {
        Txn {
            store,
            writes: BTreeMap::new(),
            absent: Vec::new(),
            store_failed: false,
        }
    }

    pub(crate) fn get_raw(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.store_get(key),
        }
    }

    /// Whether `key` is absent; when the store itself lacks it, deleting it later in this
    /// transaction writes nothing (the store does not change under a transaction).
    pub(crate) fn is_absent(&mut self, key: &[u8]) -> Result<bool, StorageError> {
        if let Some(v) = self.writes.get(key) {
            return Ok(v.is_none());
        }
        let absent = self.store_get(key)?.is_none();
        if absent {
            self.absent.push(key.to_vec());
        }
        Ok(absent)
    }

    /// A stored record, decoded.
    pub(crate) fn get<T: DeserializeOwned>(
        &mut self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        match self.get_raw(key)? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                StorageError(format!(
                    "corrupt record {}: {e}",
                    String::from_utf8_lossy(key)
                ))
            }),
            None => Ok(None),
        }
    }

    fn store_get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.store
            .get(key)
            .inspect_err(|_| self.store_failed = true)
    }

    /// Whether a read of the store failed in this transaction.
    pub(crate) fn store_failed(&self) -> bool {
        self.store_failed
    }

    pub(crate) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    /// Stores a key the caller knows the store does not hold (a key of an id this operation
    /// made sure is new), so that deleting it later in the transaction writes nothing.
    pub(crate) fn put_new(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.absent.push(key.clone());
        self.writes.insert(key, Some(value));
    }

    /// Stores a record.
    pub(crate) fn put<T: Serialize>(&mut self, key: Vec<u8>, value: &T) {
        // Records are plain structs of strings and integers: serialization cannot fail.
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        self.put_raw(key, bytes);
    }

    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        if self.absent.contains(&key) {
            self.writes.remove(&key);
        } else {
            self.writes.insert(key, None);
        }
    }

    /// Up to `limit` entries in `[start, end)`, this transaction's writes applied.
    pub(crate) fn scan(
        &mut self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        let overlay: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .writes
            .range(start.to_vec()..end.to_vec())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let deletes = overlay.iter().filter(|(_, v)| v.is_none()).count();
        let base = self
            .store
            .scan(start, end, limit.saturating_add(deletes))
            .inspect_err(|_| self.store_failed = true)?;
        if overlay.is_empty() {
            return Ok(base);
        }
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = base.into_iter().collect();
        for (k, v) in overlay {
            match v {
                Some(v) => merged.insert(k, v),
                None => merged.remove(&k),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    /// Commits every write, or none, and hands back the store.
    pub(crate) fn commit_returning_store(self) -> Result<&'s mut S, StorageError> {
        if !self.writes.is_empty() {
            self.store.commit(self.writes.into_iter().collect())?;
        }
        Ok(self.store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::storage::{MemoryStore, Write};

    /// A memory store that keeps every batch it was asked to commit.
    #[derive(Default)]
    struct Recorded {
        inner: MemoryStore,
        batches: Vec<Vec<Write>>,
    }

    impl Storage for Recorded {
        fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
            self.inner.get(key)
        }
        fn scan(&mut self, s: &[u8], e: &[u8], n: usize) -> Result<Vec<Entry>, StorageError> {
            self.inner.scan(s, e, n)
        }
        fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
            self.batches.push(batch.clone());
            self.inner.commit(batch)
        }
    }

    fn stored(pairs: &[(&str, &str)]) -> Recorded {
        let mut r = Recorded::default();
        let batch = pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec())))
            .collect();
        r.inner.commit(batch).unwrap();
        r
    }

    fn key(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn a_key_known_absent_and_left_absent_writes_nothing() {
        let mut store = stored(&[("a", "1")]);
        let mut t = Txn::new(&mut store);
        assert!(t.is_absent(b"missing").unwrap());
        t.delete(key("missing"));
        assert!(!t.is_absent(b"a").unwrap());
        t.put_new(key("made"), b"x".to_vec());
        t.put_raw(key("made"), b"y".to_vec());
        assert_eq!(t.get_raw(b"made").unwrap(), Some(b"y".to_vec()));
        assert_eq!(t.scan(b"a", b"z", 10).unwrap().len(), 2);
        t.delete(key("made"));
        assert_eq!(t.scan(b"a", b"z", 10).unwrap(), vec![(key("a"), key("1"))]);
        t.commit_returning_store().unwrap();
        assert!(store.batches.is_empty(), "{:?}", store.batches);
    }

    #[test]
    fn deletes_of_keys_the_store_may_hold_are_written() {
        let mut store = stored(&[("a", "1"), ("b", "2")]);
        let mut t = Txn::new(&mut store);
        t.delete(key("a"));
        assert_eq!(t.get_raw(b"b").unwrap(), Some(key("2")));
        t.delete(key("b"));
        t.delete(key("never-read"));
        assert_eq!(t.get_raw(b"gone").unwrap(), None);
        t.put_raw(key("gone"), key("3"));
        t.put_raw(key("new"), key("4"));
        assert!(!t.is_absent(b"new").unwrap(), "a pending write counts");
        t.delete(key("new"));
        t.commit_returning_store().unwrap();
        assert_eq!(
            store.batches,
            vec![vec![
                (key("a"), None),
                (key("b"), None),
                (key("gone"), Some(key("3"))),
                (key("never-read"), None),
                (key("new"), None),
            ]]
        );
        assert_eq!(store.inner.len(), 1);
    }
}
