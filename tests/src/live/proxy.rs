//! A fault-injecting HTTP proxy that stands in front of a relay: the relay's public id is
//! the proxy's address, so every peer's relay RPC passes through it (and every client
//! call, for a client given that address). Faults apply only to requests whose path
//! starts with the fault prefix: relay RPC (`/relay/v1/`) unless [`Proxy::faults_on`]
//! names another (`/v1/message.send` for a client's sends); every other request, such as
//! `/.well-known/relay`, always passes. Every request is logged (time, path, message id,
//! body, fault, upstream status, answer) so the suite can check the sender's discipline:
//! unchanged retries, waits after `rate_limited`, nothing after the deadline.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use relay_core::wire::json::{self, Value};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to one request on the fault prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards it and returns the answer.
    Pass,
    /// Never forwards it; closes the connection (the sender cannot know it was not seen).
    DropRequest,
    /// Forwards it, lets the destination act, and closes before answering.
    DropResponse,
    /// Holds it this many ms (past the sender's timeout), then forwards it.
    Delay(u64),
    /// Answers 429 `rate_limited` with `data.retry_after` (and `Retry-After`) of this many ms.
    RateLimited(u64),
    /// Answers 503 `unavailable`.
    Unavailable,
    /// Resets the connection (RST) without forwarding.
    Reset,
    /// Forwards it, lets the destination act, and answers with the destination's answer
    /// padded with whitespace past the largest answer a relay reads
    /// (`relay_core::transport::outbound::MAX_ANSWER`): still valid JSON, but too long.
    Oversized,
    /// Keeps it, not forwarded, and closes the connection (the sender cannot know it was not
    /// seen): a request held in the network until [`Proxy::release`] forwards it as it came,
    /// its signed headers and body unchanged.
    Capture,
}

/// A captured request, released: what the destination answered.
#[derive(Clone, Debug)]
pub struct Released {
    /// `Relay-Route-Revision` as the source signed it, if it carried one.
    pub route_revision: Option<String>,
    /// The request body, as sent.
    pub body: Vec<u8>,
    /// The destination's status and JSON answer, when it answered.
    pub status: Option<u16>,
    pub answer: Value,
}

/// Chances (per thousand) of each fault in chaos mode; the rest pass.
#[derive(Clone, Copy, Debug)]
pub struct Chaos {
    pub drop_request: u32,
    pub drop_response: u32,
    pub delay: u32,
    pub delay_ms: u64,
    pub rate_limited: u32,
    pub retry_after_ms: u64,
    pub unavailable: u32,
    pub reset: u32,
}

/// One request seen by the proxy.
#[derive(Clone, Debug)]
pub struct Hit {
    /// When it arrived (ms since epoch, the relays' clock).
    pub at: u64,
    /// When the proxy answered, or closed without answering.
    pub done_at: u64,
    pub path: String,
    /// `envelope.message_id` of a message.deliver or message.send body.
    pub message_id: Option<String>,
    /// `Relay-Route-Revision`, as the source signed it.
    pub route_revision: Option<String>,
    pub body: Vec<u8>,
    pub fault: Fault,
    /// The destination's HTTP status, when it was forwarded and answered.
    pub upstream_status: Option<u16>,
    /// The destination's answer (status line, headers and body), when it answered.
    pub answer: Vec<u8>,
}

struct State {
    upstream: u16,
    /// Faults apply to paths starting with this; the rest pass.
    faults_on: String,
    script: VecDeque<Fault>,
    chaos: Option<(Chaos, ChaCha20Rng)>,
    log: Vec<Hit>,
    /// Requests held by [`Fault::Capture`], in arrival order.
    captured: Vec<Request>,
}

impl Default for State {
    fn default() -> State {
        State {
            upstream: 0,
            faults_on: "/relay/v1/".to_string(),
            script: VecDeque::new(),
            chaos: None,
            log: Vec::new(),
            captured: Vec::new(),
        }
    }
}

