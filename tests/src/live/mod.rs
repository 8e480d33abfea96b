//! The suite's view of real relays: host processes, a fault-injecting proxy between them,
//! a client over HTTP and WebSocket, and the delivery invariants checked on what the
//! relays answer.

pub mod check;
pub mod client;
pub mod host;
pub mod proxy;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `scenario` for each item; reports every failing one, by name, at the end.
pub fn each<T: Copy + std::fmt::Debug>(items: &[T], scenario: impl Fn(T)) {
    let mut failed = Vec::new();
    for &item in items {
        eprintln!("-- {item:?}");
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| scenario(item))) {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{item:?}: {why}"));
        }
    }
    assert!(failed.is_empty(), "failed for:\n{}", failed.join("\n"));
}
