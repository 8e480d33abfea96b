//! TLS both ways (issue 18): relays on a network other than `dev` (`testnet`) whose ids
//! are `https://localhost:PORT`, serving HTTPS and WSS with certificates from a test CA
//! made here (rcgen), trusting that CA for their outbound https (`--ca`), and allowed
//! to reach loopback peers (`--allow-private-peers`). A message goes each way for every
//! ordered pair of hosts, over TLS only; a relay that does not trust the CA delivers
//! nothing; plain HTTP on a TLS port gets no answer.

use relay_core::wire::json::Value;
use relay_tests::live::client::{status_of, Client, User};
use relay_tests::live::host::{free_port, Kind, Opts, Relay};
use relay_tests::{field, Msg};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// A CA and one server certificate it signed (for `localhost`, 127.0.0.1 and ::1), as
/// PEM files in a directory of their own.
struct TestCa {
    dir: PathBuf,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl TestCa {
    fn make(name: &str) -> TestCa {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let dir = std::env::temp_dir().join(format!("relay-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("relay test CA {name}"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let leaf_key = KeyPair::generate().expect("a server key");
        let mut leaf = CertificateParams::new(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ])
        .unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, "localhost");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let leaf_cert = leaf
            .signed_by(&leaf_key, &issuer)
            .expect("the server certificate");
        let t = TestCa {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            dir,
        };
        std::fs::write(&t.ca, ca_cert.pem()).unwrap();
        std::fs::write(&t.cert, leaf_cert.pem()).unwrap();
        std::fs::write(&t.key, leaf_key.serialize_pem()).unwrap();
        t
    }

    /// The CA's certificate (DER) for a rustls client.
    fn root(&self) -> rustls::RootCertStore {
        let pem = std::fs::read(&self.ca).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for item in ureq::tls::parse_pem(&pem) {
            if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
                roots
                    .add(rustls::pki_types::CertificateDer::from(c.der().to_vec()))
                    .unwrap();
            }
        }
        roots
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A relay of `kind` on `testnet` with id `https://localhost:PORT`, serving TLS with the
/// CA's certificate and trusting the CA for its outbound https.
fn tls_relay(kind: Kind, t: &TestCa) -> Relay {
    let port = free_port();
    let opts = Opts {
        network: Some("testnet".into()),
        url: Some(format!("https://localhost:{port}")),
        tls: Some((t.cert.clone(), t.key.clone())),
        ca: Some(t.ca.clone()),
        ..Opts::default()
    }
    .flag("allow-private-peers", "");
    Relay::start_at(kind, port, opts)
}

/// A message from `from` to `to` (whose route `from`'s relay holds) is accepted by the
/// destination and is in the recipient's timeline.
fn deliver(c: &mut Client, from: &User, to: &User, text: &str) {
    let m = c.message(from, to, text, &Msg::default());
    let id = field(&Value::Object(m.clone()), "envelope")
        .and_then(|e| field(e, "message_id"))
        .and_then(Value::as_str)
        .unwrap()
        .to_string();
    let (s, v) = c.send(from, &m);
    assert_eq!(s, 200, "message.send: {v:?}");
    let v = c.wait_terminal(from, &id, WAIT);
    assert_eq!(status_of(&v), "target_accepted", "{text}: {v:?}");
    assert!(
        c.texts(to, 0)
            .iter()
            .any(|(_, mid, t)| *mid == id && t == text),
        "{text} is not in the recipient's timeline"
    );
}

/// A WSS connection for device 0 of `u` (at a TLS relay), trusting the test CA.
fn wss(
    t: &TestCa,
    u: &User,
) -> tungstenite::WebSocket<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(t.root())
    .with_no_client_auth();
    let hostport = u.api.strip_prefix("https://").unwrap().to_string();
    let tcp = TcpStream::connect(&hostport).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_millis(200))).ok();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let stream = rustls::StreamOwned::new(conn, tcp);
    let url = format!("wss://{hostport}/v1/ws?session={}", u.sessions[0]);
    let (ws, resp) = tungstenite::client(url.as_str(), stream).expect("the WSS upgrade");
    assert_eq!(resp.status().as_u16(), 101);
    ws
}

/// Reads the socket until a notification for the account arrives (or `within` passes).
fn notified(
    ws: &mut tungstenite::WebSocket<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
    within: Duration,
) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        match ws.read() {
            Ok(tungstenite::Message::Text(t)) => {
                if let Ok(v) = relay_core::wire::json::parse(t.as_bytes()) {
                    if field(&v, "method").is_some() && field(&v, "id").is_none() {
                        return true;
                    }
                }
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("WSS: {e}"),
        }
    }
    false
}

