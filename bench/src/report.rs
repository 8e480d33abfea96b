//! Results: one sample per measured operation, one table, one JSON file.

use serde_json::{json, Value as Json};
use std::time::Duration;

/// One operation measured `n` times.
#[derive(Clone, Debug)]
pub struct Sample {
    pub op: String,
    pub n: usize,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Wasm fuel spent per operation (wasmtime rows): the core's work, free of timing noise.
    pub fuel_per_op: Option<u64>,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

impl Sample {
    /// A sample from per-call latencies and the wall time of all calls.
    pub fn new(op: &str, mut lat: Vec<Duration>, wall: Duration) -> Sample {
        lat.sort();
        Sample {
            op: op.to_string(),
            n: lat.len(),
            per_s: lat.len() as f64 / wall.as_secs_f64().max(1e-9),
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
            fuel_per_op: None,
        }
    }

    /// The sample with the fuel its `n` operations spent.
    pub fn with_fuel(mut self, spent: Option<u64>) -> Sample {
        self.fuel_per_op = spent.map(|f| f / self.n.max(1) as u64);
        self
    }
}

/// The setup name of the Node build's in-process rows.
pub const NODE: &str = "node (wasm-bindgen)";
/// The native engine run again right after the Node rows (their second baseline).
pub const NATIVE_AGAIN: &str = "native engine, after node";

/// One line of the table: who ran what, on which storage.
#[derive(Clone, Debug)]
pub struct Row {
    pub setup: String,
    pub storage: String,
    pub concurrency: Option<usize>,
    pub sample: Sample,
    /// The native engine's figure this row is compared with (same operation and storage).
    pub baseline: Option<f64>,
    /// Rows over HTTP (a concurrency): the native floor of the same run (parse, JCS, SHA-256
    /// and verify of one message), the figure no host can pass.
    pub floor: Option<f64>,
    pub note: String,
}

impl Row {
    /// The ratio to the native engine measured in the same run.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline.map(|b| self.sample.per_s / b)
    }

    /// The ratio to the native floor of the same run (HTTP rows).
    pub fn floor_ratio(&self) -> Option<f64> {
        self.floor.map(|f| self.sample.per_s / f)
    }
}

/// The setup name of the native floor's row.
pub const FLOOR: &str = "native floor";

/// Every row of a run.
#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub extra: Vec<(String, Json)>,
}

impl Report {
    /// Adds a row.
    pub fn add(&mut self, setup: &str, storage: &str, concurrency: Option<usize>, s: Sample) {
        // Progress on stderr, so a long run that is stopped still leaves its figures.
        eprintln!(
            "  {setup} {storage} {} {concurrency:?}: {:.0}/s p50 {:.3} ms p99 {:.3} ms",
            s.op, s.per_s, s.p50_ms, s.p99_ms
        );
        self.rows.push(Row {
            setup: setup.to_string(),
            storage: storage.to_string(),
            concurrency,
            sample: s,
            baseline: None,
            floor: None,
            note: String::new(),
        });
    }

    /// Fills every row's baseline: the native engine on the same storage (HTTP rows: SQLite send).
    ///
    /// Node rows, which cannot alternate with the native engine, take the mean of the native
    /// runs before and after them; the second native run's own ratio shows how far the machine drifted.
    pub fn link_baselines(&mut self) {
        let of = |setup: &str| -> Vec<(String, String, f64)> {
            self.rows
                .iter()
                .filter(|r| r.setup == setup)
                .map(|r| (r.sample.op.clone(), r.storage.clone(), r.sample.per_s))
                .collect()
        };
        let (natives, again) = (of("native engine"), of(NATIVE_AGAIN));
        let floor = self
            .rows
            .iter()
            .find(|r| r.setup == FLOOR)
            .map(|r| r.sample.per_s);
        let find = |rows: &[(String, String, f64)], op: &str, storage: &str| {
            rows.iter()
                .find(|(o, s, _)| o == op && s == storage)
                .map(|(_, _, v)| *v)
        };
        for r in &mut self.rows {
            let first = find(&natives, &r.sample.op, &r.storage);
            r.baseline = match (
                r.setup.as_str(),
                first,
                find(&again, &r.sample.op, &r.storage),
            ) {
                (NODE, Some(a), Some(b)) => Some((a + b) / 2.0),
                _ => first,
            };
            r.floor = r.concurrency.and(floor);
        }
    }

    /// The table, as printed.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "{:<26} {:<7} {:<46} {:>5} {:>8} {:>10} {:>9} {:>9} {:>7} {:>7} {:>8}\n",
            "setup",
            "storage",
            "operation",
            "conc",
            "n",
            "op/s",
            "p50 ms",
            "p99 ms",
            "x nat",
            "x floor",
            "fuel/op"
        ));
        for r in &self.rows {
            out.push_str(&format!(
                "{:<26} {:<7} {:<46} {:>5} {:>8} {:>10.0} {:>9.3} {:>9.3} {:>7} {:>7} {:>8}\n",
                r.setup,
                r.storage,
                r.sample.op,
                r.concurrency.map_or("-".to_string(), |c| c.to_string()),
                r.sample.n,
                r.sample.per_s,
                r.sample.p50_ms,
                r.sample.p99_ms,
                r.ratio().map_or("-".to_string(), |x| format!("{x:.2}")),
                r.floor_ratio()
                    .map_or("-".to_string(), |x| format!("{x:.3}")),
                r.sample
                    .fuel_per_op
                    .map_or("-".to_string(), |f| format!("{:.2}M", f as f64 / 1e6))
            ));
        }
        for r in self.rows.iter().filter(|r| !r.note.is_empty()) {
            out.push_str(&format!(
                "note: {} c={:?}: {}\n",
                r.setup, r.concurrency, r.note
            ));
        }
        for (k, v) in &self.extra {
            out.push_str(&format!("{k}: {v}\n"));
        }
        out
    }

    /// The results as JSON (`target/bench/results.json`), `head` first.
    pub fn json(&self, mut head: serde_json::Map<String, Json>) -> Vec<u8> {
        let rows: Vec<Json> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "setup": r.setup,
                    "storage": r.storage,
                    "operation": r.sample.op,
                    "concurrency": r.concurrency,
                    "n": r.sample.n,
                    "per_second": r.sample.per_s,
                    "p50_ms": r.sample.p50_ms,
                    "p99_ms": r.sample.p99_ms,
                    "ratio_to_native": r.ratio(),
                    "ratio_to_floor": r.floor_ratio(),
                    "wasm_fuel_per_op": r.sample.fuel_per_op,
                    "note": r.note,
                })
            })
            .collect();
        head.insert("rows".into(), Json::Array(rows));
        for (k, v) in &self.extra {
            head.insert(k.clone(), v.clone());
        }
        serde_json::to_vec_pretty(&Json::Object(head)).unwrap_or_default()
    }
}
