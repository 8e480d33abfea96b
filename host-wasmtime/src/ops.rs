//! The host's health: what `/readyz` answers from. (Its metrics are the core's
//! `transport::host_metrics`, recorded here and written by the core.)

use std::sync::atomic::{AtomicBool, Ordering};

/// What `/readyz` answers from: storage open, the core instance healthy, not shutting down.
#[derive(Debug)]
pub struct Health {
    /// The last group commit (if any) succeeded: the storage takes writes.
    storage_ok: AtomicBool,
    /// The core failed closed (a trapped instance could not be replaced).
    core_failed: AtomicBool,
    /// Shutdown has begun: no new work should come here.
    stopping: AtomicBool,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            storage_ok: AtomicBool::new(true),
            core_failed: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }
}

impl Health {
    /// Records whether the storage took the last commit (written only when it changes).
    pub fn set_storage_ok(&self, ok: bool) {
        if self.storage_ok.load(Ordering::Relaxed) != ok {
            self.storage_ok.store(ok, Ordering::Relaxed);
        }
    }

    /// The core instance could not be replaced after a trap.
    pub fn set_core_failed(&self) {
        self.core_failed.store(true, Ordering::Relaxed);
    }

    /// Shutdown has begun.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Why the relay is not ready, if it is not (the core's words).
    pub fn not_ready(&self) -> Option<&'static str> {
        relay_core::transport::health::State {
            stopping: self.stopping.load(Ordering::Relaxed),
            core_down: self.core_failed.load(Ordering::Relaxed),
            storage_failing: !self.storage_ok.load(Ordering::Relaxed),
        }
        .not_ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_names_what_is_wrong() {
        let h = Health::default();
        assert_eq!(h.not_ready(), None);
        h.set_storage_ok(false);
        assert_eq!(h.not_ready(), Some("the storage refused the last commit"));
        h.set_storage_ok(true);
        h.set_stopping();
        assert_eq!(h.not_ready(), Some("shutting down"));
    }
}
