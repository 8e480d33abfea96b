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
    Ok(run_on(&Runtime::node(), root, fx, syncs, scratch)?
        .into_iter()
        .map(|(storage, _, s)| (storage, s))
        .collect())
}

/// A JavaScript runtime the package runs on, and how the bench starts it.
pub struct Runtime {
    /// Its row name (`node 22`, `deno 2`, ...).
    pub name: String,
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Runtime {
    /// This machine's `node`.
    pub fn node() -> Runtime {
        Runtime {
            name: "node".into(),
            program: "node".into(),
            args: vec![],
            env: vec![],
        }
    }

    /// The runtimes the package's test installs from the npm registry into
    /// `host-node/runtimes` (installed here when missing), after this machine's Node 20.
    pub fn all(root: &Path) -> anyhow::Result<Vec<Runtime>> {
        let dir = root.join("host-node/runtimes");
        if !dir.join("node_modules/.package-lock.json").exists() {
            let ok = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&dir)
                .status()?
                .success();
            anyhow::ensure!(ok, "npm ci in host-node/runtimes failed");
        }
        let bin = |p: &str| dir.join("node_modules").join(p);
        let plain = |name: &str, program| Runtime {
            name: name.into(),
            program,
            args: vec![],
            env: vec![],
        };
        Ok(vec![
            plain("node 20", "node".into()),
            Runtime {
                name: "node 20, wasm crypto".into(),
                env: vec![
                    ("RELAY_OWN_VERIFY".into(), "1".into()),
                    ("RELAY_OWN_SHA256".into(), "1".into()),
                ],
                ..plain("", "node".into())
            },
            plain("node 22", bin("node22/bin/node")),
            plain("node 24", bin("node24/bin/node")),
            plain("node 26", bin("node26/bin/node")),
            Runtime {
                args: vec!["run".into(), "-A".into()],
                ..plain("deno 2", bin("deno/deno"))
            },
            plain("bun 1", bin("bun/bin/bun")),
        ])
    }
}

/// Runs the in-process bench on `rt`; samples per storage (`memory`, `sqlite`) with the
/// SQLite driver each ran on.
pub fn run_on(
    rt: &Runtime,
    root: &Path,
    fx: &Fixture,
    syncs: usize,
    scratch: &Path,
) -> anyhow::Result<Vec<(String, Option<String>, Sample)>> {
    std::fs::create_dir_all(scratch)?;
    let file = scratch.join("fixture.json");
    std::fs::write(&file, fx.to_json())?;
    let out = Command::new(&rt.program)
        .args(&rt.args)
        .envs(rt.env.iter().map(|(k, v)| (k, v)))
        .current_dir(root.join("host-node"))
        .arg(root.join("host-node/bench/inprocess.js"))
        .arg(&file)
        .arg(scratch.join("node-sqlite"))
        .arg(syncs.to_string())
        .output()
        .map_err(|e| anyhow::anyhow!("node: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{} inprocess.js failed: {}",
        rt.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut samples = Vec::new();
    for r in v.as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        samples.push((
            r["storage"].as_str().unwrap_or("").to_string(),
            r["driver"].as_str().map(str::to_owned),
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