/// Plain HTTP sent to a TLS port gets no HTTP answer.
fn plain_http_gets_no_answer(r: &Relay) {
    let mut s = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).ok();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(
        !text.contains("200") || !text.starts_with("HTTP/1.1 200"),
        "the {} relay answered plain HTTP on its TLS port: {text}",
        r.kind.name()
    );
}

fn both_ways(ka: Kind, kb: Kind) {
    let t = TestCa::make(&format!("{}-{}", ka.name(), kb.name()));
    let a = tls_relay(ka, &t);
    let b = tls_relay(kb, &t);
    assert!(a.id().starts_with("https://localhost:") && a.api().starts_with("https://"));
    let mut c = Client::on(1800 + ka as u64 * 2 + kb as u64, &a.opts);
    let alice = c.register(&a, true);
    let bob = c.register(&b, true);
    c.publish(&a, &bob);
    c.publish(&b, &alice);
    let mut bob_ws = wss(&t, &bob);
    deliver(
        &mut c,
        &alice,
        &bob,
        &format!("over TLS {} to {}", ka.name(), kb.name()),
    );
    assert!(
        notified(&mut bob_ws, Duration::from_secs(10)),
        "no notification over WSS at the {} relay",
        kb.name()
    );
    deliver(
        &mut c,
        &bob,
        &alice,
        &format!("over TLS {} to {}", kb.name(), ka.name()),
    );
    plain_http_gets_no_answer(&a);
    plain_http_gets_no_answer(&b);
}

/// A relay that does not trust the test CA (no `--ca`; it serves plain HTTP to its own
/// clients) cannot deliver to a TLS relay whose certificate that CA signed: its attempts
/// fail the handshake, and nothing arrives.
fn untrusted(ka: Kind, kb: Kind) {
    let t = TestCa::make(&format!("untrusted-{}-{}", ka.name(), kb.name()));
    let port = free_port();
    let opts = Opts {
        network: Some("testnet".into()),
        url: Some(format!("https://localhost:{port}")),
        ..Opts::default()
    }
    .flag("allow-private-peers", "");
    let a = Relay::start_at(ka, port, opts);
    let b = tls_relay(kb, &t);
    let mut c = Client::on(1900 + ka as u64 * 2 + kb as u64, &b.opts);
    let alice = c.register(&a, true);
    let bob = c.register(&b, true);
    c.publish(&a, &bob);
    let m = c.message(&alice, &bob, "must not arrive", &Msg::default());
    let (s, v) = c.send(&alice, &m);
    assert_eq!(s, 200, "{v:?}");
    std::thread::sleep(Duration::from_secs(4));
    let texts = c.texts(&bob, 0);
    assert!(
        texts.iter().all(|(_, _, t)| t != "must not arrive"),
        "the {} relay delivered over TLS without trusting the CA",
        ka.name()
    );
    // A failed handshake sent none of the request: every host reports the attempt not
    // attempted (the core's rule for an exchange that never reached the peer), not unknown.
    let (status, metrics) = c.http.get(&format!("{}/metrics", a.admin_api()));
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&metrics);
    let count = |outcome: &str| -> u64 {
        let line = format!("relay_delivery_attempts_total{{outcome=\"{outcome}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |n| n.trim().parse().unwrap_or(0))
    };
    assert!(
        count("not_attempted") >= 1 && count("unknown") == 0,
        "the {} relay's attempts through a failed handshake: not_attempted {}, unknown {}",
        ka.name(),
        count("not_attempted"),
        count("unknown")
    );
}

macro_rules! pair {
    ($name:ident, $f:ident, $a:expr, $b:expr) => {
        #[test]
        fn $name() {
            $f($a, $b);
        }
    };
}

pair!(
    tls_wasmtime_to_wasmtime,
    both_ways,
    Kind::Wasmtime,
    Kind::Wasmtime
);
pair!(tls_node_to_node, both_ways, Kind::Node, Kind::Node);
pair!(tls_wasmtime_to_node, both_ways, Kind::Wasmtime, Kind::Node);
pair!(tls_node_to_wasmtime, both_ways, Kind::Node, Kind::Wasmtime);
pair!(
    untrusted_ca_wasmtime_to_node,
    untrusted,
    Kind::Wasmtime,
    Kind::Node
);
pair!(
    untrusted_ca_node_to_wasmtime,
    untrusted,
    Kind::Node,
    Kind::Wasmtime
);
