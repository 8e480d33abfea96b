//! The benchmark's quick mode runs from the built workspace and reports every part the
//! performance issue names (a check that the benchmark works, not a figure: nothing here is
//! timed). Needs what `./x test` builds first: the component and the Node package.

use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Command;

fn rows(v: &Value) -> &[Value] {
    v["rows"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn has(rows: &[Value], setup: &str, storage: &str, operation: &str) -> bool {
    rows.iter()
        .any(|r| r["setup"] == setup && r["storage"] == storage && r["operation"] == operation)
}

#[test]
fn quick_mode_reports_every_host_against_native_and_the_floor() {
    let out = std::env::temp_dir().join(format!("relay-bench-quick-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_relay-bench"))
        .args(["--quick", "--out"])
        .arg(&out)
        .status()
        .expect("relay-bench runs");
    assert!(status.success(), "relay-bench --quick: {status}");
    let text = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let v: Value = serde_json::from_str(&text).expect("results.json is JSON");
    assert_eq!(v["mode"], "quick");
    assert_eq!(
        v["command"],
        format!("./x bench --quick --out {}", out.display())
    );
    let rows = rows(&v);
    assert!(has(rows, "native floor", "-", "parse+JCS+SHA-256+verify"));
    // Federation: every pair, batched and single, each with its local baseline, its
    // federated rate and its latency at half that rate.
    for pair in ["wasmtime", "node", "edge", "mixed node -> wasmtime"] {
        for mode in ["batched", "single"] {
            let setup = format!("federation {pair}, {mode}");
            for op in [
                "message.send, local",
                "message.send to B, until B received all",
                "acceptance at A to acceptance at B",
            ] {
                assert!(has(rows, &setup, "sqlite", op), "no row {setup} {op}");
            }
        }
    }
    let ops = [
        "message.send",
        "message.deliver",
        "message.timeline.sync (50)",
    ];
    for setup in ["native engine", "wasmtime component", "node (wasm-bindgen)"] {
        for storage in ["memory", "sqlite"] {
            for op in ops {
                assert!(
                    has(rows, setup, storage, op),
                    "no row {setup} {storage} {op}"
                );
            }
        }
    }
    for r in rows {
        let setup = r["setup"].as_str().unwrap_or("");
        assert!(
            r["per_second"].as_f64().is_some_and(|x| x > 0.0),
            "a row without throughput: {r}"
        );
        if [
            "wasmtime component",
            "node (wasm-bindgen)",
            "wasmtime host, HTTP",
            "node host, HTTP",
        ]
        .contains(&setup)
        {
            assert!(
                r["ratio_to_native"].as_f64().is_some_and(|x| x > 0.0),
                "no ratio to native: {r}"
            );
        }
        if setup == "wasmtime component" {
            assert!(
                r["wasm_fuel_per_op"].as_u64().is_some_and(|f| f > 0),
                "no fuel: {r}"
            );
        }
        if setup.ends_with("HTTP") {
            assert!(r["p50_ms"].as_f64().is_some() && r["p99_ms"].as_f64().is_some());
            assert!(
                r["ratio_to_floor"].as_f64().is_some_and(|x| x > 0.0),
                "no ratio to the native floor: {r}"
            );
        }
    }
    for host in ["wasmtime host, HTTP", "node host, HTTP"] {
        let levels: BTreeSet<u64> = rows
            .iter()
            .filter(|r| r["setup"] == host)
            .filter_map(|r| r["concurrency"].as_u64())
            .collect();
        assert!(levels.len() >= 2, "{host}: levels {levels:?}");
    }
    let scale: Vec<&str> = rows
        .iter()
        .filter_map(|r| r["setup"].as_str())
        .filter(|s| s.starts_with("scale:"))
        .collect();
    assert!(!scale.is_empty(), "no scale rows");
    // The memory part, a line per host with its target; the scale-out targets beside the run.
    for host in ["wasmtime host, HTTP", "node host, HTTP", "edge host, HTTP"] {
        let key = format!("memory: {host} anonymous RSS MB at 0 / 2000 / 10000 sends");
        assert!(
            v[&key].as_str().is_some_and(|l| l.contains("target")),
            "no memory line {key:?}"
        );
    }
    for key in [
        "target: edge / wasmtime host, HTTP c=32 msg/s",
        "target: wasmtime shards 1 / 2 / 4, mesh, msg/s",
        "target: edge shards 1 / 2 / 4, mesh, msg/s",
    ] {
        assert!(v[key].as_str().is_some(), "no line {key:?}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
