//! The seed corpus: the external vectors, read from `../shared/vectors` at run time, and
//! inputs made by the project's own builders. Nothing here is a copy of a vector.
//!
//! - json: every JSONTestSuite `test_parsing` and `test_transform` case, the RFC 8785
//!   reference inputs and outputs, a sample of the ES6 number file as JSON numbers, the
//!   Ed25519 vector files themselves (JSON documents), and the canonical text of every
//!   builder object plus hand-picked edges (depth 32 and 33, duplicates, escapes);
//! - objects: every signed protocol object from the builders (valid, with unknown
//!   members, with a defect), message.send and message.deliver params, relay request
//!   headers, a well-known document, a config; objects signed by the RFC 8032 keys; and
//!   objects carrying the Wycheproof, RFC 8032 and speccheck public keys and signatures
//!   (strict verification's rejection paths);
//! - frame: request frames around those params with every kind of id, and JSONTestSuite;
//! - engine: scripted programs (each method from its natural caller; sends across and
//!   within relays followed by carrying, ticks and syncs) and seeded random programs.

use crate::engine_target::{CHUNK, METHODS};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use relay_core::client::{draft, seal, AccountKey, DeviceKey, Signer};
use relay_core::engine::Config;
use relay_core::wire::identity::RelayId;
use relay_core::wire::json::{self, Object, Value};
use relay_core::wire::{base64url, canonical, relay_request};
use std::fs;
use std::path::{Path, PathBuf};

/// The fuzz targets, by name.
pub const TARGET_NAMES: [&str; 4] = ["json", "objects", "frame", "engine"];

const NET: &str = "dev";
const T0: u64 = 1_800_000_000_000;

/// `../shared/vectors` beside the checkout (or `$RELAY_VECTORS`), if it is there.
pub fn vectors_dir() -> Option<PathBuf> {
    let p = match std::env::var_os("RELAY_VECTORS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors"),
    };
    p.is_dir().then_some(p)
}

/// The seeds of `target`, in a fixed order.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "json" => json_seeds(),
        "objects" => object_seeds(),
        "frame" => frame_seeds(),
        "engine" => engine_seeds(),
        other => panic!("no fuzz target {other:?}"),
    }
}

/// Writes every target's seeds into `dir/TARGET/`; returns the count per target.
pub fn write_corpus(dir: &Path) -> std::io::Result<Vec<(&'static str, usize)>> {
    let mut counts = Vec::new();
    for target in TARGET_NAMES {
        let d = dir.join(target);
        fs::create_dir_all(&d)?;
        let seeds = seeds(target);
        for (i, s) in seeds.iter().enumerate() {
            fs::write(d.join(format!("seed-{i:05}")), s)?;
        }
        counts.push((target, seeds.len()));
    }
    Ok(counts)
}

/// Files under `dir` (recursively), sorted, at most `max_len` bytes each.
fn files(dir: &Path, max_len: u64) -> Vec<Vec<u8>> {
    let mut paths = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.metadata().is_ok_and(|m| m.len() <= max_len) {
                paths.push(p);
            }
        }
    }
    paths.sort();
    paths.into_iter().filter_map(|p| fs::read(p).ok()).collect()
}

fn read_json(rel: &str) -> Option<Value> {
    let bytes = fs::read(vectors_dir()?.join(rel)).ok()?;
    json::parse(&bytes).ok()
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn str_of<'v>(v: &'v Value, k: &str) -> Option<&'v str> {
    v.as_object()?.get(k)?.as_str()
}

/// (public key, signature) pairs of the Ed25519 vectors: RFC 8032, Wycheproof, speccheck.
fn ed25519_pairs() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    if let Some(Value::Object(o)) = read_json("rfc8032/rfc8032_ed25519_7.1.json") {
        for t in array(o.get("tests")) {
            if let (Some(pk), Some(sig)) = (str_of(t, "public_key"), str_of(t, "signature")) {
                out.extend(hex(pk).zip(hex(sig)));
            }
        }
    }
    if let Some(Value::Object(o)) = read_json("wycheproof/ed25519_test.json") {
        for g in array(o.get("testGroups")) {
            let pk = g
                .as_object()
                .and_then(|g| g.get("publicKey"))
                .and_then(|k| str_of(k, "pk"))
                .and_then(hex);
            let tests = g.as_object().and_then(|g| g.get("tests"));
            for t in array(tests) {
                out.extend(pk.clone().zip(str_of(t, "sig").and_then(hex)));
            }
        }
    }
    if let Some(Value::Array(cases)) = read_json("ed25519-speccheck/cases.json") {
        for c in &cases {
            out.extend(
                str_of(c, "pub_key")
                    .and_then(hex)
                    .zip(str_of(c, "signature").and_then(hex)),
            );
        }
    }
    out
}

