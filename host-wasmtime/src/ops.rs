//! What an operator sees of a running relay: the host's own metrics (beside the core's
//! counts) and its health.
//!
//! Recording is atomics (counters, gauges) or one uncontended lock per observation inside
//! `prometheus-client`'s histograms; nothing is recorded per HTTP request (connections
//! are counted once each, at accept and close).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How an outbound attempt ended, as the host saw it (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The peer answered 200.
    Answered,
    /// The peer answered with an error.
    Rejected,
    /// Sent, but no answer: timeout, reset, lost response.
    Unknown,
    /// It never reached the peer: connection refused, name not resolved, not signed.
    NotAttempted,
}

impl AttemptOutcome {
    const ALL: [AttemptOutcome; 4] = [
        AttemptOutcome::Answered,
        AttemptOutcome::Rejected,
        AttemptOutcome::Unknown,
        AttemptOutcome::NotAttempted,
    ];

    fn label(self) -> &'static str {
        match self {
            AttemptOutcome::Answered => "answered",
            AttemptOutcome::Rejected => "rejected",
            AttemptOutcome::Unknown => "unknown",
            AttemptOutcome::NotAttempted => "not_attempted",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

/// The host's own metrics (`relay_*`; the same names on the Node host).
pub struct HostMetrics {
    registry: Registry,
    attempts: [Histogram; 4],
    /// Operations per commit group that wrote (one SQLite transaction, one fsync).
    pub commit_group_size: Histogram,
    /// How long a group's commit took.
    pub commit_duration: Histogram,
    /// Traps of the guest (each answered `internal`).
    pub traps: Counter,
    /// Fresh core instances started after a trap.
    pub restarts: Counter,
    /// TCP connections open on the HTTP listeners (public and admin; upgraded WebSockets included).
    pub open_connections: Gauge,
    /// WebSockets open.
    pub open_websockets: Gauge,
    /// How long the core took to run one tick.
    pub tick_duration: Histogram,
    /// Connections closed at accept over `--max-connections`.
    pub refused_limit: Counter,
    /// Connections closed at accept over `--max-connections-per-ip`.
    pub refused_per_ip: Counter,
    /// Requests and WebSocket frames answered 503 because `--max-pending` were waiting.
    pub busy: Counter,
    /// WebSockets dropped because their client did not read (send queue full).
    pub websockets_dropped: Counter,
}

/// Latency buckets from 0.5 ms to about 33 s (factor 2).
fn seconds() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 17)
}

impl Default for HostMetrics {
    fn default() -> HostMetrics {
        let mut registry = Registry::default();
        let family =
            Family::<OutcomeLabel, Histogram>::new_with_constructor(|| Histogram::new(seconds()));
        // Every outcome's series exists from the start (count 0), and each is held here so
        // recording never looks it up.
        let attempts = AttemptOutcome::ALL.map(|o| {
            family
                .get_or_create(&OutcomeLabel { outcome: o.label() })
                .clone()
        });
        registry.register(
            "relay_attempt_duration_seconds",
            "How long outbound delivery attempts took, by how they ended (answered, rejected, unknown, not_attempted)",
            family,
        );
        let commit_group_size = Histogram::new(exponential_buckets(1.0, 2.0, 9));
        registry.register(
            "relay_commit_group_size",
            "Operations per commit group that wrote (one SQLite transaction, one fsync)",
            commit_group_size.clone(),
        );
        let commit_duration = Histogram::new(seconds());
        registry.register(
            "relay_commit_duration_seconds",
            "How long a commit group's transaction took to become durable",
            commit_duration.clone(),
        );
        let traps = Counter::default();
        registry.register(
            "relay_guest_traps",
            "Traps of the core (wasm) instance; each call that trapped answered internal",
            traps.clone(),
        );
        let restarts = Counter::default();
        registry.register(
            "relay_core_restarts",
            "Fresh core instances started over the same storage after a trap",
            restarts.clone(),
        );
        let open_connections = Gauge::default();
        registry.register(
            "relay_open_connections",
            "TCP connections open on the HTTP listeners (public and admin, WebSockets included)",
            open_connections.clone(),
        );
        let open_websockets = Gauge::default();
        registry.register(
            "relay_open_websockets",
            "WebSockets open",
            open_websockets.clone(),
        );
        let tick_duration = Histogram::new(seconds());
        registry.register(
            "relay_tick_duration_seconds",
            "How long the core took to run one tick (due attempts, timeouts, deadlines, expiry)",
            tick_duration.clone(),
        );
        let refused = Family::<CauseLabel, Counter>::default();
        let refused_limit = refused
            .get_or_create(&CauseLabel { cause: "limit" })
            .clone();
        let refused_per_ip = refused
            .get_or_create(&CauseLabel { cause: "per_ip" })
            .clone();
        registry.register(
            "relay_connections_refused",
            "Connections closed at accept: over --max-connections (limit) or --max-connections-per-ip (per_ip)",
            refused,
        );
        let busy = Counter::default();
        registry.register(
            "relay_busy",
            "Requests and WebSocket frames answered 503 unavailable because --max-pending were waiting for the core",
            busy.clone(),
        );
        let websockets_dropped = Counter::default();
        registry.register(
            "relay_websockets_dropped",
            "WebSockets dropped because their client did not read (over --ws-send-queue frames queued)",
            websockets_dropped.clone(),
        );
        HostMetrics {
            registry,
            refused_limit,
            refused_per_ip,
            busy,
            websockets_dropped,
            attempts,
            commit_group_size,
            commit_duration,
            traps,
            restarts,
            open_connections,
            open_websockets,
            tick_duration,
        }
    }
}

