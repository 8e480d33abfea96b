//! `admin` answers as an operator reads them: a table per listing, one line per action.
//!
//! Every host prints an answer through [`render`], so `relay admin destinations` and
//! `relay-node admin destinations` print the same table; `--json` prints the answer's
//! body as the relay wrote it, for scripts.

use relay_core::wire::json::{self, Object, Value};
use std::fmt::Write as _;

/// How an admin answer is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The body as it came (`--json`, metrics, an answer of an unknown shape).
    Raw,
    /// `admin deliveries`: the deliveries, then the quarantined entries.
    Deliveries,
    /// `admin destinations`.
    Destinations,
    /// `admin quarantine`.
    Quarantine,
    /// An action (retry, pause, resume, drop, requeue, backup): one line of `key=value`.
    Action,
}

impl View {
    /// The view's name, as the JavaScript launchers pass it back to [`render`].
    pub fn as_str(self) -> &'static str {
        match self {
            View::Raw => "raw",
            View::Deliveries => "deliveries",
            View::Destinations => "destinations",
            View::Quarantine => "quarantine",
            View::Action => "action",
        }
    }

    /// The view named by [`View::as_str`]; `Raw` for any other name.
    pub fn named(name: &str) -> View {
        match name {
            "deliveries" => View::Deliveries,
            "destinations" => View::Destinations,
            "quarantine" => View::Quarantine,
            "action" => View::Action,
            _ => View::Raw,
        }
    }
}

/// The text to print for a 200 answer `body` in `view`, ending with a newline. A body that
/// is not the JSON object the view expects is printed as it came, never hidden.
pub fn render(view: View, body: &[u8]) -> String {
    let parsed = match json::parse(body) {
        Ok(Value::Object(o)) if view != View::Raw => Some(o),
        _ => None,
    };
    let Some(o) = parsed else {
        let text = String::from_utf8_lossy(body).into_owned();
        return if text.ends_with('\n') {
            text
        } else {
            text + "\n"
        };
    };
    match view {
        View::Deliveries => deliveries(&o),
        View::Destinations => destinations(&o),
        View::Quarantine => quarantine(&o),
        View::Raw | View::Action => action(&o),
    }
}

fn destinations(o: &Object) -> String {
    let mut t = Table::new(&[
        "DESTINATION",
        "PENDING",
        "IN-FLIGHT",
        "FAILED",
        "FAILURES",
        "FAILING-SINCE",
        "LAST-SUCCESS",
        "NEXT-ATTEMPT",
        "OLDEST-WAIT",
        "PAUSED",
        "LAST-ERROR",
    ]);
    for row in rows(o, "destinations") {
        t.row(vec![
            text(row, "destination"),
            int(row, "pending"),
            int(row, "in_flight"),
            int(row, "failed"),
            int(row, "consecutive_failures"),
            time(row, "failing_since"),
            time(row, "last_success_at"),
            time(row, "next_attempt_at"),
            age(row, "oldest_pending_age_ms"),
            match row.get("paused") {
                Some(Value::Bool(true)) => "yes".into(),
                Some(Value::Bool(false)) => "no".into(),
                _ => text(row, "state"),
            },
            error(row.get("last_error")),
        ]);
    }
    t.finish(o, ("destination", "destinations"))
}

fn deliveries(o: &Object) -> String {
    let mut t = Table::new(&[
        "DESTINATION",
        "FROM",
        "MESSAGE",
        "STATE",
        "PHASE",
        "ATTEMPTS",
        "NEXT-ATTEMPT",
        "DEADLINE",
        "LAST-ERROR",
    ]);
    for row in rows(o, "deliveries") {
        t.row(vec![
            text(row, "destination"),
            text(row, "from"),
            text(row, "message_id"),
            text(row, "state"),
            text(row, "phase"),
            int(row, "attempts"),
            time(row, "next_attempt_at"),
            time(row, "deadline"),
            text(row, "last_error"),
        ]);
    }
    let mut out = t.finish(o, ("delivery", "deliveries"));
    if !rows(o, "quarantined").is_empty() {
        out.push_str("\nquarantined (relay admin quarantine lists them with their ids):\n");
        out.push_str(&quarantine_table(o));
    }
    out
}