/// The RFC 8032 secret keys (32-byte seeds), as account keys.
fn rfc8032_keys() -> Vec<AccountKey> {
    let Some(Value::Object(o)) = read_json("rfc8032/rfc8032_ed25519_7.1.json") else {
        return Vec::new();
    };
    array(o.get("tests"))
        .iter()
        .filter_map(|t| str_of(t, "secret_key").and_then(hex))
        .filter_map(|s| <[u8; 32]>::try_from(s).ok())
        .map(AccountKey::from_seed)
        .collect()
}

fn array(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Array(a)) => a,
        _ => &[],
    }
}

/// Signed objects made by the client builders, deterministic.
pub fn builder_objects() -> Vec<Object> {
    let mut rng = ChaCha20Rng::seed_from_u64(19);
    let alice = AccountKey::from_seed([1; 32]);
    let bob = AccountKey::from_seed([2; 32]);
    let phone = DeviceKey::from_seeds([3; 32], [4; 32]);
    let laptop = DeviceKey::from_seeds([5; 32], [6; 32]);
    let all = ["send", "sync", "manage"];
    let mut out = Vec::new();

    let cert = draft::certificate(NET, &alice, &phone, &all, T0).sign(&alice);
    out.push(cert.clone());
    out.push(
        draft::certificate(NET, &alice, &laptop, &["sync", "later"], T0)
            .set("expires_at", T0 + 86_400_000)
            .set(
                "x-unknown",
                Value::Array(vec![Value::Null, f64_text_value()]),
            )
            .sign(&alice),
    );
    out.push(draft::certificate(NET, &alice, &phone, &all, T0).sign(&phone));
    let route = draft::route(NET, &alice.id(), "http://a.test", 1, T0).sign(&alice);
    out.push(route.clone());
    out.push(draft::route("prod", &bob.id(), "https://relay.example:8443", 7, T0).sign(&bob));
    out.push(draft::route(NET, &bob.id(), "http://[::1]:9000", 2, T0).sign(&bob));

    let key = seal::message_key(&mut rng);
    let mut body = seal::seal_body(&mut rng, &key, b"hello");
    body.insert("x-test", "hello");
    let envelope = draft::envelope(
        NET,
        "AAAAAAAAAAAAAAAAAAAAAA",
        &alice.id(),
        &phone.id(),
        &bob.id(),
        T0,
        body,
    )
    .set("body_expires_at", T0 + 1000)
    .sign(&phone);
    out.push(envelope.clone());
    let key_box = seal::seal_key_box(&mut rng, &laptop.id(), &laptop.box_key(), &key);
    out.push(key_box.clone());
    let grant_route = draft::route(NET, &bob.id(), "http://b.test", 1, T0).sign(&bob);
    let grant = draft::grant(NET, "BBBBBBBBBBBBBBBBBBBBBB", &bob.id(), &alice.id(), T0)
        .set("route", grant_route)
        .sign(&bob);
    out.push(grant.clone());
    out.push(
        draft::invite(
            NET,
            "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCA",
            &bob.id(),
            T0,
            T0 + 1,
        )
        .set("max_uses", 3u64)
        .sign(&bob),
    );
    out.push(
        draft::session_open(
            NET,
            "http://a.test",
            &alice.id(),
            &phone.id(),
            T0,
            "DDDDDDDDDDDDDDDDDDDDDA",
        )
        .sign(&phone),
    );
    out.push(draft::revocation(NET, &alice.id(), &laptop.id(), T0).sign(&alice));

    let mut send = Object::new();
    send.insert("envelope", envelope.clone());
    send.insert("recipient_boxes", seal::boxes(vec![key_box.clone()]));
    send.insert(
        "sender_boxes",
        seal::boxes(vec![seal::seal_key_box(
            &mut rng,
            &phone.id(),
            &phone.box_key(),
            &key,
        )]),
    );
    send.insert("authorization", grant);
    send.insert("recipient_route", route);
    out.push(send);
    let mut deliver = Object::new();
    deliver.insert("envelope", envelope);
    deliver.insert("recipient_boxes", seal::boxes(vec![key_box]));
    deliver.insert("device_certificate", cert);
    deliver.insert("key", base64url::encode(&phone.public_key()));
    out.push(deliver);

    let a = RelayId::parse("http://a.test").expect("relay id");
    let b = RelayId::parse("http://b.test").expect("relay id");
    let body = br#"{"x":1}"#;
    let h = relay_request::sign(
        &[9; 32],
        NET,
        "message.deliver",
        &a,
        &b,
        T0,
        &[8; 16],
        body,
        Some(1),
    );
    let mut headers = Object::new();
    for (name, value) in h.pairs() {
        headers.insert(name, value);
    }
    headers.insert("body", String::from_utf8_lossy(body).into_owned());
    headers.insert(
        "key",
        base64url::encode(&relay_request::public_key(&[9; 32])),
    );
    out.push(headers);
    if let Value::Object(o) =
        relay_request::well_known(&a, NET, &[7; 32], Value::Object(Object::new()))
    {
        out.push(o);
    }
    if let Ok(Value::Object(o)) = json::parse(&Config::new(b, NET).to_json()) {
        out.push(o);
    }

    for k in rfc8032_keys() {
        out.push(draft::route(NET, &k.id(), "http://a.test", 1, T0).sign(&k));
        out.push(draft::certificate(NET, &k, &phone, &all, T0).sign(&k));
    }
    out
}

