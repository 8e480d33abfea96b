//! What only the engine knows, counted: acceptances, rejections, attempt outcomes, terminal
//! results, limits hit, entries set aside, and the destinations' queues summed.
//!
//! Hosts ask for these rather than re-deriving them from what crosses their boundary, so
//! the figures mean the same on every host. Counters count committed operations (and
//! rejections, which commit nothing) since this engine started, as Prometheus counters do;
//! the gauges are read from storage and survive restarts. No label names a destination:
//! `admin.destinations` answers per destination, so the series never grow with them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Monotonic counts of what the engine did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages accepted: `message.send` by kind (`self`, `local`, `cross`), and
    /// `message.deliver` receipts as `received`.
    pub accepted: BTreeMap<&'static str, u64>,
    /// `message.send` and `message.deliver` refused, by error code.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Attempts to other relays, by outcome: `accepted`, `rejected`, `unknown`,
    /// `not_attempted`, `timeout`, `orphaned` (in flight when the process stopped).
    pub attempts: BTreeMap<&'static str, u64>,
    /// Deliveries that ended `target_accepted`.
    pub delivered: u64,
    /// Deliveries that ended `failed`, by error code.
    pub failed: BTreeMap<String, u64>,
    /// Calls answered `rate_limited`, by method.
    pub rate_limited: BTreeMap<String, u64>,
    /// Tick entries set aside (quarantined).
    pub quarantined: u64,
    /// Operator actions that changed something, by action (`destination.retry`,
    /// `delivery.retry`, `destination.pause`, `destination.resume`): a fixed set of labels.
    pub operator_actions: BTreeMap<&'static str, u64>,
    /// Home spans (protocol.md "Home relay changes", rule 6), by event: `stale_delivery`
    /// (a deliver aimed at an older revision refused while the account is served here
    /// again, which only this rule refuses), `revision_retry` (a delivery sent
    /// again to the same relay at a higher revision), `old_session` (a session of an earlier
    /// span refused a home method).
    pub home_spans: BTreeMap<&'static str, u64>,
}

impl Counters {
    /// Adds `other` (one committed operation's counts) to these.
    pub(crate) fn merge(&mut self, other: Counters) {
        for (k, v) in other.accepted {
            *self.accepted.entry(k).or_default() += v;
        }
        for (k, v) in other.rejected {
            *self.rejected.entry(k).or_default() += v;
        }
        for (k, v) in other.attempts {
            *self.attempts.entry(k).or_default() += v;
        }
        self.delivered += other.delivered;
        for (k, v) in other.failed {
            *self.failed.entry(k).or_default() += v;
        }
        for (k, v) in other.rate_limited {
            *self.rate_limited.entry(k).or_default() += v;
        }
        self.quarantined += other.quarantined;
        for (k, v) in other.operator_actions {
            *self.operator_actions.entry(k).or_default() += v;
        }
        self.merge_home_spans(other.home_spans);
    }

    /// Adds home span events: those of a refused call too, whose refusal is the event.
    pub(crate) fn merge_home_spans(&mut self, other: BTreeMap<&'static str, u64>) {
        for (k, v) in other {
            *self.home_spans.entry(k).or_default() += v;
        }
    }

    /// Counts one in a keyed counter.
    pub(crate) fn bump<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
        *map.entry(key).or_default() += 1;
    }
}

/// Everything the engine reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Monotonic counts since the engine started.
    pub counters: Counters,
    /// The destinations as a whole, for alerts whose labels do not grow with them.
    pub destinations: Destinations,
}

/// Gauges over every destination (each a sum, never a label per destination).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Destinations {
    /// Destinations whose latest attempt failed.
    pub failing: u64,
    /// Destinations the operator paused.
    pub paused: u64,
    /// Deliveries not yet ended, at every destination.
    pub pending: u64,
    /// Entries ticks set aside and still kept (`admin.deliveries` lists them).
    pub quarantined: u64,
    /// Attempts out now, at every destination.
    pub in_flight: u64,
    /// How long the oldest delivery not yet ended has waited, in ms (0 when none waits).
    pub oldest_pending_age_ms: u64,
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes a family's `# HELP` and `# TYPE` lines.
pub(crate) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn labelled<K: AsRef<str>>(out: &mut String, name: &str, label: &str, map: &BTreeMap<K, u64>) {
    for (k, v) in map {
        let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {v}", escape(k.as_ref()));
    }
}

