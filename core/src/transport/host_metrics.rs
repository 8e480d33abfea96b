//! The host's own metrics: what only a host sees (how long attempts, commits and ticks took;
//! traps; connections and WebSockets), defined and written once, so the wasmtime and Node
//! hosts' `/metrics` show the same families, buckets and help after the core's counts
//! ([`crate::engine::metrics`]). (On the edge the platform owns sockets and storage, so its
//! `/metrics` is the core's counts alone.)
//!
//! Recording is an atomic add, never a lock, and nothing is recorded per HTTP request
//! (connections are counted at accept and close). The wasmtime host shares one
//! [`HostMetrics`] between its threads and writes it whole; the Node host records the relay's
//! side where the core runs and keeps the transports' counts as plain numbers where the
//! sockets are, so each side is written on its own ([`HostMetrics::write_relay`],
//! [`Transports::write`]).

use super::outbound::Fetch;
use crate::engine::metrics::family;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Latency buckets in seconds: 0.5 ms to about 33 s, by factors of 2.
const SECONDS: [f64; 17] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048,
    4.096, 8.192, 16.384, 32.768,
];

/// Operations per commit group: 1 to 256, by factors of 2.
const GROUP_SIZES: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// How an outbound attempt ended as the host saw it (the `outcome` label), in label order.
const OUTCOMES: [&str; 4] = ["answered", "rejected", "unknown", "not_attempted"];

/// A counter a host bumps from any thread.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Relaxed);
    }

    /// Adds `n`.
    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// The count so far.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A gauge a host moves from any thread.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Relaxed);
    }

    /// Takes one away.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Relaxed);
    }

    /// The value now.
    pub fn get(&self) -> i64 {
        self.0.load(Relaxed)
    }
}

/// A histogram of fixed buckets (each bound inclusive, as Prometheus reads `le`).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; the last is past every bound (`+Inf`).
    counts: Box<[AtomicU64]>,
    /// The sum of the observations, as `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records one observation (a negative or non-finite one as 0).
    pub fn observe(&self, v: f64) {
        let v = if v.is_finite() && v > 0.0 { v } else { 0.0 };
        let i = self.bounds.partition_point(|b| *b < v);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Relaxed);
        }
        let _ = self.sum.fetch_update(Relaxed, Relaxed, |bits| {
            Some((f64::from_bits(bits) + v).to_bits())
        });
    }

    /// Writes the `_bucket`, `_sum` and `_count` samples, with `label` (`name="value"`)
    /// after `le` when given.
    fn write(&self, out: &mut String, name: &str, label: &str) {
        let sep = if label.is_empty() { "" } else { "," };
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.load(Relaxed);
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"{sep}{label}}} {seen}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"{sep}{label}}} {seen}");
                }
            }
        }
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        let sum = f64::from_bits(self.sum.load(Relaxed));
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(label));
        let _ = writeln!(out, "{name}_count{} {seen}", braces(label));
    }
}

/// The transports' counts, as a host holds them when it writes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transports {
    /// TCP connections open on the HTTP listeners (public and admin, WebSockets included).
    pub open_connections: i64,
    /// WebSockets open.
    pub open_websockets: i64,
    /// Connections closed at accept over `--max-connections`.
    pub refused_limit: u64,
    /// Connections closed at accept over `--max-connections-per-ip`.
    pub refused_per_ip: u64,
    /// Requests and frames answered 503 because `--max-pending` were waiting for the core.
    pub busy: u64,
    /// WebSockets dropped because their client did not read (send queue full).
    pub websockets_dropped: u64,
}

impl Transports {
    /// Appends these counts in the Prometheus text format (0.0.4).
    pub fn write(&self, out: &mut String) {
        let name = "relay_connections_refused_total";
        family(out, name, "counter", "Connections closed at accept: over --max-connections (limit) or --max-connections-per-ip (per_ip).");
        let _ = writeln!(out, "{name}{{cause=\"limit\"}} {}", self.refused_limit);
        let _ = writeln!(out, "{name}{{cause=\"per_ip\"}} {}", self.refused_per_ip);
        let plain: [(&str, &str, &str, i64); 4] = [
            ("relay_busy_total", "counter", "Requests and WebSocket frames answered 503 unavailable because --max-pending were waiting for the core.", self.busy as i64),
            ("relay_websockets_dropped_total", "counter", "WebSockets dropped because their client did not read (over --ws-send-queue frames queued).", self.websockets_dropped as i64),
            ("relay_open_connections", "gauge", "TCP connections open on the HTTP listeners (public and admin, WebSockets included).", self.open_connections),
            ("relay_open_websockets", "gauge", "Open WebSocket sessions.", self.open_websockets),
        ];
        for (name, kind, help, v) in plain {
            family(out, name, kind, help);
            let _ = writeln!(out, "{name} {v}");
        }
    }
}

