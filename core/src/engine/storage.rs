//! The host's storage as the engine sees it: get, ordered scan, atomic batch commit.
//!
//! Hosts implement [`Storage`] over SQLite, IndexedDB, a KV service, or
//! anything else with atomic batches. [`MemoryStore`] is the in-memory
//! implementation for tests and embedding.

use std::collections::BTreeMap;
use std::fmt;

/// A storage failure; the operation that met it commits nothing and answers `internal`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageError(pub String);

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "storage: {}", self.0)
    }
}

impl std::error::Error for StorageError {}

impl From<StorageError> for crate::Error {
    fn from(e: StorageError) -> crate::Error {
        crate::Error::new(crate::ErrorCode::Internal, e.to_string())
    }
}

/// One key-value pair of a scan.
pub type Entry = (Vec<u8>, Vec<u8>);

/// One write of a batch: `Some(value)` puts, `None` deletes.
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// A transactional ordered key-value store.
pub trait Storage {
    /// The value at `key`.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// Up to `limit` entries with `start <= key < end`, in key order.
    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError>;
    /// Applies every write or none, durably, before returning `Ok`.
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError>;
}

impl<S: Storage + ?Sized> Storage for &mut S {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        (**self).get(key)
    }
    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        (**self).scan(start, end, limit)
    }
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        (**self).commit(batch)
    }
}

impl<S: Storage + ?Sized> Storage for Box<S> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        (**self).get(key)
    }
    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        (**self).scan(start, end, limit)
    }
    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        (**self).commit(batch)
    }
}

/// In-memory storage: a B-tree, shared by clones so a "restarted" engine sees the same data.
#[derive(Clone, Default)]
pub struct MemoryStore {
    data: std::rc::Rc<std::cell::RefCell<BTreeMap<Vec<u8>, Vec<u8>>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.data.borrow().len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.data.borrow().is_empty()
    }

    /// A copy of every entry, for invariant checks.
    pub fn snapshot(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.data.borrow().clone()
    }
}

impl Storage for MemoryStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.data.borrow().get(key).cloned())
    }

    fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Entry>, StorageError> {
        if start >= end {
            return Ok(Vec::new());
        }
        Ok(self
            .data
            .borrow()
            .range(start.to_vec()..end.to_vec())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn commit(&mut self, batch: Vec<Write>) -> Result<(), StorageError> {
        let mut data = self.data.borrow_mut();
        for (k, v) in batch {
            match v {
                Some(v) => data.insert(k, v),
                None => data.remove(&k),
            };
        }
        Ok(())
    }
}
