//! One operation's transaction: reads see its own writes; commit is all or nothing.

use super::storage::{Entry, Storage, StorageError};
use serde::{de::DeserializeOwned, Serialize};
use std::collections::BTreeMap;

/// Pending writes over a store.
pub(crate) struct Txn<'s, S: Storage> {
    store: &'s mut S,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl<'s, S: Storage> Txn<'s, S> {
    pub(crate) fn new(store: &'s mut S) -> Txn<'s, S> {
        Txn {
            store,
            writes: BTreeMap::new(),
        }
    }

    pub(crate) fn get_raw(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.store.get(key),
        }
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

    pub(crate) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    /// Stores a record.
    pub(crate) fn put<T: Serialize>(&mut self, key: Vec<u8>, value: &T) {
        // Records are plain structs of strings and integers: serialization cannot fail.
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        self.put_raw(key, bytes);
    }

    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        self.writes.insert(key, None);
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
        let base = self.store.scan(start, end, limit.saturating_add(deletes))?;
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