/// `1.5e300` as a JSON number value (a double in an unknown member).
fn f64_text_value() -> Value {
    json::parse(b"1.5e300").expect("number")
}

fn json_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    if let Some(v) = vectors_dir() {
        out.extend(files(&v.join("JSONTestSuite/test_parsing"), 64 * 1024));
        out.extend(files(&v.join("JSONTestSuite/test_transform"), 64 * 1024));
        out.extend(files(
            &v.join("cyberphone-json-canonicalization/input"),
            64 * 1024,
        ));
        out.extend(files(
            &v.join("cyberphone-json-canonicalization/output"),
            64 * 1024,
        ));
        for rel in [
            "rfc8032/rfc8032_ed25519_7.1.json",
            "ed25519-speccheck/cases.json",
        ] {
            out.extend(fs::read(v.join(rel)).ok());
        }
        let es6 = v.join("cyberphone-json-canonicalization/es6numbers/es6testfile-first10k.txt");
        if let Ok(text) = fs::read_to_string(es6) {
            // Every 50th line: the expected text is a JSON number (and the hex its bits).
            for line in text.lines().step_by(50) {
                if let Some((_, expected)) = line.split_once(',') {
                    out.push(format!("[{expected}]").into_bytes());
                }
            }
        }
    }
    for o in builder_objects() {
        out.push(canonical::object_to_vec(&o));
    }
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes();
    out.push(deep(32));
    out.push(deep(33));
    for edge in [
        r#"{"a":1,"a":1}"#,
        r#"{"\u00e9":1,"e\u0301":2,"\ud83d\ude00":3,"\uffff":4}"#,
        r#"["\u0000\u001f\"\\\/\b\f\n\r\t","\ud800"]"#,
        r#"[-0,0.0,1E400,1e-400,9007199254740993,18446744073709551616,-9223372036854775809]"#,
        r#"[1e21,1e-7,123456789012345680000,0.000001,5e-324]"#,
        "\u{feff}{}",
        r#"{"":{"":{"":[]}}}  "#,
    ] {
        out.push(edge.as_bytes().to_vec());
    }
    out
}

fn object_seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = builder_objects()
        .iter()
        .map(canonical::object_to_vec)
        .collect();
    // Arrays of boxes and raw header lines.
    for o in builder_objects() {
        if o.contains("enc") {
            let v = Value::Array(vec![Value::Object(o.clone()), Value::Object(o)]);
            out.push(canonical::to_vec(&v));
        }
    }
    out.push(b"http://a.test\n1800000000000\nCAgICAgICAgICAgICAgICA\nAAAA".to_vec());
    // The vectors' keys and signatures in the places a signed object carries them.
    let alice = AccountKey::from_seed([1; 32]);
    let phone = DeviceKey::from_seeds([3; 32], [4; 32]);
    for (pk, sig) in ed25519_pairs() {
        let (Ok(pk), true) = (<[u8; 32]>::try_from(pk.as_slice()), sig.len() <= 96) else {
            continue;
        };
        let account = relay_core::wire::identity::AccountId::from_key(pk);
        let route = draft::route(NET, &account, "http://a.test", 1, T0)
            .set("sig", base64url::encode(&sig))
            .unsigned();
        out.push(canonical::object_to_vec(&route));
        let cert = draft::certificate(NET, &alice, &phone, &["send"], T0)
            .set("device_key", base64url::encode(&pk))
            .set("sig", base64url::encode(&sig))
            .unsigned();
        out.push(canonical::object_to_vec(&cert));
    }
    out
}