impl HostMetrics {
    /// Records one outbound attempt.
    pub fn attempt(&self, outcome: AttemptOutcome, took: Duration) {
        let i = AttemptOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.attempts[i].observe(took.as_secs_f64());
    }

    /// The host's metrics in the Prometheus text format (0.0.4), to follow the core's.
    ///
    /// `prometheus-client` writes OpenMetrics, where a counter family is named without its
    /// `_total` suffix; the 0.0.4 format names the family as its sample, so those HELP and
    /// TYPE lines are renamed (as prom-client writes them on the Node host).
    pub fn render(&self) -> String {
        let mut open = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut open, &self.registry);
        let counters: Vec<String> = open
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.strip_suffix(" counter"))
            .filter(|n| !n.ends_with("_total"))
            .map(str::to_string)
            .collect();
        let mut out = String::with_capacity(open.len() + 64);
        for line in open.lines() {
            let renamed = counters.iter().find_map(|n| {
                ["# HELP ", "# TYPE "].iter().find_map(|p| {
                    line.strip_prefix(p)
                        .and_then(|rest| rest.strip_prefix(n.as_str()))
                        .filter(|rest| rest.starts_with(' '))
                        .map(|rest| format!("{p}{n}_total{rest}"))
                })
            });
            match renamed {
                Some(l) => out.push_str(&l),
                None => out.push_str(line),
            }
            out.push('\n');
        }
        out
    }
}

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

    /// Why the relay is not ready, if it is not.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.stopping.load(Ordering::Relaxed) {
            Some("shutting down")
        } else if self.core_failed.load(Ordering::Relaxed) {
            Some("the core instance failed")
        } else if !self.storage_ok.load(Ordering::Relaxed) {
            Some("the storage refused the last commit")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_with_their_suffix_and_every_attempt_outcome_is_present() {
        let m = HostMetrics::default();
        m.traps.inc();
        m.attempt(AttemptOutcome::NotAttempted, Duration::from_millis(3));
        let text = m.render();
        assert!(
            text.contains("# TYPE relay_guest_traps_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP relay_guest_traps_total Traps"),
            "{text}"
        );
        assert!(text.contains("\nrelay_guest_traps_total 1\n"), "{text}");
        assert!(text.contains("# TYPE relay_core_restarts_total counter\n"));
        for o in ["answered", "rejected", "unknown"] {
            assert!(
                text.contains(&format!(
                    "relay_attempt_duration_seconds_count{{outcome=\"{o}\"}} 0\n"
                )),
                "{text}"
            );
        }
        assert!(
            text.contains("relay_attempt_duration_seconds_count{outcome=\"not_attempted\"} 1\n")
        );
        assert!(!text.contains("# EOF"));
    }

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