/// The host's own metrics.
#[derive(Debug)]
pub struct HostMetrics {
    /// How long outbound attempts took, by [`OUTCOMES`].
    attempts: [Histogram; 4],
    /// Operations per commit group that wrote (one transaction, one fsync).
    pub commit_group_size: Histogram,
    /// How long a group's commit took to become durable (seconds).
    pub commit_duration: Histogram,
    /// How long the core took to run one tick (seconds).
    pub tick_duration: Histogram,
    /// Traps of the core instance (each call that trapped answered `internal`).
    pub traps: Counter,
    /// Fresh core instances started over the same storage after a trap.
    pub restarts: Counter,
    /// TCP connections open on the HTTP listeners.
    pub open_connections: Gauge,
    /// WebSockets open.
    pub open_websockets: Gauge,
    /// Connections closed at accept over `--max-connections`.
    pub refused_limit: Counter,
    /// Connections closed at accept over `--max-connections-per-ip`.
    pub refused_per_ip: Counter,
    /// Requests and frames answered 503 because `--max-pending` were waiting for the core.
    pub busy: Counter,
    /// WebSockets dropped because their client did not read.
    pub websockets_dropped: Counter,
}

impl Default for HostMetrics {
    fn default() -> HostMetrics {
        HostMetrics {
            attempts: OUTCOMES.map(|_| Histogram::new(&SECONDS)),
            commit_group_size: Histogram::new(&GROUP_SIZES),
            commit_duration: Histogram::new(&SECONDS),
            tick_duration: Histogram::new(&SECONDS),
            traps: Counter::default(),
            restarts: Counter::default(),
            open_connections: Gauge::default(),
            open_websockets: Gauge::default(),
            refused_limit: Counter::default(),
            refused_per_ip: Counter::default(),
            busy: Counter::default(),
            websockets_dropped: Counter::default(),
        }
    }
}

impl HostMetrics {
    /// Records one outbound attempt that took `seconds`, by what became of it: answered
    /// (200), rejected (any other answer), unknown, not attempted.
    pub fn attempt(&self, fetch: &Fetch, seconds: f64) {
        let i = match fetch {
            Fetch::Answered(200, _) => 0,
            Fetch::Answered(..) => 1,
            Fetch::Unknown => 2,
            Fetch::NotSent => 3,
        };
        self.attempts[i].observe(seconds);
    }

    /// Records one durable commit of `size` operations that took `seconds`.
    pub fn commit(&self, size: usize, seconds: f64) {
        self.commit_group_size.observe(size as f64);
        self.commit_duration.observe(seconds);
    }

