//! The hostile-input suite (issue 18): what an attacker with no account, or with a free
//! one (`account.register` is anonymous), can send a relay over raw TCP, HTTP and
//! WebSocket, run against each host. Each probe checks the agreed answer (README, "Facing
//! the internet") and ends by checking that the relay is still running, still answers
//! (`/healthz`, `route.get`) and still delivers a message within a few seconds.
//!
//! Every probe is one test per host (`probe_wasmtime`, `probe_node`), so a failure names
//! its host. The probes of what the relay itself decides (its answers, key fetches, peer
//! rules, secrets) run on the edge host too (`probe_edge`); those of sockets, WebSocket
//! framing and connection limits do not, since workerd (or Cloudflare) owns them there.
//! The limits are scaled down through the hosts' flags so the suite stays short.
//! `./x soak-hostile [SECONDS]` runs the same probes in a loop against one long-lived relay
//! of each host and prints their memory and descriptors every round (`soak` below, ignored
//! by `cargo test`).

use relay_core::transport::{Refusal, Response};
use relay_core::wire::base64url;
use relay_core::wire::canonical;
use relay_core::wire::json::{Object, Value};
use relay_tests::live::client::{code_of, status_of, Client, Socket, User};
use relay_tests::live::host::{Kind, Opts, Relay};
use relay_tests::live::proxy::now_ms;
use relay_tests::{field, Msg};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a relay may take, on a busy machine, beyond a limit it enforces.
const SLACK: Duration = Duration::from_millis(3500);
/// The bound on "still answers and delivers".
const LIVE: Duration = Duration::from_secs(5);
/// `max_request_bytes` of every relay here.
const MAX_REQUEST: usize = 65536;

// ---------------------------------------------------------------------------------------
// The relays and the liveness check.

/// What every hostile relay runs with: small requests, and no per-caller rate limits (the
/// probes are not about those, and the soak runs them many times from one address).
fn base() -> Opts {
    Opts::default()
        .policy("max_request_bytes", MAX_REQUEST as u64)
        .policy("anonymous_rate", 0)
        .policy("account_request_rate", 0)
        .policy("send_rate", 0)
        .policy("deliver_rate", 0)
        .policy("deliver_rate_per_account", 0)
        .policy("deliver_rate_per_sender", 0)
}

/// One relay under attack, with a client and two accounts of its own for the liveness
/// checks (alice sends to bob).
struct Ctx {
    relay: Relay,
    c: Client,
    alice: User,
    bob: User,
    n: u64,
}

impl Ctx {
    fn start(kind: Kind, opts: Opts, seed: u64) -> Ctx {
        let relay = Relay::start(kind, opts);
        Ctx::over(relay, seed)
    }

    fn over(relay: Relay, seed: u64) -> Ctx {
        let mut c = Client::on(seed, &relay.opts);
        let alice = c.register(&relay, true);
        let bob = c.register(&relay, true);
        Ctx {
            relay,
            c,
            alice,
            bob,
            n: 0,
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.relay.port))
    }

    fn name(&self) -> &'static str {
        self.relay.kind.name()
    }

    /// A flag's value as started (`--name V`), or `default`.
    fn flag(&self, name: &str, default: u64) -> u64 {
        let f = format!("--{name}");
        let fl = &self.relay.opts.flags;
        fl.iter()
            .position(|a| *a == f)
            .and_then(|i| fl.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn ms(&self, name: &str, default: u64) -> Duration {
        Duration::from_millis(self.flag(name, default))
    }

    /// After the relay's close frame, its end of the connection closes too (within
    /// [`SLACK`]), although this client never answers the close. Not on the edge host:
    /// workerd owns the socket there and waits for the client's close frame, as RFC 6455
    /// lets it.
    fn connection_ends(&self, s: &mut TcpStream, what: &str) {
        if self.relay.kind == Kind::Edge {
            return;
        }
        assert!(
            matches!(read_until_closed(s, SLACK), End::Closed(_)),
            "{what}: the {} relay sent its close frame but kept the connection open",
            self.name()
        );
    }

    /// The relay process still runs, answers `/healthz` and `route.get`, and delivers a
    /// message from alice to bob within [`LIVE`].
    fn alive(&mut self, after: &str) {
        let who = format!("{} relay after {after}", self.name());
        if let Some(status) = self.relay.exited() {
            panic!("the {who}: the process exited ({status})");
        }
        let started = Instant::now();
        let (s, body) = self.c.http.get(&format!("{}/healthz", self.relay.api()));
        assert_eq!(s, 200, "the {who}: /healthz answered {s} {body:?}");
        let mut p = Object::new();
        p.insert("account", self.bob.id());
        let (s, v) = self.c.http.post(
            &format!("{}/v1/route.get", self.relay.api()),
            None,
            &canonical::object_to_vec(&p),
        );
        assert_eq!(s, 200, "the {who}: route.get answered {s} {v:?}");
        self.n += 1;
        let text = format!("still here {}", self.n);
        let m = self
            .c
            .message(&self.alice, &self.bob, &text, &Msg::default());
        let message_id = field(&Value::Object(m.clone()), "envelope")
            .and_then(|e| field(e, "message_id"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let (s, v) = self.c.send(&self.alice, &m);
        assert_eq!(s, 200, "the {who}: message.send answered {s} {v:?}");
        let left = LIVE
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(1));
        let v = self.c.wait_terminal(&self.alice, &message_id, left);
        assert_eq!(
            status_of(&v),
            "target_accepted",
            "the {who}: the message was not delivered: {v:?}"
        );
        let got = self
            .c
            .texts(&self.bob, 0)
            .iter()
            .any(|(_, mid, t)| *mid == message_id && *t == text);
        assert!(got, "the {who}: bob's timeline lacks {message_id}");
        assert!(
            started.elapsed() < LIVE + Duration::from_secs(1),
            "the {who}: the liveness check took {:?}",
            started.elapsed()
        );
    }
}

// ---------------------------------------------------------------------------------------
// Raw TCP, HTTP and WebSocket.

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_nodelay(true).ok();
    s
}

/// Connects from the loopback address `from` (127.0.0.0/8 is all loopback on Linux).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(IpAddr::V4(from), 0).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// A loopback source address not used before by this process (127.1.0.0/16 and up,
/// never a .0 or .255 address), for connections a per-address cap must count apart.
fn fresh_ip() -> Ipv4Addr {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let v = (std::process::id() as u64 % 64) * 1000 + n % 1000;
    Ipv4Addr::new(
        127,
        1 + (v / 62_500) as u8,
        1 + (v / 250 % 250) as u8,
        1 + (v % 250) as u8,
    )
}

/// How a connection ended, as the client saw it.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Still open at the deadline.
    Open,
    /// Closed (EOF or reset) after the server sent these bytes.
    Closed(Vec<u8>),
}

/// Reads until the server closes or `within` passes; what it sent, and whether it closed.
fn read_until_closed(s: &mut TcpStream, within: Duration) -> End {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = within.saturating_sub(started.elapsed());
        if left.is_zero() {
            return End::Open;
        }
        s.set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .ok();
        match s.read(&mut buf) {
            Ok(0) => return End::Closed(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return End::Closed(got),
        }
    }
}

/// The body of the one HTTP response in `bytes` (what follows its head).
fn body_in(bytes: &[u8]) -> &[u8] {
    match bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => &bytes[at + 4..],
        None => &[],
    }
}

/// Asserts that `bytes` (one answer, then a close) is the core's answer for refusal `r`,
/// to the byte: every host spells its own refusals through the core.
fn assert_refused(bytes: &[u8], r: Refusal, what: &str) {
    let want = Response::refused(r);
    assert_eq!(
        (status_in(bytes), String::from_utf8_lossy(body_in(bytes))),
        (Some(want.status), String::from_utf8_lossy(&want.body)),
        "{what}: {:?}",
        String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
    );
    assert_eq!(
        header_in(bytes, "connection").map(|v| v.to_ascii_lowercase()),
        Some("close".to_string()),
        "{what}: the refusal says the connection closes"
    );
}