/// A running proxy; its threads end with the test process.
#[derive(Clone)]
pub struct Proxy {
    port: u16,
    state: Arc<Mutex<State>>,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Proxy {
    /// Listens on a loopback port, with faults on relay RPC (`/relay/v1/`); set the
    /// upstream before traffic arrives.
    pub fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listens");
        let port = listener.local_addr().expect("proxy address").port();
        let p = Proxy {
            port,
            state: Arc::new(Mutex::new(State::default())),
        };
        let me = p.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let me = me.clone();
                std::thread::spawn(move || me.serve(conn));
            }
        });
        p
    }

    /// The address peers use: the proxied relay's id.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Where requests go.
    pub fn set_upstream(&self, port: u16) {
        self.lock().upstream = port;
    }

    /// Faults apply from now on to requests whose path starts with `prefix` (instead of
    /// `/relay/v1/`); every other request passes.
    pub fn faults_on(&self, prefix: &str) {
        self.lock().faults_on = prefix.to_string();
    }

    /// Faults for the next requests on the fault prefix, in order (then they pass).
    pub fn script(&self, faults: &[Fault]) {
        self.lock().script.extend(faults.iter().copied());
    }

    /// Random faults from now on, seeded.
    pub fn chaos(&self, chaos: Chaos, seed: u64) {
        self.lock().chaos = Some((chaos, ChaCha20Rng::seed_from_u64(seed)));
    }

    /// No more faults: everything passes.
    pub fn heal(&self) {
        let mut s = self.lock();
        s.script.clear();
        s.chaos = None;
    }

    /// Every request seen so far.
    pub fn log(&self) -> Vec<Hit> {
        self.lock().log.clone()
    }

    /// The requests on exactly `path` seen so far, in arrival order.
    pub fn hits_on(&self, path: &str) -> Vec<Hit> {
        let mut hits: Vec<Hit> = self.log().into_iter().filter(|h| h.path == path).collect();
        hits.sort_by_key(|h| h.at);
        hits
    }

    /// Waits (up to 10 s) until `n` requests on `path` are done, then returns them (a
    /// request is logged just after its answer is written, so a client may have it first).
    pub fn wait_hits_on(&self, path: &str, n: usize) -> Vec<Hit> {
        let started = std::time::Instant::now();
        loop {
            let hits = self.hits_on(path);
            if hits.len() >= n || started.elapsed() > Duration::from_secs(10) {
                return hits;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The requests (message.deliver, or message.send through a client) seen for one
    /// message, in arrival order.
    pub fn delivers(&self, message_id: &str) -> Vec<Hit> {
        let mut hits: Vec<Hit> = self
            .log()
            .into_iter()
            .filter(|h| h.message_id.as_deref() == Some(message_id))
            .collect();
        hits.sort_by_key(|h| h.at);
        hits
    }

    /// Waits (up to 10 s) until `n` requests for the message are done, then returns them.
    pub fn wait_delivers(&self, message_id: &str, n: usize) -> Vec<Hit> {
        let started = std::time::Instant::now();
        loop {
            let hits = self.delivers(message_id);
            if hits.len() >= n || started.elapsed() > Duration::from_secs(10) {
                return hits;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pick(&self, path: &str) -> (Fault, u16) {
        let mut s = self.lock();
        let upstream = s.upstream;
        if !path.starts_with(s.faults_on.as_str()) {
            return (Fault::Pass, upstream);
        }
        if let Some(f) = s.script.pop_front() {
            return (f, upstream);
        }
        let Some((c, rng)) = s.chaos.as_mut() else {
            return (Fault::Pass, upstream);
        };
        let mut roll = rng.gen_range(0..1000u32);
        let table = [
            (c.drop_request, Fault::DropRequest),
            (c.drop_response, Fault::DropResponse),
            (c.delay, Fault::Delay(c.delay_ms)),
            (c.rate_limited, Fault::RateLimited(c.retry_after_ms)),
            (c.unavailable, Fault::Unavailable),
            (c.reset, Fault::Reset),
        ];
        for (chance, fault) in table {
            if roll < chance {
                return (fault, upstream);
            }
            roll -= chance;
        }
        (Fault::Pass, upstream)
    }

    /// Forwards every captured request now, as it came, and returns what the destination
    /// answered each (a request delayed in the network arriving at last).
    pub fn release(&self) -> Vec<Released> {
        let (captured, upstream) = {
            let mut s = self.lock();
            (std::mem::take(&mut s.captured), s.upstream)
        };
        captured
            .into_iter()
            .map(|req| {
                let route_revision = req
                    .headers
                    .iter()
                    .find(|(n, _)| n == "relay-route-revision")
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
                let answered = forward(upstream, &req);
                let answer = answered
                    .as_ref()
                    .and_then(|(_, raw)| answer_body(raw))
                    .and_then(|b| json::parse(&b).ok())
                    .unwrap_or(Value::Null);
                Released {
                    route_revision,
                    body: req.body,
                    status: answered.map(|(s, _)| s),
                    answer,
                }
            })
            .collect()
    }

    /// Serves one client connection, one request at a time.
    fn serve(&self, mut conn: TcpStream) {
        let _ = conn.set_nodelay(true);
        while let Some(req) = read_request(&mut conn) {
            let at = now_ms();
            let (fault, upstream) = self.pick(&req.path);
            let mut upstream_status = None;
            let mut answered = Vec::new();
            let keep = match fault {
                Fault::Pass | Fault::Delay(_) | Fault::DropResponse => {
                    if let Fault::Delay(ms) = fault {
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    match forward(upstream, &req) {
                        Some((status, answer)) => {
                            upstream_status = Some(status);
                            let keep =
                                fault != Fault::DropResponse && conn.write_all(&answer).is_ok();
                            answered = answer;
                            keep
                        }
                        None => false,
                    }
                }
                Fault::Oversized => match forward(upstream, &req) {
                    Some((status, answered_up)) => {
                        upstream_status = Some(status);
                        let mut body = answer_body(&answered_up).unwrap_or_default();
                        body.resize(
                            body.len() + relay_core::transport::outbound::MAX_ANSWER + 1,
                            b' ',
                        );
                        let body = String::from_utf8(body).unwrap_or_default();
                        let keep = conn.write_all(&answer(status, &body, &[])).is_ok();
                        answered = answered_up;
                        keep
                    }
                    None => false,
                },
                Fault::DropRequest => false,
                Fault::Capture => {
                    self.lock().captured.push(Request {
                        method: req.method.clone(),
                        path: req.path.clone(),
                        headers: req.headers.clone(),
                        body: req.body.clone(),
                    });
                    false
                }
                Fault::RateLimited(ms) => {
                    let body = format!(
                        r#"{{"error":{{"code":"rate_limited","message":"proxy: slow down","data":{{"retry_after":{ms}}}}}}}"#
                    );
                    let secs = ms.div_ceil(1000).max(1);
                    conn.write_all(&answer(429, &body, &[("retry-after", &secs.to_string())]))
                        .is_ok()
                }
                Fault::Unavailable => {
                    let body = r#"{"error":{"code":"unavailable","message":"proxy: try later"}}"#;
                    conn.write_all(&answer(503, body, &[])).is_ok()
                }
                Fault::Reset => {
                    let _ = socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO));
                    false
                }
            };
            let route_revision = req
                .headers
                .iter()
                .find(|(n, _)| n == "relay-route-revision")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
            let hit = Hit {
                at,
                done_at: now_ms(),
                route_revision,
                message_id: message_id_of(&req.body),
                path: req.path,
                body: req.body,
                fault,
                upstream_status,
                answer: answered,
            };
            self.lock().log.push(hit);
            if !keep {
                break;
            }
        }
        let _ = conn.shutdown(Shutdown::Both);
    }
}

/// A request as read off the wire.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Reads one request with a Content-Length body (what both hosts' clients send).
fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(end) = find_head_end(&buf) {
            break end;
        }
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut headers);
    parsed.parse(&buf[..head_end]).ok()?;
    let method = parsed.method?.to_string();
    let path = parsed.path?.to_string();
    let headers: Vec<(String, Vec<u8>)> = parsed
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

/// Sends the request upstream on a fresh connection; the whole answer, rewritten to close.
fn forward(upstream: u16, req: &Request) -> Option<(u16, Vec<u8>)> {
    let mut up = TcpStream::connect(("127.0.0.1", upstream)).ok()?;
    let mut head = format!("{} {} HTTP/1.1\r\n", req.method, req.path).into_bytes();
    for (name, value) in &req.headers {
        if name == "connection" || name == "keep-alive" {
            continue;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"connection: close\r\n\r\n");
    up.write_all(&head).ok()?;
    up.write_all(&req.body).ok()?;
    let mut raw = Vec::new();
    up.read_to_end(&mut raw).ok()?;
    let head_end = find_head_end(&raw)?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut headers);
    parsed.parse(&raw[..head_end]).ok()?;
    let status = parsed.code?;
    // The client keeps its connection only if the answer says so; this proxy serves one
    // exchange per upstream connection, so it tells the client to reconnect.
    let mut out = format!("HTTP/1.1 {status} {}\r\n", parsed.reason.unwrap_or("")).into_bytes();
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") || h.name.eq_ignore_ascii_case("keep-alive") {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(&raw[head_end..]);
    Some((status, out))
}

/// The body of a whole HTTP answer as [`forward`] returns it (Content-Length or chunked).
fn answer_body(raw: &[u8]) -> Option<Vec<u8>> {
    let head_end = find_head_end(raw)?;
    let head = std::str::from_utf8(&raw[..head_end])
        .ok()?
        .to_ascii_lowercase();
    let rest = &raw[head_end..];
    if !head.contains("transfer-encoding: chunked") {
        return Some(rest.to_vec());
    }
    let (mut body, mut at) = (Vec::new(), 0);
    loop {
        let line_end = at + rest[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&rest[at..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(line_end + 2..line_end + 2 + size)?);
        at = line_end + 2 + size + 2;
    }
}

fn answer(status: u16, body: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} proxy\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

fn message_id_of(body: &[u8]) -> Option<String> {
    let v = json::parse(body).ok()?;
    let env = v.as_object()?.get("envelope")?;
    env.as_object()?
        .get("message_id")
        .and_then(Value::as_str)
        .map(str::to_string)
}
