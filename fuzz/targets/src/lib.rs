//! relay-fuzz: the fuzz targets of the relay core, as plain functions that build on stable.
//!
//! # Layout
//!
//! Two packages, because cargo-fuzz and the workspace want different things:
//!
//! - `fuzz/targets/` is this crate, `relay-fuzz`, a member of the root workspace.
//!   Every target's logic and oracle lives here as `pub fn TARGET(data: &[u8])`
//!   ([`json`], [`objects`], [`frame`], [`engine`]), with the seed corpus
//!   ([`seeds`]) and a stable replay ([`replay`]), so `cargo test --workspace` and
//!   clippy build and run the targets on the pinned stable toolchain and they
//!   cannot rot.
//! - `fuzz/` is the package cargo-fuzz runs (`[package.metadata] cargo-fuzz = true`,
//!   one `[[bin]]` per target in `fuzz/fuzz_targets/`, each a `fuzz_target!` that
//!   calls the function here). It depends on `libfuzzer-sys` and is built only by
//!   `cargo +nightly fuzz` with sanitizer instrumentation, so it is its own
//!   workspace and the root workspace excludes it; it in turn excludes `targets/`,
//!   which belongs to the root workspace. Its lock file is not kept: `./x` copies
//!   the root `Cargo.lock` over it before each use, so the fuzzed code is built from
//!   the same versions as the tests. This crate spells out its dependencies instead
//!   of inheriting them, because Cargo resolves a path dependency's
//!   `workspace = true` through the nearest workspace root above it, which for
//!   `fuzz/targets/` is `fuzz/` when cargo-fuzz builds.
//!
//! # Running
//!
//! - `./x fuzz [SECONDS]`: installs nightly and cargo-fuzz when missing, writes
//!   the seeds into `target/fuzz-corpus/TARGET/` (`relay-fuzz seed DIR`), and runs
//!   each target for SECONDS with libFuzzer over that corpus; crashes land in
//!   `fuzz/artifacts/TARGET/` (ignored by git). The targets are built with debug
//!   assertions (overflow checks) and without a sanitizer by default: the core and
//!   its parsers are safe Rust, the oracle is a panic, and AddressSanitizer halves
//!   the executions (`FUZZ_SANITIZER=address ./x fuzz` turns it on).
//! - `./x test` runs `tests/replay.rs`: each target over its first seeds and a fixed
//!   number of deterministic mutations, plus every file in `fuzz/regressions/TARGET/`.
//! - `cargo run --release -p relay-fuzz -- run TARGET FILE...` replays files on
//!   stable (a crash reproduces as a panic with its message).
//!
//! # Findings
//!
//! A minimized crash the core has not fixed yet is kept in
//! `fuzz/regressions/open/TARGET/` with a note of what it shows; the ignored test
//! `open_findings_still_fail` lists which still fail. Once fixed, it moves to
//! `fuzz/regressions/TARGET/`, which the default replay runs every time.

#![warn(missing_docs)]

pub mod engine_target;
mod frame_target;
pub mod input;
pub mod json_target;
pub mod mutate;
mod object_target;
pub mod seeds;

pub use engine_target::engine;
pub use frame_target::frame;
pub use json_target::json;
pub use object_target::objects;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::path::PathBuf;

/// A fuzz target: takes any bytes, panics when an invariant does not hold.
pub type Target = fn(&[u8]);

/// Every target by name, in the order `./x fuzz` runs them.
pub const TARGETS: [(&str, Target); 4] = [
    ("json", json),
    ("objects", objects),
    ("frame", frame),
    ("engine", engine),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// `fuzz/regressions/` in this checkout.
pub fn regressions_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../regressions")
}

/// Files directly in `dir`, sorted by name (none if it does not exist); notes (`*.md`) skipped.
pub fn inputs_in(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .flatten()
        .filter(|e| e.path().is_file())
        .filter(|e| e.path().extension().is_none_or(|x| x != "md"))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            std::fs::read(e.path()).ok().map(|b| (name, b))
        })
        .collect();
    out.sort();
    out
}

/// What a replay ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Seeds run as they are.
    pub seeds: usize,
    /// Mutated inputs run.
    pub mutations: usize,
}

/// Runs `name` over its first `seeds` seeds and `mutations` mutations of them (RNG seeded
/// with `rng_seed`, so every run is the same); panics as the target does.
pub fn replay(name: &str, seeds: usize, mutations: usize, rng_seed: u64) -> Replayed {
    let run = target(name).unwrap_or_else(|| panic!("no fuzz target {name:?}"));
    let corpus = seeds::seeds(name);
    assert!(!corpus.is_empty(), "{name}: no seeds");
    let n = seeds.min(corpus.len());
    // Spread the seeds taken over the whole corpus rather than its head.
    let step = corpus.len().div_ceil(n.max(1)).max(1);
    let mut ran = 0;
    for s in corpus.iter().step_by(step).take(n) {
        run(s);
        ran += 1;
    }
    let mut rng = ChaCha20Rng::seed_from_u64(rng_seed);
    for _ in 0..mutations {
        let a = &corpus[rng.gen_range(0..corpus.len())];
        let b = &corpus[rng.gen_range(0..corpus.len())];
        run(&mutate::mutate(&mut rng, a, b));
    }
    Replayed {
        seeds: ran,
        mutations,
    }
}
