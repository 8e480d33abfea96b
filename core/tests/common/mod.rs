//! Shared helpers for the core's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The external test vectors: `../shared/vectors` beside the checkout (or `$RELAY_VECTORS`).
pub fn vectors() -> PathBuf {
    if let Ok(p) = std::env::var("RELAY_VECTORS") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors");
    assert!(
        p.is_dir(),
        "test vectors not found at {} (set RELAY_VECTORS)",
        p.display()
    );
    p
}

/// Decodes hex.
pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}