/// The status of an HTTP response at the start of `bytes`, if there is one.
fn status_in(bytes: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(bytes.get(..12)?).ok()?;
    let rest = text.strip_prefix("HTTP/1.")?;
    rest.get(2..5)?.parse().ok()
}

/// The status of the first answer the server sends, or `None` if it closes without one;
/// an error if it does neither within `within` (a stall).
fn answer_or_close(s: &mut TcpStream, within: Duration) -> Result<Option<u16>, String> {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < within {
        s.set_read_timeout(Some(Duration::from_millis(200))).ok();
        match s.read(&mut buf) {
            Ok(0) => return Ok(status_in(&got)),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") {
                    return Ok(status_in(&got));
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Ok(status_in(&got)),
        }
    }
    Err(format!(
        "neither an answer nor a close within {within:?} (got {} bytes)",
        got.len()
    ))
}

/// Reads one response head (up to the blank line) within `within`.
fn read_head(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while started.elapsed() < within {
        s.set_read_timeout(Some(Duration::from_millis(200))).ok();
        match s.read(&mut b) {
            Ok(0) => return None,
            Ok(_) => {
                got.push(b[0]);
                if got.ends_with(b"\r\n\r\n") {
                    return Some(got);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return None,
        }
    }
    None
}

fn header_in(head: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// A client WebSocket frame (masked unless `masked` is false).
fn frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut f = vec![first];
    let m = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => f.push(m | n as u8),
        n if n < 65536 => {
            f.push(m | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(m | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        let key = [0x37u8, 0xfa, 0x21, 0x3d];
        f.extend_from_slice(&key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        f.extend_from_slice(payload);
    }
    f
}

const FIN: u8 = 0x80;
const TEXT: u8 = 0x1;
const CONT: u8 = 0x0;

/// A WebSocket opened by hand for `session` (raw frames from here on).
fn ws_raw(addr: SocketAddr, session: &str) -> TcpStream {
    let mut s = connect(addr);
    let req = format!(
        "GET /v1/ws?session={session} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("upgrade request");
    let head = read_head(&mut s, Duration::from_secs(10)).expect("an upgrade answer");
    assert_eq!(
        status_in(&head),
        Some(101),
        "upgrade refused: {}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// What a server did to a raw WebSocket: its frames' opcodes, and how it ended.
#[derive(Debug)]
struct WsEnd {
    opcodes: Vec<u8>,
    /// The close frame's code (`Some(None)`: a close frame without a code).
    close: Option<Option<u16>>,
    closed: bool,
}

/// Reads server frames until the TCP connection ends or `within` passes.
fn ws_watch(s: &mut TcpStream, within: Duration) -> WsEnd {
    match read_until_closed(s, within) {
        End::Open => ws_frames(&[], false),
        End::Closed(b) => ws_frames(&b, true),
    }
}

/// Reads server frames until a close frame has arrived (the connection may stay open, as
/// a server waits for the client's close) or `within` passes.
fn ws_until_close_frame(s: &mut TcpStream, within: Duration) -> WsEnd {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < within {
        s.set_read_timeout(Some(Duration::from_millis(200))).ok();
        match s.read(&mut buf) {
            Ok(0) => return ws_frames(&got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return ws_frames(&got, true),
        }
        let end = ws_frames(&got, false);
        if end.close.is_some() {
            return end;
        }
    }
    ws_frames(&got, false)
}

/// The server frames in `bytes`.
fn ws_frames(bytes: &[u8], closed: bool) -> WsEnd {
    let mut out = WsEnd {
        opcodes: Vec::new(),
        close: None,
        closed,
    };
    let mut i = 0;
    while i + 2 <= bytes.len() {
        let op = bytes[i] & 0x0f;
        let mut len = (bytes[i + 1] & 0x7f) as usize;
        let masked = bytes[i + 1] & 0x80 != 0;
        let mut j = i + 2;
        if len == 126 && j + 2 <= bytes.len() {
            len = u16::from_be_bytes([bytes[j], bytes[j + 1]]) as usize;
            j += 2;
        } else if len == 127 && j + 8 <= bytes.len() {
            len = u64::from_be_bytes(bytes[j..j + 8].try_into().unwrap()) as usize;
            j += 8;
        }
        if masked {
            j += 4;
        }
        if j + len > bytes.len() {
            break;
        }
        out.opcodes.push(op);
        if op == 0x8 {
            let p = &bytes[j..j + len];
            out.close = Some((p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]])));
        }
        i = j + len;
    }
    out
}

/// Writes everything it can; errors (the server closed first) are the server's answer.
fn write_lenient(s: &mut TcpStream, bytes: &[u8]) {
    s.set_write_timeout(Some(Duration::from_secs(5))).ok();
    let _ = s.write_all(bytes);
}

// ---------------------------------------------------------------------------------------
// A counting server: the address an attacker names, which must hear nothing (or little).

struct Counter {
    port: u16,
    conns: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Counter {
    /// Listens on 127.0.0.1 (and [::1] on the same port, when it can): counts connections
    /// and request lines, answers 404 and closes.
    fn start() -> Counter {
        let l4 = TcpListener::bind("127.0.0.1:0").expect("counting server");
        let port = l4.local_addr().unwrap().port();
        let conns = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let mut listeners = vec![l4];
        if let Ok(l6) = TcpListener::bind(("::1", port)) {
            listeners.push(l6);
        }
        for l in listeners {
            let (conns, requests) = (conns.clone(), requests.clone());
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(mut s) = s else { continue };
                    conns.fetch_add(1, Ordering::SeqCst);
                    let requests = requests.clone();
                    std::thread::spawn(move || {
                        if let Some(head) = read_head(&mut s, Duration::from_secs(3)) {
                            let line = String::from_utf8_lossy(&head)
                                .lines()
                                .next()
                                .unwrap_or("")
                                .to_string();
                            requests.lock().unwrap().push(line);
                            let _ = s.write_all(
                                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                            );
                        }
                    });
                }
            });
        }
        Counter {
            port,
            conns,
            requests,
        }
    }

    fn connections(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------------------
// The probes. Each takes a relay started with the flags it needs (see `opts_for`).

/// A WebSocket message over `max_request_bytes`, in one frame and in fragments: the
/// socket is closed with 1009, nothing else is affected.
fn oversized_ws_message(x: &mut Ctx) {
    let mut healthy = Socket::connect(&x.alice, 0);
    let big = vec![b'a'; MAX_REQUEST * 2];
    let mut text = br#"{"id":1,"method":"route.get","params":{"account":""#.to_vec();
    text.extend_from_slice(&big);
    text.extend_from_slice(br#""}}"#);

    // One frame.
    let mut s = ws_raw(x.addr(), &x.alice.sessions[0]);
    write_lenient(&mut s, &frame(FIN | TEXT, &text, true));
    let end = ws_until_close_frame(&mut s, SLACK + Duration::from_secs(2));
    assert_eq!(end.close, Some(Some(1009)), "one oversized frame: {end:?}");
    x.connection_ends(&mut s, "one oversized frame");

    // Fragments of 8 KB each, the message passing the limit only in total.
    let mut s = ws_raw(x.addr(), &x.alice.sessions[0]);
    let chunks: Vec<&[u8]> = text.chunks(8192).collect();
    let mut bytes = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let op = if i == 0 { TEXT } else { CONT };
        let fin = if i + 1 == chunks.len() { FIN } else { 0 };
        bytes.extend(frame(fin | op, c, true));
    }
    write_lenient(&mut s, &bytes);
    let end = ws_until_close_frame(&mut s, SLACK + Duration::from_secs(2));
    assert_eq!(
        end.close,
        Some(Some(1009)),
        "a fragmented oversized message: {end:?}"
    );
    x.connection_ends(&mut s, "a fragmented oversized message");

    healthy_still_answers(&mut healthy, &x.alice);
    x.alive("oversized WebSocket messages");
}

fn healthy_still_answers(s: &mut Socket, u: &User) {
    let mut p = Object::new();
    p.insert("account", u.id());
    let v = s.call("route.get", &p);
    assert!(
        field(&v, "result").is_some(),
        "another WebSocket was affected: {v:?}"
    );
}

/// Upgrade requests on odd targets (`GET //` and others): an answer that is not 101, or
/// a closed connection; the process lives.
fn odd_upgrade_targets(x: &mut Ctx) {
    let upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    let session = x.alice.sessions[0].clone();
    let targets = [
        "//".to_string(),
        "//v1/ws".to_string(),
        format!("//v1/ws?session={session}"),
        "///////".to_string(),
        "/v1/ws?session=%ff%fe%".to_string(),
        "/v1/ws?session=a&session=b".to_string(),
        "*".to_string(),
        "http://[::1/v1/ws".to_string(),
        "http://a:b@:99999/v1/ws".to_string(),
        "/%2e%2e/%2e%2e/v1/ws".to_string(),
    ];
    for t in &targets {
        for host in ["Host: 127.0.0.1\r\n", "Host: [\r\n", ""] {
            let mut s = connect(x.addr());
            let req = format!("GET {t} HTTP/1.1\r\n{host}{upgrade}\r\n");
            write_lenient(&mut s, req.as_bytes());
            let head = read_head(&mut s, SLACK);
            if let Some(h) = &head {
                assert_ne!(
                    status_in(h),
                    Some(101),
                    "GET {t} ({host:?}) was upgraded: {}",
                    String::from_utf8_lossy(h)
                );
                // Refused, not failed on: a 5xx would be the host erring on the input.
                assert!(
                    status_in(h).is_some_and(|s| s < 500),
                    "GET {t} ({host:?}): {}",
                    String::from_utf8_lossy(h)
                );
            }
            // Either an answer or a close; a server that crashed would be seen below.
            drop(s);
            assert!(
                x.relay.exited().is_none(),
                "the {} relay exited after GET {t} with upgrade headers",
                x.name()
            );
        }
    }
    // A bad version on the right path.
    let mut s = connect(x.addr());
    let req = format!(
        "GET /v1/ws?session={session} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: short\r\nSec-WebSocket-Version: 99\r\n\r\n"
    );
    write_lenient(&mut s, req.as_bytes());
    if let Some(h) = read_head(&mut s, SLACK) {
        assert_ne!(
            status_in(&h),
            Some(101),
            "a bad WebSocket version was upgraded"
        );
    }
    // `GET /v1/ws` that does not ask to upgrade (no headers, or `Upgrade` without
    // `Connection: Upgrade`) is no endpoint: the core's 404, to the byte, on every host.
    let none = Response::fail(relay_core::ErrorCode::NotFound, "no such endpoint");
    for asks in ["", "Upgrade: websocket\r\n", "Connection: Upgrade\r\n"] {
        let mut s = connect(x.addr());
        let req = format!(
            "GET /v1/ws?session={session} HTTP/1.1\r\nHost: 127.0.0.1\r\n{asks}Connection: close\r\n\r\n"
        );
        write_lenient(&mut s, req.as_bytes());
        let End::Closed(answer) = read_until_closed(&mut s, SLACK) else {
            panic!("GET /v1/ws with {asks:?}: no answer and no close")
        };
        // workerd answers a request carrying `Upgrade: websocket` without the rest of a
        // handshake itself (426), before the Worker runs: the platform's answer there.
        if x.relay.kind == Kind::Edge && asks.starts_with("Upgrade") {
            assert_ne!(status_in(&answer), Some(101), "GET /v1/ws with {asks:?}");
            continue;
        }
        assert_eq!(
            (
                status_in(&answer),
                String::from_utf8_lossy(body_in(&answer))
            ),
            (Some(404), String::from_utf8_lossy(&none.body)),
            "GET /v1/ws with {asks:?}: {:?}",
            String::from_utf8_lossy(&answer)
        );
    }
    x.alive("upgrade requests on odd targets");
}

/// The health checks are GET and HEAD of `/healthz` and `/readyz`, answered with the core's
/// words (`transport::health`) on both listeners; any other method there is the core's 404.
fn health_checks(x: &mut Ctx) {
    let exchange = |base: &str, method: &str, path: &str| -> Vec<u8> {
        let addr = base.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).expect("connect");
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).expect("request");
        match read_until_closed(&mut s, SLACK) {
            End::Closed(b) => b,
            End::Open => panic!("{method} {path} on {base}: no answer and no close"),
        }
    };
    use relay_core::transport::health::{answer, Check};
    let none = Response::fail(relay_core::ErrorCode::NotFound, "no such endpoint");
    for base in [x.relay.api(), x.relay.admin_api()] {
        for (path, check) in [("/healthz", Check::Live), ("/readyz", Check::Ready)] {
            let want = answer(check, None);
            let got = exchange(&base, "GET", path);
            assert_eq!(
                (status_in(&got), body_in(&got)),
                (Some(want.status), want.body.as_slice()),
                "GET {path} on {base}"
            );
            let head = exchange(&base, "HEAD", path);
            assert_eq!(
                (status_in(&head), body_in(&head)),
                (Some(200), b"".as_slice()),
                "HEAD {path} on {base}"
            );
            let post = exchange(&base, "POST", path);
            assert_eq!(
                (status_in(&post), String::from_utf8_lossy(body_in(&post))),
                (Some(404), String::from_utf8_lossy(&none.body)),
                "POST {path} on {base}"
            );
        }
    }
    // The metrics on the admin listener: GET and HEAD; another method is the core's 404.
    let admin = x.relay.admin_api();
    let head = exchange(&admin, "HEAD", "/metrics");
    assert_eq!(
        (status_in(&head), body_in(&head)),
        (Some(200), b"".as_slice()),
        "HEAD /metrics"
    );
    let post = exchange(&admin, "POST", "/metrics");
    assert_eq!(
        (status_in(&post), String::from_utf8_lossy(body_in(&post))),
        (Some(404), String::from_utf8_lossy(&none.body)),
        "POST /metrics"
    );
    x.alive("health checks");
}

/// A relay told to stop (SIGTERM) closes every WebSocket with the core's 1001 (`socket::STOPPING`),
/// rather than cutting it: the client knows to reconnect. Not hostile, but this suite has the
/// raw socket reader and one relay per probe and host.
fn stop_closes_websockets(x: &mut Ctx) {
    let mut s = ws_raw(x.addr(), &x.alice.sessions[0]);
    let pid = x.relay.pid().expect("a running relay");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill -TERM");
    assert!(killed.success());
    let end = ws_until_close_frame(&mut s, Duration::from_secs(10));
    let (code, _) = relay_core::transport::socket::STOPPING;
    assert_eq!(
        end.close,
        Some(Some(code)),
        "the {} relay stopping: {end:?}",
        x.name()
    );
}

/// One bad client frame on a WebSocket: that socket is closed with `code`, another
/// socket of the same account goes on.
fn ws_protocol_error(x: &mut Ctx, what: &str, bytes: Vec<u8>, code: u16) {
    let mut healthy = Socket::connect(&x.alice, 0);
    let mut s = ws_raw(x.addr(), &x.alice.sessions[0]);
    write_lenient(&mut s, &bytes);
    let end = ws_watch(&mut s, SLACK);
    assert!(end.closed, "{what}: the socket stayed open: {end:?}");
    assert_eq!(end.close, Some(Some(code)), "{what}: {end:?}");
    healthy_still_answers(&mut healthy, &x.alice);
    x.alive(what);
}

fn ws_frame_text() -> Vec<u8> {
    br#"{"id":1,"method":"route.get","params":{}}"#.to_vec()
}

fn ws_rsv1(x: &mut Ctx) {
    let f = frame(FIN | 0x40 | TEXT, &ws_frame_text(), true);
    ws_protocol_error(x, "a frame with RSV1", f, 1002);
}

fn ws_unmasked(x: &mut Ctx) {
    let f = frame(FIN | TEXT, &ws_frame_text(), false);
    ws_protocol_error(x, "an unmasked client frame", f, 1002);
}

fn ws_bad_opcode(x: &mut Ctx) {
    let f = frame(FIN | 0x3, &ws_frame_text(), true);
    ws_protocol_error(x, "a frame with opcode 3", f, 1002);
}

fn ws_invalid_utf8(x: &mut Ctx) {
    let mut t = br#"{"id":1,"method":"route.get","params":{"account":""#.to_vec();
    t.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
    t.extend_from_slice(br#""}}"#);
    let f = frame(FIN | TEXT, &t, true);
    ws_protocol_error(x, "a text frame of invalid UTF-8", f, 1007);
}

/// Many connections whose request never completes (some send nothing, most half a
/// header block, one drips a byte every 100 ms): every one is closed by the server
/// within `--header-timeout` (plus slack).
fn half_sent_requests(x: &mut Ctx) {
    let timeout = x.ms("header-timeout", 10_000);
    let total = 50;
    let mut socks: Vec<(TcpStream, &str)> = Vec::new();
    let started = Instant::now();
    for i in 0..total {
        let mut s = connect(x.addr());
        let kind = if i % 10 == 0 {
            "sent nothing"
        } else {
            let half =
                format!("POST /v1/route.get HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl{i}");
            // A connection refused at accept (a cap) may fail here: that is a close too.
            let _ = s.write_all(half.as_bytes());
            "sent half its headers"
        };
        socks.push((s, kind));
    }
    let mut drip = connect(x.addr());
    let drip_text = b"POST /v1/route.get HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut dripped = 0usize;
    let mut drip_closed: Option<Duration> = None;
    let deadline = timeout + SLACK;
    let mut open: Vec<bool> = vec![true; socks.len()];
    let mut last_drip = Instant::now();
    for (s, _) in &socks {
        s.set_nonblocking(true).ok();
    }
    let mut buf = [0u8; 4096];
    while started.elapsed() < deadline {
        for (i, (s, _)) in socks.iter_mut().enumerate() {
            if !open[i] {
                continue;
            }
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        open[i] = false;
                        break;
                    }
                    Ok(_) => continue, // a 408 is allowed; the close must follow
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        open[i] = false;
                        break;
                    }
                }
            }
        }
        if drip_closed.is_none() && last_drip.elapsed() >= Duration::from_millis(100) {
            last_drip = Instant::now();
            let b = drip_text[dripped % drip_text.len()];
            if drip.write_all(&[b]).is_err() {
                drip_closed = Some(started.elapsed());
            }
            dripped += 1;
            drip.set_nonblocking(true).ok();
            if let Ok(0) = drip.read(&mut buf) {
                drip_closed = Some(started.elapsed());
            }
            drip.set_nonblocking(false).ok();
        }
        if drip_closed.is_some() && open.iter().all(|o| !o) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let still: Vec<&str> = socks
        .iter()
        .zip(&open)
        .filter(|(_, o)| **o)
        .map(|((_, k), _)| *k)
        .collect();
    assert!(
        still.is_empty(),
        "{} of {total} connections were still open {:?} after they started (--header-timeout {timeout:?}): {:?}",
        still.len(),
        started.elapsed(),
        still
    );
    assert!(
        drip_closed.is_some(),
        "a connection dripping its headers a byte per 100 ms ({dripped} bytes) was still open after {:?} (--header-timeout {timeout:?})",
        started.elapsed()
    );
    eprintln!(
        "{}: {total} half-sent requests closed within {:?}, the dripping one at {:?}",
        x.name(),
        started.elapsed(),
        drip_closed.unwrap()
    );
    x.alive("half-sent requests");
}

/// A body that never finishes (declared length, chunked, and one dripped a byte every
/// 100 ms): 408 and a close within `--body-timeout` (plus slack).
fn body_never_finishes(x: &mut Ctx) {
    let timeout = x.ms("body-timeout", 30_000);
    let cases: [(&str, &[u8]); 3] = [
        (
            "a declared length",
            b"Content-Length: 1000\r\n\r\n{\"account\":",
        ),
        (
            "a chunked body",
            b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"acc\r\n",
        ),
        ("a dripped body", b"Content-Length: 60000\r\n\r\n"),
    ];
    for (what, tail) in cases {
        let mut s = connect(x.addr());
        let mut req =
            b"POST /v1/route.get HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                .to_vec();
        req.extend_from_slice(tail);
        s.write_all(&req).expect("request");
        let started = Instant::now();
        let end = if what == "a dripped body" {
            let mut got = Vec::new();
            let mut closed = false;
            let mut buf = [0u8; 4096];
            s.set_read_timeout(Some(Duration::from_millis(100))).ok();
            while started.elapsed() < timeout + SLACK {
                if s.write_all(b" ").is_err() {
                    closed = true;
                }
                match s.read(&mut buf) {
                    Ok(0) => closed = true,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => closed = true,
                }
                if closed {
                    break;
                }
            }
            if closed {
                End::Closed(got)
            } else {
                End::Open
            }
        } else {
            read_until_closed(&mut s, timeout + SLACK)
        };
        let took = started.elapsed();
        match end {
            End::Open => panic!(
                "{what} that never finishes: still open after {took:?} (--body-timeout {timeout:?})"
            ),
            End::Closed(bytes) => assert_refused(
                &bytes,
                Refusal::BodyTimeout {
                    ms: timeout.as_millis() as u64,
                },
                &format!("{what} that never finishes, closed after {took:?}"),
            ),
        }
    }
    x.alive("bodies that never finish");
}

/// A keep-alive connection left idle after one request is closed within
/// `--idle-timeout` (plus slack).
fn idle_keepalive(x: &mut Ctx) {
    let timeout = x.ms("idle-timeout", 60_000);
    let mut s = connect(x.addr());
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("request");
    let head = read_head(&mut s, SLACK).expect("an answer to /healthz");
    assert_eq!(status_in(&head), Some(200));
    let len: usize = header_in(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("the body");
    let started = Instant::now();
    match read_until_closed(&mut s, timeout + SLACK) {
        End::Open => panic!(
            "an idle keep-alive connection was still open after {:?} (--idle-timeout {timeout:?})",
            started.elapsed()
        ),
        End::Closed(_) => {}
    }
    x.alive("an idle keep-alive connection");
}

/// A 20 MB chunked body (and a declared 20 MB length) is refused with 413 long before
/// it is read: the client can write only a small part of it before the server answers
/// and closes.
fn chunked_body_refused_early(x: &mut Ctx) {
    // A declared length: 413 without reading.
    let mut s = connect(x.addr());
    s.write_all(
        b"POST /v1/message.send HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 20000000\r\n\r\n",
    )
    .expect("request");
    let End::Closed(answer) = read_until_closed(&mut s, SLACK) else {
        panic!("a declared 20 MB body: neither answered nor closed")
    };
    let limit = MAX_REQUEST as u64;
    assert_refused(
        &answer,
        Refusal::TooLarge { limit },
        "a declared 20 MB body",
    );
    drop(s);

    // Chunked: the count passes the limit after 64 KB.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_send_buffer_size(16384).ok();
    sock.connect(&x.addr().into()).expect("connect");
    let mut w: TcpStream = sock.into();
    let mut r = w.try_clone().unwrap();
    let reader = std::thread::spawn(move || read_until_closed(&mut r, Duration::from_secs(30)));
    w.write_all(
        b"POST /v1/message.send HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .expect("head");
    w.set_write_timeout(Some(Duration::from_secs(3))).ok();
    let chunk = {
        let mut c = format!("{:x}\r\n", 65536).into_bytes();
        c.extend(std::iter::repeat_n(b'a', 65536));
        c.extend_from_slice(b"\r\n");
        c
    };
    let total = 20 * 1024 * 1024;
    let mut written = 0usize;
    let started = Instant::now();
    let why = loop {
        if written >= total {
            break "all of it was accepted".to_string();
        }
        match w.write(&chunk) {
            Ok(n) => written += n,
            Err(e) => break format!("{e}"),
        }
    };
    let took = started.elapsed();
    let _ = w.shutdown(Shutdown::Write);
    let end = reader.join().unwrap();
    eprintln!(
        "{}: a 20 MB chunked body: {written} bytes written in {took:?} before: {why}; the server sent {end:?}",
        x.name(),
        end = match &end {
            End::Open => "nothing, and did not close".to_string(),
            End::Closed(b) => String::from_utf8_lossy(&b[..b.len().min(40)]).to_string(),
        }
    );
    assert!(
        written < 8 * 1024 * 1024,
        "the server read {written} bytes of a chunked body over max_request_bytes ({MAX_REQUEST}): {why}"
    );
    match end {
        End::Open => {
            panic!("a chunked body over the limit: the server neither answered nor closed")
        }
        End::Closed(b) => assert!(
            b.is_empty() || status_in(&b) == Some(413),
            "a chunked body over the limit: {:?}",
            String::from_utf8_lossy(&b[..b.len().min(200)])
        ),
    }
    x.alive("a 20 MB chunked body");
}

/// `--max-connections-per-ip` and `--max-connections`: from a fresh address, exactly the
/// per-address cap stays open and the rest are closed at accept; across addresses,
/// the total cap holds. Everything is released when the clients go.
fn connection_caps(x: &mut Ctx) {
    let per_ip = x.flag("max-connections-per-ip", 64) as usize;
    let max = x.flag("max-connections", 1000) as usize;
    assert!(
        max <= 400,
        "connection_caps needs a relay with a small --max-connections"
    );
    // Long enough for a relay to have closed what it refuses at accept, short enough for
    // the held connections to be inside the header timeout.
    let settle = Duration::from_millis(1500).min(x.ms("header-timeout", 10_000) / 4);
    let is_open = |s: &TcpStream| -> bool {
        s.set_nonblocking(true).ok();
        let mut b = [0u8; 64];
        let open = match (&*s).read(&mut b) {
            Ok(0) => false,
            Ok(_) => false, // an answer (a 503) before any request: a refusal
            Err(e) => e.kind() == ErrorKind::WouldBlock,
        };
        s.set_nonblocking(false).ok();
        open
    };

    // Per address.
    let ip = fresh_ip();
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..per_ip + 3 {
        if let Ok(s) = connect_from(ip, x.addr()) {
            held.push(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(settle);
    let open = held.iter().filter(|s| is_open(s)).count();
    assert_eq!(
        open,
        per_ip,
        "{} connections from {ip} with --max-connections-per-ip {per_ip}: {open} stayed open",
        per_ip + 3
    );
    // A held one still works.
    if let Some(s) = held.iter_mut().find(|s| is_open(s)) {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .expect("request");
        let head = read_head(s, SLACK).expect("an answer on a held connection");
        assert_eq!(status_in(&head), Some(200));
    }
    drop(held);
    std::thread::sleep(settle);

    // In all: from enough addresses to pass the total cap.
    let mut held: Vec<TcpStream> = Vec::new();
    let addrs = max.div_ceil(per_ip.max(1)) + 1;
    for _ in 0..addrs {
        let ip = fresh_ip();
        for _ in 0..per_ip {
            if let Ok(s) = connect_from(ip, x.addr()) {
                held.push(s);
            }
            if held.len() >= max + 3 {
                break;
            }
        }
        if held.len() >= max + 3 {
            break;
        }
    }
    std::thread::sleep(settle);
    let tried = held.len();
    let open = held.iter().filter(|s| is_open(s)).count();
    // The harness's own pooled connections may hold a few of the cap.
    assert!(
        open <= max && open + 4 >= max,
        "{tried} connections from {addrs} addresses with --max-connections {max}: {open} stayed open"
    );
    drop(held);
    // Released: the relay answers again (from the harness's address) within a few seconds.
    let started = Instant::now();
    loop {
        let mut s = connect(x.addr());
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .ok();
        if read_head(&mut s, Duration::from_secs(1)).and_then(|h| status_in(&h)) == Some(200) {
            break;
        }
        assert!(
            started.elapsed() < LIVE,
            "connections were not released after the clients closed them"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    x.alive("connection caps");
}

/// A WebSocket client that never reads while answers and notifications pile up for it
/// is disconnected once its queue passes `--ws-send-queue`.
fn ws_slow_reader(x: &mut Ctx) {
    // A timeline with something in it, so each sync answer is large.
    for i in 0..30 {
        let m = x.c.message(
            &x.alice,
            &x.bob,
            &format!("fill {i} {}", "x".repeat(500)),
            &Msg::default(),
        );
        let (s, v) = x.c.send(&x.alice, &m);
        assert_eq!(s, 200, "{v:?}");
    }
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).ok();
    sock.connect(&x.addr().into()).expect("connect");
    let tcp: TcpStream = sock.into();
    let url = format!("ws://{}/v1/ws?session={}", x.addr(), x.bob.sessions[0]);
    let (mut ws, _) = tungstenite::client(url.as_str(), tcp).expect("WebSocket upgrade");
    ws.get_mut()
        .set_write_timeout(Some(Duration::from_secs(2)))
        .ok();
    // Calls whose answers are never read.
    let mut sent = 0;
    let started = Instant::now();
    for i in 0..400u64 {
        let f = format!(
            r#"{{"id":{i},"method":"message.timeline.sync","params":{{"after":0,"limit":100}}}}"#
        );
        if ws.send(tungstenite::Message::text(f)).is_err() {
            break;
        }
        sent += 1;
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    // And notifications for it.
    for i in 0..40 {
        let m =
            x.c.message(&x.alice, &x.bob, &format!("flood {i}"), &Msg::default());
        let (s, v) = x.c.send(&x.alice, &m);
        assert_eq!(s, 200, "{v:?}");
    }
    std::thread::sleep(Duration::from_secs(1));
    // Now read: what was queued drains, then the connection must end (not go quiet).
    let mut tcp = ws.into_inner();
    let mut got = 0usize;
    let mut buf = vec![0u8; 65536];
    let mut quiet_since = Instant::now();
    let closed = loop {
        tcp.set_read_timeout(Some(Duration::from_millis(200))).ok();
        match tcp.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => {
                got += n;
                quiet_since = Instant::now();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if quiet_since.elapsed() > Duration::from_secs(3) {
                    break false;
                }
            }
            Err(_) => break true,
        }
        if got > 512 * 1024 * 1024 {
            break false;
        }
    };
    eprintln!(
        "{}: a WebSocket that never read: {sent} calls sent, {got} bytes were waiting for it, closed: {closed}",
        x.name()
    );
    assert!(
        closed,
        "a WebSocket client that never read ({sent} unread answers, 40 notifications; --ws-send-queue {}) was not disconnected ({got} bytes waited for it)",
        x.flag("ws-send-queue", 256)
    );
    x.alive("a WebSocket client that never reads");
}

/// The server pings each WebSocket: a client that never answers is closed within two
/// intervals (plus slack); one that answers stays.
fn ws_ping_liveness(x: &mut Ctx) {
    let interval = x.ms("ws-ping-interval", 30_000);
    let mut good = Socket::connect(&x.alice, 0);
    let mut s = ws_raw(x.addr(), &x.alice.sessions[0]);
    let started = Instant::now();
    // The raw socket is watched on a thread while the good one is read (tungstenite
    // answers pings as it reads).
    let watcher = std::thread::spawn(move || ws_watch(&mut s, interval * 2 + SLACK));
    while !watcher.is_finished() {
        let _ = good.notification(Duration::from_millis(100));
    }
    let end = watcher.join().unwrap();
    assert!(
        end.closed,
        "a WebSocket that never answered pings was still open after {:?} (--ws-ping-interval {interval:?}): {end:?}",
        started.elapsed()
    );
    assert!(
        end.opcodes.contains(&0x9),
        "the server closed a silent WebSocket without pinging it: {end:?}"
    );
    healthy_still_answers(&mut good, &x.alice);
    x.alive("a WebSocket that never answered pings");
}

/// Unsigned relay requests naming `Relay-Id: http://127.0.0.1:PORT` (a counting server):
/// at most one key fetch for twenty of them; requests failing the precheck fetch nothing.
fn key_fetch_amplification(x: &mut Ctx) {
    let counter = Counter::start();
    let id = format!("http://127.0.0.1:{}", counter.port);
    let url = format!("{}/relay/v1/message.deliver", x.relay.api());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    static NONCE: AtomicU64 = AtomicU64::new(1);
    let one = |agent: &ureq::Agent, relay_id: &str, ts: String| -> u16 {
        let n = NONCE.fetch_add(1, Ordering::Relaxed);
        let mut nonce = [0u8; 16];
        nonce[..8].copy_from_slice(&n.to_be_bytes());
        nonce[8..].copy_from_slice(&now_ms().to_be_bytes());
        let sig = [0x5au8; 64];
        match agent
            .post(&url)
            .header("content-type", "application/json")
            .header("Relay-Id", relay_id)
            .header("Relay-Timestamp", &ts)
            .header("Relay-Nonce", &base64url::encode(&nonce))
            .header("Relay-Signature", &base64url::encode(&sig))
            .header("Relay-Route-Revision", "1")
            .send(&b"{}"[..])
        {
            Ok(r) => r.status().as_u16(),
            Err(e) => panic!("an unsigned relay request: {e}"),
        }
    };
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(one(&agent, &id, now_ms().to_string()));
    }
    // Concurrent ones as well.
    let conc: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..10)
            .map(|_| {
                let (agent, id) = (agent.clone(), id.clone());
                let one = &one;
                sc.spawn(move || one(&agent, &id, now_ms().to_string()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    statuses.extend(conc);
    std::thread::sleep(Duration::from_millis(500));
    let fetches = counter.requests();
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 503),
        "unsigned relay requests were answered {statuses:?}"
    );
    assert!(
        fetches.len() <= 1,
        "20 unsigned relay requests claiming {id} made the relay fetch {} times: {fetches:?}",
        fetches.len()
    );

    // Failing the precheck (a timestamp a day old, an empty signature): no fetch at all.
    let other = Counter::start();
    let id2 = format!("http://127.0.0.1:{}", other.port);
    for i in 0..10 {
        let ts = if i % 2 == 0 {
            (now_ms() - 86_400_000).to_string()
        } else {
            "0x12".to_string()
        };
        let s = one(&agent, &id2, ts);
        assert_eq!(s, 401, "a relay request failing the precheck");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        other.connections(),
        0,
        "relay requests failing the precheck made the relay connect to {id2}: {:?}",
        other.requests()
    );
    x.alive("unsigned relay requests");
}

/// The addresses a route may name on a network other than `dev`, each its own counting
/// server: all loopback or unspecified (what a host must refuse without
/// `--allow-private-peers`), and one plain `http://` (refused there whatever the flag).
fn private_targets() -> Vec<(String, Counter, bool)> {
    let mut out = Vec::new();
    for form in [
        "https://127.0.0.1:{}",
        "https://localhost:{}",
        "https://[::ffff:127.0.0.1]:{}",
        "https://[::ffff:7f00:1]:{}",
        "https://0.0.0.0:{}",
        "https://[::1]:{}",
        "https://127.1:{}",
        "http://127.0.0.1:{}",
    ] {
        let c = Counter::start();
        let url = form.replace("{}", &c.port.to_string());
        let https = url.starts_with("https://");
        out.push((url, c, https));
    }
    out
}

/// Messages whose recipient's route (given in `recipient_route`, or published with
/// `route.publish`) names a loopback, mapped or unspecified address: on a non-dev network
/// the relay never connects there, unless `--allow-private-peers` (then it does, over
/// https only).
fn private_routes(x: &mut Ctx) {
    let allowed = x
        .relay
        .opts
        .flags
        .iter()
        .any(|f| f == "--allow-private-peers");
    let targets = private_targets();
    let mut sent = Vec::new();
    for (i, (url, _, _)) in targets.iter().enumerate() {
        let api = x.relay.api();
        let victim = x.c.stranger(&api, url);
        let m = if i % 2 == 0 {
            Msg {
                recipient_route: Some(victim.route.clone()),
                ..Msg::default()
            }
        } else {
            let mut p = Object::new();
            p.insert("route", victim.route.clone());
            let (s, v) = x.c.http.post(
                &format!("{api}/v1/route.publish"),
                None,
                &canonical::object_to_vec(&p),
            );
            // A route a relay will not use may be refused outright; that is fine too.
            eprintln!(
                "{}: route.publish naming {url}: {s} {}",
                x.name(),
                code_of(&v)
            );
            Msg::default()
        };
        let p = x.c.message(&x.alice, &victim, &format!("to {url}"), &m);
        let (s, v) = x.c.send(&x.alice, &p);
        eprintln!(
            "{}: message.send to a route naming {url}: {s} {}",
            x.name(),
            status_of(&v)
        );
        sent.push(s);
    }
    // Retries are fast (100 ms): a few seconds is many attempts.
    std::thread::sleep(Duration::from_secs(4));
    let mut wrong = Vec::new();
    for (url, c, https) in &targets {
        let n = c.connections();
        let should = allowed && *https;
        eprintln!("{}: {url}: {n} connections", x.name());
        if should && n == 0 {
            // With the flag, the relay must actually try (over TLS; the counter speaks none).
            wrong.push(format!("{url}: not attempted with --allow-private-peers"));
        }
        if !should && n > 0 {
            wrong.push(format!("{url}: {n} connections ({:?})", c.requests()));
        }
    }
    // The plain http one must never see a request (https only off dev).
    assert!(
        wrong.is_empty(),
        "on network {:?} ({}): {wrong:#?}",
        x.relay.opts.network,
        if allowed {
            "--allow-private-peers"
        } else {
            "no --allow-private-peers"
        }
    );
    x.alive("messages to private addresses");
}

/// Secrets on disk: the data directory 0700, relay.key, admin.token, admin.url and the
/// SQLite files 0600 (nothing readable by others); kept across a restart.
fn secrets_file_modes(x: &mut Ctx) {
    use std::os::unix::fs::PermissionsExt;
    // Let the relay create its data directory itself.
    x.relay.kill();
    std::fs::remove_dir_all(&x.relay.data).expect("removing the data directory");
    x.relay.restart();
    let dir = x.relay.data.clone();
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let mut wrong = Vec::new();
    if mode(&dir) != 0o700 {
        wrong.push(format!("the data directory is {:o}", mode(&dir)));
    }
    for name in ["relay.key", "admin.token", "admin.url"] {
        let m = mode(&dir.join(name));
        if m != 0o600 {
            wrong.push(format!("{name} is {m:o}"));
        }
    }
    // Every file below it, as deep as the host keeps them (the edge host's objects live in
    // `objects/`).
    let mut sqlite = 0;
    let mut dirs = vec![dir.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("the data directory") {
            let e = e.unwrap();
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path
                .strip_prefix(&dir)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let m = mode(&path);
            if name.contains("sqlite") || name.contains(".db") {
                sqlite += 1;
            }
            let named = ["relay.key", "admin.token", "admin.url"].contains(&name.as_str());
            if !named && m & 0o077 != 0 {
                wrong.push(format!("{name} is {m:o}"));
            }
        }
    }
    assert!(sqlite > 0, "no SQLite file in {}", dir.display());
    assert!(wrong.is_empty(), "secrets on disk: {wrong:?}");
    let key = std::fs::read(dir.join("relay.key")).unwrap();
    let token = std::fs::read(dir.join("admin.token")).unwrap();
    x.relay.restart();
    assert_eq!(
        std::fs::read(dir.join("relay.key")).unwrap(),
        key,
        "relay.key changed on restart"
    );
    assert_eq!(
        std::fs::read(dir.join("admin.token")).unwrap(),
        token,
        "admin.token changed on restart"
    );
    // The data directory was new: the liveness accounts are made again.
    x.alice = x.c.register(&x.relay, true);
    x.bob = x.c.register(&x.relay, true);
    x.alive("a restart");
}

/// A malformed relay.key (truncated), a relay.key that cannot be read (a directory), an
/// empty admin.token: each stops the start with a message naming the file, and the file
/// is left as it was (never regenerated).
fn malformed_secrets(x: &mut Ctx) {
    let dir = x.relay.data.clone();
    x.relay.kill();
    let key = std::fs::read(dir.join("relay.key")).unwrap();
    let token = std::fs::read(dir.join("admin.token")).unwrap();
    type Spoil = Box<dyn Fn()>;
    let cases: Vec<(&str, Spoil)> = vec![
        ("relay.key", {
            let (dir, key) = (dir.clone(), key.clone());
            Box::new(move || std::fs::write(dir.join("relay.key"), &key[..key.len() / 2]).unwrap())
        }),
        ("relay.key", {
            let dir = dir.clone();
            Box::new(move || {
                std::fs::remove_file(dir.join("relay.key")).unwrap();
                std::fs::create_dir(dir.join("relay.key")).unwrap();
            })
        }),
        ("admin.token", {
            let dir = dir.clone();
            Box::new(move || std::fs::write(dir.join("admin.token"), b"").unwrap())
        }),
    ];
    for (file, spoil) in cases {
        spoil();
        let before = std::fs::read(dir.join(file)).ok();
        let (status, stderr) = x.relay.start_expecting_failure(Duration::from_secs(20));
        assert!(
            !status.success(),
            "a start over a bad {file} exited {status}"
        );
        assert!(
            stderr.contains(file),
            "a start over a bad {file} stopped without naming it: {stderr}"
        );
        assert_eq!(
            std::fs::read(dir.join(file)).ok(),
            before,
            "the bad {file} was replaced by the failed start"
        );
        // Restore both.
        let p = dir.join("relay.key");
        if p.is_dir() {
            std::fs::remove_dir(&p).unwrap();
        }
        std::fs::write(&p, &key).unwrap();
        std::fs::write(dir.join("admin.token"), &token).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).ok();
    }
    x.relay.restart();
    x.alive("starts over malformed secrets");
}

/// Bursts past `--max-pending`: every refusal is 503 `unavailable` with `Retry-After: 1`
/// and `data.retry_after` 1000, nothing else fails, and the relay recovers at once.
fn pending_bound(x: &mut Ctx) {
    let addr = x.addr();
    let mut p = Object::new();
    p.insert("account", x.bob.id());
    let body = canonical::object_to_vec(&p);
    let results: Vec<(u16, String, String, Option<u64>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..24)
            .map(|_| {
                let body = body.clone();
                // Each client from an address of its own: the per-address cap is not
                // what this probe is about.
                let from = fresh_ip();
                sc.spawn(move || {
                    let mut out = Vec::new();
                    for _ in 0..30 {
                        let mut s = connect_from(from, addr).expect("connect");
                        let req = format!(
                            "POST /v1/route.get HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let mut all = req.into_bytes();
                        all.extend_from_slice(&body);
                        s.write_all(&all).unwrap();
                        let got = match read_until_closed(&mut s, Duration::from_secs(20)) {
                            End::Closed(b) => b,
                            End::Open => Vec::new(),
                        };
                        let split = got
                            .windows(4)
                            .position(|w| w == b"\r\n\r\n")
                            .map(|i| i + 4)
                            .unwrap_or(got.len());
                        let head = &got[..split];
                        let v = relay_core::wire::json::parse(&got[split..]).unwrap_or(Value::Null);
                        let retry = field(&v, "error")
                            .and_then(|e| field(e, "data"))
                            .and_then(|d| field(d, "retry_after"))
                            .and_then(Value::as_protocol_int);
                        out.push((
                            status_in(head).unwrap_or(0),
                            header_in(head, "retry-after").unwrap_or_default(),
                            code_of(&v),
                            retry,
                        ));
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let refused = results.iter().filter(|r| r.0 == 503).count();
    eprintln!(
        "{}: {} requests past --max-pending {}: {refused} answered 503",
        x.name(),
        results.len(),
        x.flag("max-pending", 1024)
    );
    if x.flag("max-pending", 1024) <= 4 {
        // 24 clients at once against a bound of a few: some must wait past it.
        assert!(
            refused > 0,
            "no request was refused past --max-pending {}",
            x.flag("max-pending", 1024)
        );
    }
    for r in &results {
        match r.0 {
            200 => {}
            503 => assert!(
                r.1 == "1" && r.2 == "unavailable" && r.3 == Some(1000),
                "a refusal past --max-pending: {r:?}"
            ),
            _ => panic!("a request in a burst got {r:?}"),
        }
    }
    x.alive("a burst past --max-pending");
}

/// Oversized headers and bytes that are not HTTP: an error answer or a close.
fn garbage_and_huge_headers(x: &mut Ctx) {
    // One header line of 1 MB, and 1 MB in 5000 header lines.
    let mut one = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".to_vec();
    one.extend(std::iter::repeat_n(b'a', 1 << 20));
    one.extend_from_slice(b"\r\n\r\n");
    let mut many = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
    for i in 0..5000 {
        many.extend_from_slice(format!("X-H{i}: {}\r\n", "b".repeat(200)).as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    for (what, req) in [("a 1 MB header line", one), ("5000 header lines", many)] {
        let mut s = connect(x.addr());
        let reader = {
            let mut r = s.try_clone().unwrap();
            std::thread::spawn(move || answer_or_close(&mut r, SLACK + Duration::from_secs(2)))
        };
        write_lenient(&mut s, &req);
        match reader.join().unwrap() {
            Err(why) => panic!("{what}: {why}"),
            Ok(None) => {}
            Ok(Some(status)) => assert!(
                (400..=499).contains(&status),
                "{what}: answered {status}, not an error"
            ),
        }
    }
    let mut s = connect(x.addr());
    let mut junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    junk.extend_from_slice(b"\r\n\r\n");
    write_lenient(&mut s, &junk);
    match read_until_closed(&mut s, SLACK) {
        End::Open => panic!("4 KB of binary junk: the connection stayed open"),
        End::Closed(b) => assert!(
            b.is_empty() || matches!(status_in(&b), Some(400..=499)),
            "binary junk: {:?}",
            String::from_utf8_lossy(&b[..b.len().min(100)])
        ),
    }
    x.alive("oversized headers and junk");
}

// ---------------------------------------------------------------------------------------
// Which flags each probe's relay gets, and the tests.

fn opts_for(probe: &str) -> Opts {
    let o = base();
    match probe {
        "half_sent_requests" => o.flag("header-timeout", 500),
        "body_never_finishes" => o.flag("body-timeout", 1000),
        "idle_keepalive" => o.flag("idle-timeout", 1000),
        "connection_caps" => o
            .flag("max-connections", 20)
            .flag("max-connections-per-ip", 5),
        "ws_slow_reader" => o.flag("ws-send-queue", 8),
        "ws_ping_liveness" => o.flag("ws-ping-interval", 500),
        "pending_bound" => o.flag("max-pending", 2),
        "private_routes_refused" => Opts {
            network: Some("testnet".into()),
            url: Some("https://hostile-relay.test".into()),
            ..o
        },
        "private_routes_allowed" => Opts {
            network: Some("testnet".into()),
            url: Some("https://hostile-relay.test".into()),
            ..o
        }
        .flag("allow-private-peers", ""),
        _ => o,
    }
}

/// The probes that run on the edge host too: what the relay decides there. The others probe
/// sockets, timeouts, connection limits and WebSocket framing, which are workerd's.
const ON_EDGE: [&str; 8] = [
    "oversized_ws_message",
    "odd_upgrade_targets",
    "health_checks",
    "key_fetch_amplification",
    "private_routes_refused",
    "private_routes_allowed",
    "secrets_file_modes",
    "malformed_secrets",
];

fn run(probe: &str, kind: Kind, f: fn(&mut Ctx)) {
    assert!(
        kind != Kind::Edge || ON_EDGE.contains(&probe),
        "{probe} is not one of the edge host's probes (ON_EDGE)"
    );
    let seed = 18_000 + probe.len() as u64 * 7 + kind as u64;
    let mut x = Ctx::start(kind, opts_for(probe), seed);
    let started = Instant::now();
    f(&mut x);
    eprintln!("{probe} ({}): {:?}", kind.name(), started.elapsed());
}

macro_rules! probe {
    // A probe a host does not pass yet: the test stays, ignored with the reason, so
    // `cargo test -- --ignored` (and the soak) still runs it.
    ($probe:ident, $f:expr, $wasmtime:ident, $node:ident, ignore_wasmtime = $why:literal) => {
        #[test]
        #[ignore = $why]
        fn $wasmtime() {
            run(stringify!($probe), Kind::Wasmtime, $f);
        }
        #[test]
        fn $node() {
            run(stringify!($probe), Kind::Node, $f);
        }
    };
    ($probe:ident, $f:expr, $wasmtime:ident, $node:ident) => {
        #[test]
        fn $wasmtime() {
            run(stringify!($probe), Kind::Wasmtime, $f);
        }
        #[test]
        fn $node() {
            run(stringify!($probe), Kind::Node, $f);
        }
    };
    // A probe of what the relay decides on workerd too (not of sockets, framing or limits,
    // which are the platform's there): a third test, on the edge host.
    ($probe:ident, $f:expr, $wasmtime:ident, $node:ident, $edge:ident) => {
        probe!($probe, $f, $wasmtime, $node);
        #[test]
        fn $edge() {
            run(stringify!($probe), Kind::Edge, $f);
        }
    };
}

probe!(
    oversized_ws_message,
    oversized_ws_message,
    oversized_ws_message_wasmtime,
    oversized_ws_message_node,
    oversized_ws_message_edge
);
probe!(
    odd_upgrade_targets,
    odd_upgrade_targets,
    odd_upgrade_targets_wasmtime,
    odd_upgrade_targets_node,
    odd_upgrade_targets_edge
);
probe!(
    health_checks,
    health_checks,
    health_checks_wasmtime,
    health_checks_node,
    health_checks_edge
);
probe!(
    stop_closes_websockets,
    stop_closes_websockets,
    stop_closes_websockets_wasmtime,
    stop_closes_websockets_node
);
probe!(ws_rsv1, ws_rsv1, ws_rsv1_wasmtime, ws_rsv1_node);
probe!(
    ws_unmasked,
    ws_unmasked,
    ws_unmasked_wasmtime,
    ws_unmasked_node
);
probe!(
    ws_bad_opcode,
    ws_bad_opcode,
    ws_bad_opcode_wasmtime,
    ws_bad_opcode_node
);
probe!(
    ws_invalid_utf8,
    ws_invalid_utf8,
    ws_invalid_utf8_wasmtime,
    ws_invalid_utf8_node
);
probe!(
    half_sent_requests,
    half_sent_requests,
    half_sent_requests_wasmtime,
    half_sent_requests_node
);
probe!(
    body_never_finishes,
    body_never_finishes,
    body_never_finishes_wasmtime,
    body_never_finishes_node
);
probe!(
    idle_keepalive,
    idle_keepalive,
    idle_keepalive_wasmtime,
    idle_keepalive_node
);
probe!(
    chunked_body_refused_early,
    chunked_body_refused_early,
    chunked_body_refused_early_wasmtime,
    chunked_body_refused_early_node
);
probe!(
    connection_caps,
    connection_caps,
    connection_caps_wasmtime,
    connection_caps_node
);
probe!(
    ws_slow_reader,
    ws_slow_reader,
    ws_slow_reader_wasmtime,
    ws_slow_reader_node
);
probe!(
    ws_ping_liveness,
    ws_ping_liveness,
    ws_ping_liveness_wasmtime,
    ws_ping_liveness_node
);
probe!(
    key_fetch_amplification,
    key_fetch_amplification,
    key_fetch_amplification_wasmtime,
    key_fetch_amplification_node,
    key_fetch_amplification_edge
);
probe!(
    private_routes_refused,
    private_routes,
    private_routes_refused_wasmtime,
    private_routes_refused_node,
    private_routes_refused_edge
);
probe!(
    private_routes_allowed,
    private_routes,
    private_routes_allowed_wasmtime,
    private_routes_allowed_node,
    private_routes_allowed_edge
);
probe!(
    secrets_file_modes,
    secrets_file_modes,
    secrets_file_modes_wasmtime,
    secrets_file_modes_node,
    secrets_file_modes_edge
);
probe!(
    malformed_secrets,
    malformed_secrets,
    malformed_secrets_wasmtime,
    malformed_secrets_node,
    malformed_secrets_edge
);
probe!(
    pending_bound,
    pending_bound,
    pending_bound_wasmtime,
    pending_bound_node
);
probe!(
    garbage_and_huge_headers,
    garbage_and_huge_headers,
    garbage_and_huge_headers_wasmtime,
    garbage_and_huge_headers_node
);

// ---------------------------------------------------------------------------------------
// The soak: `./x soak-hostile [SECONDS]`.

/// Every probe that runs against a relay that stays up (not those that restart it or need
/// another network), in the order of a round.
type Probe = (&'static str, fn(&mut Ctx));

const SOAK_PROBES: [Probe; 16] = [
    ("oversized_ws_message", oversized_ws_message),
    ("odd_upgrade_targets", odd_upgrade_targets),
    ("ws_rsv1", ws_rsv1),
    ("ws_unmasked", ws_unmasked),
    ("ws_bad_opcode", ws_bad_opcode),
    ("ws_invalid_utf8", ws_invalid_utf8),
    ("half_sent_requests", half_sent_requests),
    ("body_never_finishes", body_never_finishes),
    ("idle_keepalive", idle_keepalive),
    ("chunked_body_refused_early", chunked_body_refused_early),
    ("connection_caps", connection_caps),
    ("ws_slow_reader", ws_slow_reader),
    ("ws_ping_liveness", ws_ping_liveness),
    ("key_fetch_amplification", key_fetch_amplification),
    ("pending_bound", pending_bound),
    ("garbage_and_huge_headers", garbage_and_huge_headers),
];

/// One relay's flags for all the probes at once.
fn soak_opts(kind: Kind) -> Opts {
    if kind == Kind::Edge {
        return base();
    }
    base()
        .flag("header-timeout", 3000)
        .flag("body-timeout", 2000)
        .flag("idle-timeout", 2000)
        .flag("ws-ping-interval", 3000)
        .flag("max-connections", 100)
        .flag("max-connections-per-ip", 25)
        .flag("ws-send-queue", 8)
        .flag("max-pending", 64)
}

/// `VmRSS` (kB) and the number of open descriptors of a process.
fn footprint(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

/// Runs the probes round after round against one long-lived relay of each host for
/// `RELAY_SOAK_SECONDS` (300; `RELAY_SOAK_HOSTS=node`, `wasmtime` or `edge` for some),
/// printing each relay's memory and descriptors after every round; fails at the end if any
/// probe failed. The edge relay (workerd's process) runs the probes of [`ON_EDGE`].
#[test]
#[ignore]
fn soak() {
    let seconds: u64 = std::env::var("RELAY_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let only = std::env::var("RELAY_SOAK_HOSTS").unwrap_or_default();
    let mut relays: Vec<Ctx> = Kind::ALL
        .iter()
        .filter(|k| only.is_empty() || only.split(',').any(|h| h.trim() == k.name()))
        .map(|&k| Ctx::start(k, soak_opts(k), 18_800 + k as u64))
        .collect();
    let started = Instant::now();
    let show = |round: u32, relays: &[Ctx], took: Duration| {
        let cols: Vec<String> = relays
            .iter()
            .map(|x| {
                let (rss, fds) = x.relay.pid().map(footprint).unwrap_or((0, 0));
                format!("{} rss {rss} kB fds {fds}", x.name())
            })
            .collect();
        println!(
            "round {round:>4}  {:>5} s  ({:.1} s)  {}",
            started.elapsed().as_secs(),
            took.as_secs_f64(),
            cols.join("  |  ")
        );
    };
    println!(
        "soak-hostile: {} probes a round ({} on an edge relay) against {} for {seconds} s",
        SOAK_PROBES.len(),
        SOAK_PROBES
            .iter()
            .filter(|(n, _)| ON_EDGE.contains(n))
            .count(),
        relays
            .iter()
            .map(|x| x.name())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    show(0, &relays, Duration::ZERO);
    let mut failures: Vec<String> = Vec::new();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        round += 1;
        let t = Instant::now();
        for x in relays.iter_mut() {
            for (name, probe) in SOAK_PROBES {
                if x.relay.kind == Kind::Edge && !ON_EDGE.contains(&name) {
                    continue;
                }
                if let Err(e) = catch_unwind(AssertUnwindSafe(|| probe(x))) {
                    let why = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let line = format!("round {round}: {name} ({}): {why}", x.name());
                    println!("FAILED {line}");
                    failures.push(line);
                }
            }
        }
        show(round, &relays, t.elapsed());
    }
    println!(
        "soak-hostile: {round} rounds in {} s, {} probe failures",
        started.elapsed().as_secs(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
