//! The fuzz targets on stable, so they cannot rot: each over a spread of its seeds and a
//! fixed number of deterministic mutations, and every saved regression.

use relay_fuzz::{inputs_in, regressions_dir, replay, target, Replayed, TARGETS};
use std::time::Instant;

/// (target, seeds, mutations): each a second or two in release; the seeds are spread
/// over the whole corpus, the mutations come from a fixed RNG seed.
const BUDGET: [(&str, usize, usize); 4] = [
    ("json", 600, 150_000),
    ("objects", 400, 50_000),
    ("frame", 200, 100_000),
    ("engine", 100, 2_000),
];

fn run(name: &str) {
    let (_, seeds, mutations) = BUDGET
        .iter()
        .find(|b| b.0 == name)
        .copied()
        .expect("budget");
    let started = Instant::now();
    let r = replay(name, seeds, mutations, 19);
    assert!(r.seeds > 0);
    assert_eq!(
        r,
        Replayed {
            seeds: r.seeds,
            mutations
        }
    );
    eprintln!(
        "{name}: {} seeds, {mutations} mutations in {:.2} s",
        r.seeds,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn json_target_replays() {
    run("json");
}

#[test]
fn objects_target_replays() {
    run("objects");
}

#[test]
fn frame_target_replays() {
    run("frame");
}

#[test]
fn engine_target_replays() {
    run("engine");
}

/// The cargo-fuzz package (built only with nightly) has one binary per target, each calling it.
#[test]
fn the_cargo_fuzz_package_lists_every_target() {
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    assert!(manifest.contains("cargo-fuzz = true"));
    for (name, _) in TARGETS {
        assert!(
            manifest.contains(&format!(
                "name = \"{name}\"\npath = \"fuzz_targets/{name}.rs\""
            )),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
        let src = std::fs::read_to_string(fuzz.join(format!("fuzz_targets/{name}.rs")))
            .unwrap_or_else(|e| panic!("fuzz_targets/{name}.rs: {e}"));
        assert!(
            src.contains(&format!("relay_fuzz::{name}(data)")),
            "{name}.rs calls another target"
        );
    }
}

#[test]
fn every_target_has_a_budget_and_seeds() {
    for (name, _) in TARGETS {
        assert!(
            BUDGET.iter().any(|b| b.0 == name),
            "{name} has no replay budget"
        );
        assert!(
            !relay_fuzz::seeds::seeds(name).is_empty(),
            "{name} has no seeds"
        );
    }
}

#[test]
fn the_vectors_seed_the_corpus() {
    assert!(
        relay_fuzz::seeds::vectors_dir().is_some(),
        "../shared/vectors not found (set RELAY_VECTORS)"
    );
    // The JSONTestSuite alone has 318 parsing cases.
    assert!(relay_fuzz::seeds::seeds("json").len() > 318);
}

/// Fixed findings: each must pass now and stay passing.
#[test]
fn regressions_pass() {
    for (name, run) in TARGETS {
        for (file, data) in inputs_in(&regressions_dir().join(name)) {
            eprintln!("regression {name}/{file}");
            run(&data);
        }
    }
}

/// Findings the core has not fixed yet: `cargo test -p relay-fuzz -- --ignored` lists them.
#[test]
#[ignore = "open findings fail until the core fixes them"]
fn open_findings_still_fail() {
    let mut failing = Vec::new();
    for (name, _) in TARGETS {
        let run = target(name).expect("target");
        for (file, data) in inputs_in(&regressions_dir().join("open").join(name)) {
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                failing.push(format!("{name}/{file}"));
            }
        }
    }
    assert!(
        failing.is_empty(),
        "open findings that still fail: {failing:?}"
    );
}

/// The JSON target's independent number writer agrees with the official ES6 number file.
#[test]
fn the_reference_number_writer_matches_the_es6_file() {
    let dir = relay_fuzz::seeds::vectors_dir().expect("vectors");
    let text = std::fs::read_to_string(
        dir.join("cyberphone-json-canonicalization/es6numbers/es6testfile-first10k.txt"),
    )
    .expect("es6 numbers");
    let mut n = 0;
    for line in text.lines() {
        let (bits, expected) = line.split_once(',').expect("hex,text");
        let f = f64::from_bits(u64::from_str_radix(bits, 16).expect("hex"));
        if f.is_finite() {
            assert_eq!(relay_fuzz::json_target::es_number(f), expected, "{bits}");
            n += 1;
        }
    }
    assert!(n > 9000, "{n}");
}