impl Metrics {
    /// The metrics in the Prometheus text exposition format (version 0.0.4).
    pub fn to_prometheus(&self) -> String {
        let c = &self.counters;
        let mut out = String::new();
        family(
            &mut out,
            "relay_messages_accepted_total",
            "counter",
            "Messages accepted: message.send by kind (self, local, cross), message.deliver as received.",
        );
        labelled(
            &mut out,
            "relay_messages_accepted_total",
            "kind",
            &c.accepted,
        );
        family(
            &mut out,
            "relay_messages_rejected_total",
            "counter",
            "message.send and message.deliver refused, by error code.",
        );
        labelled(
            &mut out,
            "relay_messages_rejected_total",
            "code",
            &c.rejected,
        );
        family(
            &mut out,
            "relay_delivery_attempts_total",
            "counter",
            "Attempts to other relays, by outcome.",
        );
        labelled(
            &mut out,
            "relay_delivery_attempts_total",
            "outcome",
            &c.attempts,
        );
        family(
            &mut out,
            "relay_deliveries_delivered_total",
            "counter",
            "Deliveries ended target_accepted.",
        );
        let _ = writeln!(out, "relay_deliveries_delivered_total {}", c.delivered);
        family(
            &mut out,
            "relay_deliveries_failed_total",
            "counter",
            "Deliveries ended failed, by error code.",
        );
        labelled(&mut out, "relay_deliveries_failed_total", "code", &c.failed);
        family(
            &mut out,
            "relay_rate_limited_total",
            "counter",
            "Calls answered rate_limited, by method.",
        );
        labelled(
            &mut out,
            "relay_rate_limited_total",
            "method",
            &c.rate_limited,
        );
        family(
            &mut out,
            "relay_tick_entries_quarantined_total",
            "counter",
            "Tick entries set aside because they could not be processed.",
        );
        let _ = writeln!(
            out,
            "relay_tick_entries_quarantined_total {}",
            c.quarantined
        );
        family(
            &mut out,
            "relay_operator_actions_total",
            "counter",
            "Operator actions that changed something, by action.",
        );
        labelled(
            &mut out,
            "relay_operator_actions_total",
            "action",
            &c.operator_actions,
        );
        family(
            &mut out,
            "relay_home_span_events_total",
            "counter",
            "Home spans: stale deliveries refused, same-relay revision retries, old sessions refused.",
        );
        labelled(
            &mut out,
            "relay_home_span_events_total",
            "event",
            &c.home_spans,
        );
        let d = &self.destinations;
        for (name, help, v) in [
            (
                "relay_destinations_failing",
                "Destinations whose latest attempt failed.",
                d.failing,
            ),
            (
                "relay_destinations_paused",
                "Destinations the operator paused.",
                d.paused,
            ),
            (
                "relay_deliveries_pending",
                "Deliveries not yet ended, at every destination.",
                d.pending,
            ),
            (
                "relay_quarantined_entries",
                "Entries ticks set aside and still kept.",
                d.quarantined,
            ),
            (
                "relay_in_flight_attempts",
                "Attempts out now, at every destination.",
                d.in_flight,
            ),
        ] {
            family(&mut out, name, "gauge", help);
            let _ = writeln!(out, "{name} {v}");
        }
        family(
            &mut out,
            "relay_oldest_pending_delivery_age_seconds",
            "gauge",
            "How long the oldest delivery not yet ended has waited (0 when none waits).",
        );
        let _ = writeln!(
            out,
            "relay_oldest_pending_delivery_age_seconds {}",
            d.oldest_pending_age_ms as f64 / 1000.0
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_family_and_escapes_labels() {
        let mut m = Metrics::default();
        Counters::bump(&mut m.counters.accepted, "cross");
        Counters::bump(&mut m.counters.failed, "a \"quoted\" code".to_string());
        m.destinations.oldest_pending_age_ms = 1500;
        let text = m.to_prometheus();
        assert!(text.contains("relay_messages_accepted_total{kind=\"cross\"} 1\n"));
        assert!(text.contains("relay_deliveries_failed_total{code=\"a \\\"quoted\\\" code\"} 1\n"));
        assert!(text.contains("relay_oldest_pending_delivery_age_seconds 1.5\n"));
        assert!(text.contains("# TYPE relay_deliveries_delivered_total counter\n"));
    }
}

/// The shards' metrics as one exposition (every sharding host's `/metrics`): each family described once (from shard 0's
/// text) and followed by every shard's samples of it, each with `shard="k"`, so a family's
/// lines stay together as the text format wants.
pub fn merge_shards(texts: &[String]) -> String {
    // Per shard: family name -> its sample lines, labelled.
    let mut per_shard: Vec<std::collections::HashMap<&str, Vec<String>>> = Vec::new();
    let mut order: Vec<(&str, Vec<&str>)> = Vec::new();
    for (k, text) in texts.iter().enumerate() {
        let mut families: std::collections::HashMap<&str, Vec<String>> = Default::default();
        let mut family = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# ") {
                let name = rest.split(' ').nth(1).unwrap_or("");
                if name != family {
                    family = name;
                    if k == 0 {
                        order.push((name, Vec::new()));
                    }
                }
                if k == 0 {
                    if let Some((_, head)) = order.last_mut() {
                        head.push(line);
                    }
                }
                continue;
            }
            families
                .entry(family)
                .or_default()
                .push(with_shard(line, k as u32));
        }
        per_shard.push(families);
    }
    let mut out = String::new();
    for (family, head) in &order {
        for line in head {
            out.push_str(line);
            out.push('\n');
        }
        for shard in &per_shard {
            for line in shard.get(family).into_iter().flatten() {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// One sample line with `shard="k"` as its first label.
fn with_shard(line: &str, shard: u32) -> String {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, rest) = line.split_at(name_end);
    match rest.strip_prefix('{') {
        Some(labels) => format!("{name}{{shard=\"{shard}\",{labels}"),
        None => format!("{name}{{shard=\"{shard}\"}}{rest}"),
    }
}

#[cfg(test)]
mod shard_tests {
    use super::merge_shards;

    #[test]
    fn shard_metrics_carry_their_shard_and_each_family_stays_together() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{kind=\"local\"} 3\n# HELP b B.\n# TYPE b gauge\nb 0\n";
        let two = [
            text.to_string(),
            text.replace(" 3", " 5").replace(" 0", " 1"),
        ];
        assert_eq!(
            merge_shards(&two),
            "# HELP a_total A.\n# TYPE a_total counter\na_total{shard=\"0\",kind=\"local\"} 3\na_total{shard=\"1\",kind=\"local\"} 5\n# HELP b B.\n# TYPE b gauge\nb{shard=\"0\"} 0\nb{shard=\"1\"} 1\n"
        );
    }
}
