//! The host's native verification (the `verify-ed25519` import) and the core's own give the
//! same verdict, error kind included, on every external Ed25519 vector; the host's SHA-256
//! (the `sha256` import) gives the core's digest.

use relay_core::wire::digest::{sha256_own, HOST_MIN_LEN};
use relay_core::wire::signature::{verify_own, SignatureError};
use relay_host_wasmtime::guest::{native_sha256, native_verdict, Verdict};
use std::path::PathBuf;

fn vectors() -> PathBuf {
    if let Ok(p) = std::env::var("RELAY_VECTORS") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors");
    assert!(p.is_dir(), "test vectors not found at {}", p.display());
    p
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Both paths on one input; returns whether it verified.
fn same_verdict(pk: &[u8], msg: &[u8], sig: &[u8], what: &str) -> bool {
    let host = native_verdict(pk, msg, sig);
    let (Ok(k), Ok(s)) = (<&[u8; 32]>::try_from(pk), <&[u8; 64]>::try_from(sig)) else {
        // The core never asks with other shapes; the host declines them, so the core decides.
        assert!(matches!(host, Verdict::Declined), "{what}: {host:?}");
        return false;
    };
    let own = verify_own(k, msg, s);
    let expected = match own {
        Ok(()) => Verdict::Valid,
        Err(SignatureError::InvalidKey) => Verdict::InvalidKey,
        Err(SignatureError::Mismatch) => Verdict::Mismatch,
    };
    assert_eq!(host, expected, "{what}: host and core disagree");
    own.is_ok()
}

fn read(rel: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(vectors().join(rel)).expect("read")).expect("json")
}

#[test]
fn wycheproof_through_both_paths() {
    let doc = read("wycheproof/ed25519_test.json");
    let mut n = 0;
    for group in doc["testGroups"].as_array().expect("groups") {
        let pk = hex(group["publicKey"]["pk"].as_str().expect("pk"));
        for t in group["tests"].as_array().expect("tests") {
            let ok = same_verdict(
                &pk,
                &hex(t["msg"].as_str().expect("msg")),
                &hex(t["sig"].as_str().expect("sig")),
                &format!("tcId {}", t["tcId"]),
            );
            assert_eq!(ok, t["result"] == "valid", "tcId {}", t["tcId"]);
            n += 1;
        }
    }
    assert_eq!(n, 151);
}

#[test]
fn rfc8032_through_both_paths() {
    let doc = read("rfc8032/rfc8032_ed25519_7.1.json");
    for t in doc["tests"].as_array().expect("tests") {
        let name = t["name"].as_str().expect("name");
        let pk = hex(t["public_key"].as_str().expect("pk"));
        let msg = hex(t["message"].as_str().expect("msg"));
        let sig = hex(t["signature"].as_str().expect("sig"));
        assert!(same_verdict(&pk, &msg, &sig, name), "{name}");
        let mut bad = msg.clone();
        bad.push(0);
        assert!(!same_verdict(&pk, &bad, &sig, name), "{name}: altered");
    }
}

/// The import's four big-endian words, as the component reassembles them.
fn words_to_bytes((a, b, c, d): (u64, u64, u64, u64)) -> Vec<u8> {
    [a, b, c, d].iter().flat_map(|w| w.to_be_bytes()).collect()
}

#[test]
fn sha256_through_the_host_is_the_cores() {
    // FIPS 180-2, appendix B.1.
    assert_eq!(
        words_to_bytes(native_sha256(b"abc")),
        hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    );
    let data: Vec<u8> = (0..4 * HOST_MIN_LEN as u32)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    for len in 0..data.len() {
        let d = &data[..len];
        assert_eq!(
            words_to_bytes(native_sha256(d)),
            sha256_own(d).to_vec(),
            "length {len}"
        );
    }
}