fn quarantine(o: &Object) -> String {
    let mut out = quarantine_table(o);
    if let Some(next) = o.get("next").and_then(Value::as_str) {
        let _ = writeln!(out, "more: --after {next}");
    }
    out
}

fn quarantine_table(o: &Object) -> String {
    let mut t = Table::new(&["ID", "AT", "CODE", "MESSAGE", "ENTRY"]);
    for row in rows(o, "quarantined") {
        t.row(vec![
            text(row, "id"),
            time(row, "at"),
            text(row, "code"),
            text(row, "message"),
            text(row, "entry"),
        ]);
    }
    t.finish(&Object::new(), ("entry", "entries"))
}

/// One line: each member as `key=value`, in the answer's order.
fn action(o: &Object) -> String {
    let mut out = String::new();
    for (k, v) in o.iter() {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{k}={}", plain(v));
    }
    out.push('\n');
    out
}

/// The objects of the array member `name`.
fn rows<'a>(o: &'a Object, name: &str) -> Vec<&'a Object> {
    match o.get(name) {
        Some(Value::Array(l)) => l.iter().filter_map(Value::as_object).collect(),
        _ => Vec::new(),
    }
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => one_line(s),
        Value::Null => "-".into(),
        other => one_line(&String::from_utf8_lossy(
            &relay_core::wire::canonical::to_vec(other),
        )),
    }
}

/// A cell never breaks the table: line breaks (a cursor holds one) become spaces.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn text(o: &Object, name: &str) -> String {
    o.get(name).map_or_else(|| "-".into(), plain)
}

fn int(o: &Object, name: &str) -> String {
    o.get(name)
        .and_then(Value::as_protocol_int)
        .map_or_else(|| "-".into(), |n| n.to_string())
}

/// A time in milliseconds since the epoch, as RFC 3339 UTC to the second.
fn time(o: &Object, name: &str) -> String {
    let Some(ms) = o.get(name).and_then(Value::as_protocol_int) else {
        return "-".into();
    };
    let whole = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    time::OffsetDateTime::from_unix_timestamp(whole)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// A duration in milliseconds, as `3d4h`, `2h5m`, `4m10s` or `12s`.
fn age(o: &Object, name: &str) -> String {
    let Some(ms) = o.get(name).and_then(Value::as_protocol_int) else {
        return "-".into();
    };
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match () {
        _ if d > 0 => format!("{d}d{h}h"),
        _ if h > 0 => format!("{h}h{m}m"),
        _ if m > 0 => format!("{m}m{s}s"),
        _ => format!("{s}s"),
    }
}

/// `code: message`, or the code alone.
fn error(v: Option<&Value>) -> String {
    match v {
        Some(Value::Object(e)) => {
            let code = text(e, "code");
            match e.get("message").and_then(Value::as_str) {
                Some(m) if !m.is_empty() => format!("{code}: {}", one_line(m)),
                _ => code,
            }
        }
        Some(other) => plain(other),
        None => "-".into(),
    }
}

/// Columns padded to their widest cell; the last column is not padded.
struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, then how many rows and, when the answer has a `next`, how to go on.
    fn finish(self, answer: &Object, (one, many): (&str, &str)) -> String {
        let width = |i: usize| {
            std::iter::once(&self.head)
                .chain(&self.rows)
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.head.len()).map(width).collect();
        let mut out = String::new();
        for r in std::iter::once(&self.head).chain(&self.rows) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                if i + 1 == r.len() {
                    line.push_str(c);
                } else {
                    let _ = write!(line, "{c:<w$}  ", w = widths[i]);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        let n = self.rows.len();
        let _ = write!(out, "({n} {}", if n == 1 { one } else { many });
        if let Some(next) = answer.get("next").and_then(Value::as_str) {
            // A cursor may hold a line break (deliveries'): quoted as the shell takes it.
            let arg = if next.contains('\n') || next.contains(' ') {
                format!(
                    "$'{}'",
                    next.replace('\\', "\\\\")
                        .replace('\n', "\\n")
                        .replace('\'', "\\'")
                )
            } else {
                next.to_string()
            };
            let _ = write!(out, "; more: --after {arg}");
        }
        out.push_str(")\n");
        out
    }
}