fn frame_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let ids: [Value; 5] = [
        Value::from(1u64),
        Value::from("a".repeat(64)),
        Value::from("a".repeat(65)),
        Value::from(9_007_199_254_740_991u64),
        Value::Null,
    ];
    for (i, o) in builder_objects().into_iter().enumerate() {
        let mut f = Object::new();
        f.insert("id", ids[i % ids.len()].clone());
        f.insert("method", METHODS[i % METHODS.len()]);
        f.insert("params", o);
        out.push(canonical::object_to_vec(&f));
    }
    for raw in [
        r#"{"id":"x","method":"message.timeline.sync","params":{"after":0}}"#,
        r#"{ "params" : { "after" : 1.0 } , "method" : "m" , "id" : 7 }"#,
        r#"{"id":-0,"method":"m","params":{}}"#,
        r#"{"id":1,"method":"m","params":[]}"#,
        r#"{"id":1,"method":"m","params":{},"params":{}}"#,
    ] {
        out.push(raw.as_bytes().to_vec());
    }
    if let Some(v) = vectors_dir() {
        out.extend(
            files(&v.join("JSONTestSuite/test_parsing"), 4096)
                .into_iter()
                .step_by(4),
        );
    }
    out
}

/// One operation of an engine program: its first bytes, zero-padded to a chunk.
fn op(bytes: &[u8]) -> Vec<u8> {
    let mut c = bytes.to_vec();
    c.resize(CHUNK, 0);
    c
}

/// A call of method `m` (an index of [`METHODS`]) with these choice bytes after it.
fn call(m: usize, choices: &[u8]) -> Vec<u8> {
    let mut b = vec![0, m as u8];
    b.extend_from_slice(choices);
    op(&b)
}

const CARRY: [u8; 1] = [5];
const TICK: [u8; 1] = [6];
const ADVANCE_MINUTE: [u8; 2] = [7, 3];
const RESTART: [u8; 1] = [9];

fn engine_seeds() -> Vec<Vec<u8>> {
    let method = |name: &str| METHODS.iter().position(|m| *m == name).expect("method");
    let (send, sync, status) = (
        method("message.send"),
        method("message.timeline.sync"),
        method("message.delivery.status"),
    );
    let mut programs: Vec<Vec<Vec<u8>>> = Vec::new();
    // Each method once, from its natural caller with natural params.
    for m in 0..=METHODS.len() {
        programs.push(vec![call(m, &[])]);
    }
    // Sends from each account to each other (and a stranger), carried, then read back.
    for from in 0..4u8 {
        for to in 0..5u8 {
            programs.push(vec![
                call(send, &[from, 0, to]),
                op(&CARRY),
                op(&CARRY),
                op(&ADVANCE_MINUTE),
                op(&CARRY),
                call(status, &[]),
                call(sync, &[to, 0]),
                op(&RESTART),
                call(sync, &[from, 0]),
            ]);
        }
    }
    // A send with authorization and sender boxes, retried, across a tick.
    programs.push(vec![
        call(send, &[0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]),
        op(&TICK),
        call(send, &[1, 0]),
        op(&CARRY),
        call(sync, &[1, 0]),
    ]);
    let mut out: Vec<Vec<u8>> = programs
        .into_iter()
        .enumerate()
        .map(|(i, ops)| {
            let mut b = vec![i as u8];
            b.extend(ops.concat());
            b
        })
        .collect();
    let mut rng = ChaCha20Rng::seed_from_u64(1919);
    for i in 0..64 {
        let len = 1 + CHUNK * (1 + i % 12);
        let mut b = vec![0u8; len];
        rng.fill_bytes(&mut b);
        // Mostly calls: random op bytes would spend half the program on the network.
        for chunk in b[1..].chunks_mut(CHUNK) {
            chunk[0] %= 10;
        }
        out.push(b);
    }
    out
}
