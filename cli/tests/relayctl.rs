//! relayctl canonicalize and verify, run as a person would run them.

use rand::SeedableRng;
use relay_core::client::draft;
use relay_core::client::{random_id, AccountKey, DeviceKey};
use relay_core::wire::canonical;
use relay_core::wire::json::{Object, Value};
use std::io::Write;
use std::process::{Command, Stdio};

fn run(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_relayctl"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relayctl");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn text(o: &Object) -> Vec<u8> {
    canonical::to_vec(&Value::Object(o.clone()))
}

#[test]
fn canonicalize_prints_rfc8785_and_rejects_invalid_ijson() {
    let (rc, out, _) = run(
        &["canonicalize"],
        br#"{ "b": [1.0, 1e21, "\u00e9"], "a": null }"#,
    );
    assert_eq!(rc, 0);
    assert_eq!(out, "{\"a\":null,\"b\":[1,1e+21,\"\u{e9}\"]}");
    let (rc, out, err) = run(&["canonicalize"], br#"{"a":1,"a":2}"#);
    assert_eq!(rc, 2);
    assert!(out.is_empty());
    assert!(err.contains("duplicate key \"a\""), "{err}");
    let (rc, _, err) = run(&["canonicalize"], br#"["\uD800"]"#);
    assert_eq!(rc, 2);
    assert!(err.contains("surrogate"), "{err}");
}

#[test]
fn verify_says_valid_or_names_the_failing_check() {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
    let account = AccountKey::generate(&mut rng);
    let device = DeviceKey::generate(&mut rng);
    let cert = draft::certificate("dev", &account, &device, &["send"], 1_000).sign(&account);
    let (rc, out, _) = run(&["verify"], &text(&cert));
    assert_eq!(rc, 0, "{out}");
    assert!(out.starts_with("valid: device_certificate"), "{out}");

    let mut tampered = cert.clone();
    tampered.insert("issued_at", 1_001u64);
    let (rc, out, _) = run(&["verify"], &text(&tampered));
    assert_eq!(rc, 1);
    assert!(out.starts_with("invalid: invalid_signature"), "{out}");

    let (rc, out, _) = run(&["verify", "--network", "main"], &text(&cert));
    assert_eq!(rc, 1);
    assert!(out.starts_with("invalid: invalid_certificate"), "{out}");

    // An envelope needs the signing device's certificate.
    let to = AccountKey::generate(&mut rng).id();
    let env = draft::envelope(
        "dev",
        &random_id(&mut rng),
        &account.id(),
        &device.id(),
        &to,
        2_000,
        Object::new(),
    )
    .sign(&device);
    let (rc, out, _) = run(&["verify"], &text(&env));
    assert_eq!(rc, 1);
    assert!(out.contains("--certificate"), "{out}");
    let dir = std::env::temp_dir().join(format!("relayctl-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert_path = dir.join("cert.json");
    std::fs::write(&cert_path, text(&cert)).unwrap();
    let (rc, out, _) = run(
        &["verify", "--certificate", cert_path.to_str().unwrap()],
        &text(&env),
    );
    assert_eq!(rc, 0, "{out}");
    assert!(out.starts_with("valid: message_envelope"), "{out}");
    let forged = draft::envelope(
        "dev",
        &random_id(&mut rng),
        &account.id(),
        &device.id(),
        &to,
        2_000,
        Object::new(),
    )
    .sign(&account);
    let (rc, out, _) = run(
        &["verify", "--certificate", cert_path.to_str().unwrap()],
        &text(&forged),
    );
    assert_eq!(rc, 1);
    assert!(out.starts_with("invalid: invalid_signature"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}