    /// The relay's side (attempts, commits, ticks, traps) in the Prometheus text format.
    pub fn write_relay(&self, out: &mut String) {
        let name = "relay_attempt_duration_seconds";
        family(
            out,
            name,
            "histogram",
            "Time of one delivery attempt to another relay, by the outcome reported to the core.",
        );
        for (h, outcome) in self.attempts.iter().zip(OUTCOMES) {
            h.write(out, name, &format!("outcome=\"{outcome}\""));
        }
        let name = "relay_commit_group_size";
        family(out, name, "histogram", "Operations per commit that wrote (one SQLite transaction, one fsync; an operation outside a group counts as one).");
        self.commit_group_size.write(out, name, "");
        let name = "relay_commit_duration_seconds";
        family(
            out,
            name,
            "histogram",
            "Time of one durable commit (the transaction and its fsync).",
        );
        self.commit_duration.write(out, name, "");
        for (name, help, c) in [
            (
                "relay_guest_traps_total",
                "Traps of the core instance (each answered internal).",
                &self.traps,
            ),
            (
                "relay_core_restarts_total",
                "Fresh core instances started after a trap.",
                &self.restarts,
            ),
        ] {
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name} {}", c.get());
        }
        let name = "relay_tick_duration_seconds";
        family(
            out,
            name,
            "histogram",
            "Time of one tick of the core (due attempts, timeouts, deadlines, expiry).",
        );
        self.tick_duration.write(out, name, "");
    }

    /// The transports' counts now.
    pub fn transports(&self) -> Transports {
        Transports {
            open_connections: self.open_connections.get(),
            open_websockets: self.open_websockets.get(),
            refused_limit: self.refused_limit.get(),
            refused_per_ip: self.refused_per_ip.get(),
            busy: self.busy.get(),
            websockets_dropped: self.websockets_dropped.get(),
        }
    }

    /// Everything, the relay's side then the transports', in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        self.write_relay(&mut out);
        self.transports().write(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
    }

    #[test]
    fn buckets_are_cumulative_and_bounds_inclusive() {
        let m = HostMetrics::default();
        m.attempt(&Fetch::Answered(200, Vec::new()), 0.001);
        m.attempt(&Fetch::Answered(503, Vec::new()), 0.3);
        m.attempt(&Fetch::NotSent, 100.0);
        m.commit(3, 0.002);
        let t = m.render();
        let a = "relay_attempt_duration_seconds";
        assert_eq!(
            sample(
                &t,
                &format!("{a}_bucket{{le=\"0.0005\",outcome=\"answered\"}}")
            ),
            Some("0")
        );
        assert_eq!(
            sample(
                &t,
                &format!("{a}_bucket{{le=\"0.001\",outcome=\"answered\"}}")
            ),
            Some("1")
        );
        assert_eq!(
            sample(
                &t,
                &format!("{a}_bucket{{le=\"0.256\",outcome=\"rejected\"}}")
            ),
            Some("0")
        );
        assert_eq!(
            sample(
                &t,
                &format!("{a}_bucket{{le=\"0.512\",outcome=\"rejected\"}}")
            ),
            Some("1")
        );
        assert_eq!(
            sample(
                &t,
                &format!("{a}_bucket{{le=\"32.768\",outcome=\"not_attempted\"}}")
            ),
            Some("0")
        );
        assert_eq!(
            sample(
                &t,
                &format!("{a}_bucket{{le=\"+Inf\",outcome=\"not_attempted\"}}")
            ),
            Some("1")
        );
        assert_eq!(
            sample(&t, &format!("{a}_count{{outcome=\"unknown\"}}")),
            Some("0")
        );
        assert_eq!(
            sample(&t, &format!("{a}_sum{{outcome=\"not_attempted\"}}")),
            Some("100")
        );
        assert_eq!(
            sample(&t, "relay_commit_group_size_bucket{le=\"2\"}"),
            Some("0")
        );
        assert_eq!(
            sample(&t, "relay_commit_group_size_bucket{le=\"4\"}"),
            Some("1")
        );
        assert_eq!(sample(&t, "relay_commit_group_size_sum"), Some("3"));
        assert_eq!(sample(&t, "relay_commit_duration_seconds_count"), Some("1"));
        assert_eq!(
            sample(&t, &format!("{a}_count{{outcome=\"rejected\"}}")),
            Some("1")
        );
    }

    #[test]
    fn every_family_is_described_once_and_the_sides_add_up_to_the_whole() {
        let m = HostMetrics::default();
        m.refused_per_ip.inc();
        m.open_websockets.inc();
        let whole = m.render();
        let mut sides = String::new();
        m.write_relay(&mut sides);
        Transports {
            refused_per_ip: 1,
            open_websockets: 1,
            ..Transports::default()
        }
        .write(&mut sides);
        assert_eq!(whole, sides);
        assert_eq!(
            sample(&whole, "relay_connections_refused_total{cause=\"per_ip\"}"),
            Some("1")
        );
        assert_eq!(sample(&whole, "relay_open_websockets"), Some("1"));
        let types: Vec<&str> = whole.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        for t in types.iter().filter(|t| t.ends_with(" counter")) {
            assert!(
                t.contains("_total "),
                "a counter is named as its sample (0.0.4): {t}"
            );
        }
        let mut names: Vec<&str> = types
            .iter()
            .map(|l| l.split(' ').nth(2).unwrap_or(""))
            .collect();
        assert_eq!(names.len(), 11, "{types:?}");
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 11, "each family once");
        for l in whole.lines().filter(|l| !l.starts_with('#')) {
            let family = names.iter().any(|n| l.starts_with(n));
            assert!(family, "a sample of a described family: {l}");
        }
    }
}
