//! The Node build in-process: `node host-node/bench/inprocess.js` over the same fixture.

use crate::fixture::Fixture;
use crate::report::Sample;
use std::path::Path;
use std::process::Command;

/// Runs the Node in-process bench; samples per storage (`memory`, `sqlite`).
pub fn run(
    root: &Path,
    fx: &Fixture,
    syncs: usize,
    scratch: &Path,
) -> anyhow::Result<Vec<(String, Sample)>> {
    std::fs::create_dir_all(scratch)?;
    let file = scratch.join("fixture.json");
    std::fs::write(&file, fx.to_json())?;
    let out = Command::new("node")
        .arg(root.join("host-node/bench/inprocess.js"))
        .arg(&file)
        .arg(scratch.join("node-sqlite"))
        .arg(syncs.to_string())
        .output()
        .map_err(|e| anyhow::anyhow!("node: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "node inprocess.js failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut samples = Vec::new();
    for r in v.as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        samples.push((
            r["storage"].as_str().unwrap_or("").to_string(),
            Sample {
                op: r["op"].as_str().unwrap_or("").to_string(),
                n: f("n") as usize,
                per_s: f("per_s"),
                p50_ms: f("p50_ms"),
                p99_ms: f("p99_ms"),
                fuel_per_op: None,
            },
        ));
    }
    Ok(samples)
}
