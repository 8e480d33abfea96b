//! Calls to other relays: deliveries and route lookups (signed), and peers' published keys.
//!
//! Outbound safety (issue 18). Off the `dev` network a relay reaches peers over https only,
//! and only at public addresses: a peer's name is resolved here, every address it resolves
//! to is checked, and the connection goes to a checked one (the connector is handed only
//! those, so a second resolution cannot swap another in: DNS rebinding is caught). Refused
//! are loopback, private, link-local, CGNAT, multicast, unspecified, reserved and broadcast
//! addresses, and the IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms of them; such a
//! peer is *not attempted*. `--allow-private-peers` lifts the address check.
//!
//! Key fetches for inbound relay requests are limited ([`KeyFetches`]): one per claimed
//! relay per 10 s, failures remembered for 60 s, 8 in flight in all.

use crate::guest::{Outcome, PeerMethod, PeerRequest};
use crate::ops::AttemptOutcome;
use crate::{now_ms, App};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use relay_core::wire::identity::RelayId;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Connecting (TCP, then TLS) may take at most this long before the attempt counts as not made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole exchange may take at most this long before its outcome counts as unknown.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest answer read from a peer.
const MAX_ANSWER: usize = 1 << 20;

/// Per claimed relay id, at most one key fetch in this long.
pub const KEY_FETCH_INTERVAL: Duration = Duration::from_secs(10);
/// A failed key fetch is remembered this long: no fetch for that relay until then.
pub const KEY_FETCH_NEGATIVE: Duration = Duration::from_secs(60);
/// Key fetches in flight at most, all relays together; beyond it the request gets 503.
pub const KEY_FETCH_CONCURRENCY: usize = 8;
/// Relays whose keys, fetch times and failures are remembered, at most.
const KEY_FETCH_MEMORY: usize = 65_536;

/// Why an IPv4 address is refused as a peer, or `None` when it is public.
fn refused_v4(b: [u8; 4]) -> Option<&'static str> {
    let [a, c, ..] = b;
    match () {
        _ if a == 0 => Some("unspecified"),
        _ if a == 127 => Some("loopback"),
        _ if a == 10 || (a == 172 && c & 0xf0 == 16) || (a == 192 && c == 168) => Some("private"),
        _ if a == 169 && c == 254 => Some("link-local"),
        _ if a == 100 && c & 0xc0 == 64 => Some("shared (CGNAT)"),
        _ if (224..=239).contains(&a) => Some("multicast"),
        _ if a >= 240 => Some("reserved or broadcast"),
        _ => None,
    }
}

/// Why a relay must not connect to `ip` off `dev`, or `None` when it may: loopback, private
/// (10/8, 172.16/12, 192.168/16, fc00::/7, site-local fec0::/10), link-local (169.254/16,
/// fe80::/10), CGNAT (100.64/10), multicast (224/4, ff00::/8), unspecified (0/8, ::),
/// reserved and broadcast (240/4); the IPv4 address inside IPv4-mapped (::ffff:a.b.c.d),
/// IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses is
/// judged as IPv4.
pub fn refused_address(ip: IpAddr) -> Option<&'static str> {
    let b = match ip {
        IpAddr::V4(v) => return refused_v4(v.octets()),
        IpAddr::V6(v) => v.octets(),
    };
    let zero = |from: usize, to: usize| b[from..to].iter().all(|x| *x == 0);
    let v4 = |at: usize| refused_v4([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if zero(0, 16) {
        return Some("unspecified");
    }
    if zero(0, 15) && b[15] == 1 {
        return Some("loopback");
    }
    if zero(0, 10) && b[10] == 0xff && b[11] == 0xff {
        return v4(12);
    }
    if zero(0, 12) {
        return v4(12);
    }
    if b[..4] == [0x00, 0x64, 0xff, 0x9b] && zero(4, 12) {
        return v4(12);
    }
    if b[0] == 0x20 && b[1] == 0x02 {
        return v4(2);
    }
    match (b[0], b[1]) {
        (x, _) if x & 0xfe == 0xfc => Some("private"),
        (0xfe, y) if y & 0xc0 == 0x80 => Some("link-local"),
        (0xfe, y) if y & 0xc0 == 0xc0 => Some("private (site-local)"),
        (0xff, _) => Some("multicast"),
        _ => None,
    }
}

/// Where this relay may connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Peers are reached over https only.
    pub https_only: bool,
    /// Only public addresses ([`refused_address`]).
    pub vet: bool,
}

impl Rules {
    /// Anything (the `dev` network, tools and tests).
    pub const OPEN: Rules = Rules {
        https_only: false,
        vet: false,
    };

    /// The rules on `network`: off `dev`, https only and (unless `allow_private`) public addresses only.
    pub fn on(network: &str, allow_private: bool) -> Rules {
        if network == "dev" {
            return Rules::OPEN;
        }
        Rules {
            https_only: true,
            vet: !allow_private,
        }
    }
}

/// The resolver of the connector: resolves a peer's name and, when vetting, hands on only
/// its public addresses (the connection goes to one of them and nowhere else).
#[derive(Clone)]
struct Resolver {
    vet: bool,
}

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let vet = self.vet;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !vet {
                return Ok(all.into_iter());
            }
            let ok: Vec<SocketAddr> = all
                .iter()
                .copied()
                .filter(|a| refused_address(a.ip()).is_none())
                .collect();
            if ok.is_empty() {
                let seen: Vec<String> = all
                    .iter()
                    .map(|a| format!("{} ({})", a.ip(), refused_address(a.ip()).unwrap_or("?")))
                    .collect();
                let why = format!("{host} resolves to no public address: {}", seen.join(", "));
                tracing::warn!(
                    "peer refused, not attempted: {why} (--allow-private-peers lifts the address check)"
                );
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
            }
            Ok(ok.into_iter())
        })
    }
}

/// A connection to a peer, plain or TLS.
pub enum PeerIo {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>),
}

impl Connection for PeerIo {
    fn connected(&self) -> Connected {
        match self {
            PeerIo::Plain(s) => s.connected(),
            PeerIo::Tls(_) => Connected::new(),
        }
    }
}

impl hyper::rt::Read for PeerIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for PeerIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            PeerIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            PeerIo::Plain(s) => s.is_write_vectored(),
            PeerIo::Tls(s) => s.is_write_vectored(),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The connector: TCP to an address the resolver vetted, then TLS for https (rustls).
#[derive(Clone)]
struct Connector {
    http: HttpConnector<Resolver>,
    tls: tokio_rustls::TlsConnector,
}

impl tower_service::Service<hyper::Uri> for Connector {
    type Response = PeerIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<PeerIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let mut http = self.http.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let https = uri.scheme_str() == Some("https");
            let host = uri
                .host()
                .unwrap_or("")
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let tcp = tower_service::Service::call(&mut http, uri).await?;
            if !https {
                return Ok(PeerIo::Plain(tcp));
            }
            let name = rustls::pki_types::ServerName::try_from(host)?;
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name, tcp.into_inner()))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            Ok(PeerIo::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// What a relay's key lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLookup {
    /// The key (cached or just fetched).
    Key([u8; 32]),
    /// None to use: the fetch failed, failed lately, or the relay's interval has not passed.
    None,
    /// A fetch is needed and [`KEY_FETCH_CONCURRENCY`] are in flight: answer 503.
    Busy,
}

type Shared = watch::Receiver<Option<Option<[u8; 32]>>>;

#[derive(Default)]
struct KeyMemory {
    keys: HashMap<String, [u8; 32]>,
    /// When each relay's last fetch started.
    last: HashMap<String, Instant>,
    /// Until when each relay's failure is remembered.
    failed: HashMap<String, Instant>,
    /// Fetches in flight, by relay: later askers wait for the same one.
    inflight: HashMap<String, Shared>,
    /// Fetches made (tests).
    fetches: u64,
}

/// Sets `k` in a bounded map: when it is full, what has expired goes, else all of it.
fn remember<V>(m: &mut HashMap<String, V>, k: &str, v: V, live: impl Fn(&V) -> bool) {
    if m.len() >= KEY_FETCH_MEMORY && !m.contains_key(k) {
        m.retain(|_, v| live(v));
        if m.len() >= KEY_FETCH_MEMORY {
            m.clear();
        }
    }
    m.insert(k.to_string(), v);
}

/// The key-fetch limits of protocol.md §6 for relay requests: a fetch per claimed relay at
/// most once per [`KEY_FETCH_INTERVAL`], a failed fetch remembered for
/// [`KEY_FETCH_NEGATIVE`], [`KEY_FETCH_CONCURRENCY`] in flight in all, and concurrent
/// requests for the same relay sharing one fetch.
#[derive(Default)]
pub struct KeyFetches {
    memory: Arc<Mutex<KeyMemory>>,
}

/// Takes a fetch off the in-flight map however it ends (its request may be dropped midway).
struct InFlight {
    memory: Arc<Mutex<KeyMemory>>,
    relay: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .inflight
            .remove(&self.relay);
    }
}

impl KeyFetches {
    /// Key fetches started so far (tests).
    pub fn fetches(&self) -> u64 {
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fetches
    }

    /// The relay's key: from the cache, else fetched with `fetch` within the limits.
    /// `refresh` asks for a newer key than the cached one (a signature did not verify
    /// under it): fetched only once the relay's interval has passed.
    pub async fn get<F>(&self, relay: &str, refresh: bool, fetch: F) -> KeyLookup
    where
        F: Future<Output = Option<[u8; 32]>>,
    {
        enum Plan {
            Done(KeyLookup),
            Wait(Shared),
            Fetch(watch::Sender<Option<Option<[u8; 32]>>>),
        }
        let plan = {
            let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            let cached = m.keys.get(relay).copied();
            let now = Instant::now();
            match (cached, m.inflight.get(relay)) {
                (Some(k), _) if !refresh => Plan::Done(KeyLookup::Key(k)),
                (_, Some(shared)) => Plan::Wait(shared.clone()),
                _ if m.failed.get(relay).is_some_and(|until| *until > now) => {
                    Plan::Done(KeyLookup::None)
                }
                _ if m
                    .last
                    .get(relay)
                    .is_some_and(|at| now.duration_since(*at) < KEY_FETCH_INTERVAL) =>
                {
                    Plan::Done(match cached {
                        Some(k) if !refresh => KeyLookup::Key(k),
                        _ => KeyLookup::None,
                    })
                }
                _ if m.inflight.len() >= KEY_FETCH_CONCURRENCY => Plan::Done(KeyLookup::Busy),
                _ => {
                    remember(&mut m.last, relay, now, |at| {
                        now.duration_since(*at) < KEY_FETCH_INTERVAL
                    });
                    m.fetches += 1;
                    let (tx, rx) = watch::channel(None);
                    m.inflight.insert(relay.to_string(), rx);
                    Plan::Fetch(tx)
                }
            }
        };
        let tx = match plan {
            Plan::Done(l) => return l,
            Plan::Wait(mut rx) => {
                let got = rx.wait_for(Option::is_some).await.ok().and_then(|v| *v);
                return got.flatten().map_or(KeyLookup::None, KeyLookup::Key);
            }
            Plan::Fetch(tx) => tx,
        };
        let _inflight = InFlight {
            memory: self.memory.clone(),
            relay: relay.to_string(),
        };
        let key = fetch.await;
        {
            let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            match key {
                Some(k) => {
                    remember(&mut m.keys, relay, k, |_| false);
                    m.failed.remove(relay);
                }
                None => remember(&mut m.failed, relay, now + KEY_FETCH_NEGATIVE, |until| {
                    *until > now
                }),
            }
        }
        let _ = tx.send(Some(key));
        key.map_or(KeyLookup::None, KeyLookup::Key)
    }
}

/// The HTTP client, the rules it connects by, and the limits on key fetches.
pub struct Peers {
    client: Client<Connector, Full<Bytes>>,
    rules: Rules,
    keys: KeyFetches,
    response_timeout: Duration,
}

/// How an exchange with a peer ended.
pub enum Exchange {
    /// An answer: status and body.
    Answered(u16, Vec<u8>),
    /// The request never left: connection refused, name not resolved, unsupported scheme,
    /// a peer address refused, a TLS handshake that failed.
    NotSent(String),
    /// Sent, but no answer: timeout, reset, lost response.
    Unknown(String),
}

impl Peers {
    /// A client that goes anywhere over http or https (the system's roots): tools and tests.
    pub fn new() -> Peers {
        let tls = crate::tls::client_config(&[]).expect("TLS client configuration");
        Peers::build(Rules::OPEN, tls, RESPONSE_TIMEOUT)
    }

    /// A relay's client: exchanges end within the engine's attempt timeout (ms) (the host
    /// gives up at two thirds of it, so its verdict reaches the core before the core's own
    /// timer), connections follow `rules`, https trusts `tls`'s roots.
    pub fn for_attempts(
        attempt_timeout: u64,
        rules: Rules,
        tls: Arc<rustls::ClientConfig>,
    ) -> Peers {
        let within = RESPONSE_TIMEOUT.min(Duration::from_millis((attempt_timeout * 2 / 3).max(1)));
        Peers::build(rules, tls, within)
    }

    /// A client with the given rules, TLS roots and response timeout.
    pub fn build(
        rules: Rules,
        tls: Arc<rustls::ClientConfig>,
        response_timeout: Duration,
    ) -> Peers {
        let mut http = HttpConnector::new_with_resolver(Resolver { vet: rules.vet });
        http.set_connect_timeout(Some(CONNECT_TIMEOUT.min(response_timeout)));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = Connector {
            http,
            tls: tokio_rustls::TlsConnector::from(tls),
        };
        Peers {
            client: Client::builder(TokioExecutor::new()).build(connector),
            rules,
            keys: KeyFetches::default(),
            response_timeout,
        }
    }

    /// Key fetches started so far (tests).
    pub fn key_fetches(&self) -> u64 {
        self.keys.fetches()
    }

    /// Why `url` must not be reached under the rules, before any connection: a scheme other
    /// than https off `dev`, or an IP literal that is not public. (A name is checked when it
    /// is resolved.)
    fn refused_url(&self, url: &hyper::Uri) -> Option<String> {
        match url.scheme_str() {
            Some("https") => {}
            Some("http") if !self.rules.https_only => {}
            Some("http") => {
                return Some(format!(
                    "{url}: relays off the dev network are reached over https only"
                ))
            }
            _ => return Some(format!("{url}: not an http or https URL")),
        }
        if !self.rules.vet {
            return None;
        }
        let host = url.host()?.trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = host.parse().ok()?;
        let why = refused_address(ip)?;
        tracing::warn!(
            "peer refused, not attempted: {url}: {ip} is {why} (--allow-private-peers lifts the address check)"
        );
        Some(format!("{url}: {ip} is {why}"))
    }

    /// One HTTP exchange; never follows redirects.
    pub async fn exchange(
        &self,
        method: hyper::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Exchange {
        let uri: hyper::Uri = match url.parse() {
            Ok(u) => u,
            Err(e) => return Exchange::NotSent(format!("{url}: {e}")),
        };
        if let Some(why) = self.refused_url(&uri) {
            return Exchange::NotSent(why);
        }
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = match req.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => return Exchange::NotSent(e.to_string()),
        };
        let fut = async {
            let resp = self.client.request(req).await?;
            let status = resp.status().as_u16();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading answer: {e}"))?
                .to_bytes();
            Ok::<_, anyhow::Error>((status, body.to_vec()))
        };
        match tokio::time::timeout(self.response_timeout, fut).await {
            Err(_) => Exchange::Unknown("timeout".into()),
            Ok(Ok((status, body))) => Exchange::Answered(status, body),
            Ok(Err(e)) => {
                let connect = e
                    .downcast_ref::<hyper_util::client::legacy::Error>()
                    .is_some_and(|e| e.is_connect());
                if connect {
                    Exchange::NotSent(format!("{e:#}"))
                } else {
                    Exchange::Unknown(format!("{e:#}"))
                }
            }
        }
    }

    /// A peer relay's published key: cached, fetched from `{relay}/.well-known/relay` on a
    /// miss or when `refresh`, within the limits of [`KeyFetches`].
    pub async fn key(&self, relay: &RelayId, network: &str, refresh: bool) -> KeyLookup {
        let fetch = async {
            let url = format!("{}/.well-known/relay", relay.as_str());
            match self
                .exchange(hyper::Method::GET, &url, &[], Vec::new())
                .await
            {
                Exchange::Answered(200, body) => {
                    match relay_core::wire::relay_request::parse_well_known(&body, relay, network) {
                        Ok(k) => Some(k),
                        Err(e) => {
                            tracing::warn!(peer = %relay, "bad /.well-known/relay: {e}");
                            None
                        }
                    }
                }
                Exchange::Answered(s, _) => {
                    tracing::debug!(peer = %relay, "key fetch: status {s}");
                    None
                }
                Exchange::NotSent(why) | Exchange::Unknown(why) => {
                    tracing::debug!(peer = %relay, "key fetch failed: {why}");
                    None
                }
            }
        };
        self.keys.get(relay.as_str(), refresh, fetch).await
    }
}

impl Default for Peers {
    fn default() -> Peers {
        Peers::new()
    }
}

/// Executes one `send` effect and reports its outcome to the core.
pub async fn attempt(app: Arc<App>, req: PeerRequest) {
    let method = match req.method {
        PeerMethod::Deliver => "message.deliver",
        PeerMethod::RouteGet => "route.get",
    };
    let url = format!("{}/relay/v1/{method}", req.target);
    let (target, body) = (req.target.clone(), req.body.clone());
    let started = std::time::Instant::now();
    let headers = app
        .core
        .run(move |c| c.sign_request(method, &target, &body, now_ms()))
        .await;
    let outcome = match headers {
        None => Outcome::NotAttempted,
        Some(h) => {
            let pairs = [
                ("Relay-Id", h.relay_id.as_str()),
                ("Relay-Timestamp", h.timestamp.as_str()),
                ("Relay-Nonce", h.nonce.as_str()),
                ("Relay-Signature", h.signature.as_str()),
            ];
            match app.peers.exchange(hyper::Method::POST, &url, &pairs, req.body.clone()).await {
                Exchange::Answered(200, body) => Outcome::Answered(body),
                Exchange::Answered(s, _) if (300..400).contains(&s) => Outcome::Rejected(
                    br#"{"error":{"code":"unavailable","message":"the peer answered with a redirect"}}"#.to_vec(),
                ),
                Exchange::Answered(s, body) => {
                    tracing::debug!(peer = %req.target, status = s, "peer rejected {method}");
                    Outcome::Rejected(body)
                }
                Exchange::NotSent(why) => {
                    tracing::debug!(peer = %req.target, "not sent: {why}");
                    Outcome::NotAttempted
                }
                Exchange::Unknown(why) => {
                    tracing::debug!(peer = %req.target, "unknown outcome: {why}");
                    Outcome::Unknown
                }
            }
        }
    };
    app.metrics.attempt(
        match &outcome {
            Outcome::Answered(_) => AttemptOutcome::Answered,
            Outcome::Rejected(_) => AttemptOutcome::Rejected,
            Outcome::Unknown => AttemptOutcome::Unknown,
            Outcome::NotAttempted => AttemptOutcome::NotAttempted,
        },
        started.elapsed(),
    );
    // The outcome reaches the core even through a trap or a storage fault: a report that was
    // not kept (its group commit failed, or the call failed) is made again, after 100 ms,
    // then twice as long each time; after the longest wait the core's own attempt timeout
    // decides instead.
    let mut wait = crate::RETRY_FIRST_MS;
    loop {
        let (task, o) = (req.task.clone(), outcome.clone());
        let attempt = req.attempt;
        let kept = app
            .core
            .run(move |c| Some(c.outcome(&task, attempt, &o, now_ms())))
            .await;
        let why = match kept {
            Some(Ok(effects)) => {
                app.dispatch(effects);
                return;
            }
            Some(Err(why)) => why,
            None => "its group commit failed".to_string(),
        };
        if wait > crate::RETRY_MAX_MS {
            tracing::warn!(
                task = %req.task,
                "the outcome of an attempt could not be recorded ({why}); the core's attempt timeout decides it"
            );
            return;
        }
        tracing::warn!(task = %req.task, "the outcome of an attempt was not kept ({why}); reporting it again in {wait} ms");
        tokio::time::sleep(Duration::from_millis(wait)).await;
        wait *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_pass_in_every_form() {
        let refused = [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
        ];
        for a in refused {
            let ip: IpAddr = a.parse().unwrap();
            assert!(refused_address(ip).is_some(), "{a} passed");
        }
        let public = [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.167.1.1",
            "169.253.1.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ];
        for a in public {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(refused_address(ip), None, "{a} refused");
        }
    }

    fn peers(rules: Rules) -> Peers {
        Peers::build(
            rules,
            crate::tls::client_config_trusting(b"").unwrap(),
            Duration::from_secs(1),
        )
    }

    #[test]
    fn off_dev_only_https_urls_and_public_ip_literals_are_reached() {
        let dev = peers(Rules::on("dev", false));
        let off = peers(Rules::on("prod", false));
        let allowed = peers(Rules::on("prod", true));
        let uri = |u: &str| u.parse::<hyper::Uri>().unwrap();
        assert!(dev.refused_url(&uri("http://127.0.0.1:9")).is_none());
        assert!(off.refused_url(&uri("http://relay.example:9")).is_some());
        assert!(off.refused_url(&uri("https://relay.example:9")).is_none());
        assert!(off.refused_url(&uri("https://8.8.8.8:9")).is_none());
        for private in [
            "https://127.0.0.1:9",
            "https://10.0.0.1:9",
            "https://[::1]:9",
            "https://[::ffff:127.0.0.1]:9",
            "https://[fe80::1]:9",
        ] {
            assert!(off.refused_url(&uri(private)).is_some(), "{private}");
            assert!(allowed.refused_url(&uri(private)).is_none(), "{private}");
        }
        assert!(allowed.refused_url(&uri("http://10.0.0.1:9")).is_some());
    }

    #[tokio::test]
    async fn a_name_that_resolves_only_to_private_addresses_is_not_sent() {
        let off = peers(Rules::on("prod", false));
        // localhost resolves to loopback only: refused when resolved, before any connection.
        match off
            .exchange(hyper::Method::GET, "https://localhost:9/x", &[], Vec::new())
            .await
        {
            Exchange::NotSent(why) => assert!(why.contains("no public address"), "{why}"),
            _ => panic!("localhost was attempted"),
        }
    }

    #[tokio::test]
    async fn key_fetches_are_shared_limited_and_remembered() {
        let k = KeyFetches::default();
        // A failure is remembered: no second fetch, refresh or not.
        assert_eq!(k.get("r1", false, async { None }).await, KeyLookup::None);
        assert_eq!(
            k.get("r1", false, async { Some([1; 32]) }).await,
            KeyLookup::None
        );
        assert_eq!(
            k.get("r1", true, async { Some([1; 32]) }).await,
            KeyLookup::None
        );
        assert_eq!(k.fetches(), 1);
        // A success is cached; a refresh within the interval fetches nothing.
        assert_eq!(
            k.get("r2", false, async { Some([2; 32]) }).await,
            KeyLookup::Key([2; 32])
        );
        assert_eq!(
            k.get("r2", false, async { None }).await,
            KeyLookup::Key([2; 32])
        );
        assert_eq!(k.get("r2", true, async { None }).await, KeyLookup::None);
        assert_eq!(k.fetches(), 2);
        // Eight in flight: the ninth relay is busy; askers for one relay share its fetch.
        let k = Arc::new(KeyFetches::default());
        let (go, wait) = watch::channel(false);
        let mut held = Vec::new();
        for i in 0..KEY_FETCH_CONCURRENCY {
            let (k, mut wait) = (k.clone(), wait.clone());
            held.push(tokio::spawn(async move {
                k.get(&format!("slow{i}"), false, async move {
                    let _ = wait.wait_for(|g| *g).await;
                    Some([9; 32])
                })
                .await
            }));
        }
        while k.fetches() < KEY_FETCH_CONCURRENCY as u64 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            k.get("another", false, async { Some([3; 32]) }).await,
            KeyLookup::Busy
        );
        let sharer = {
            let k = k.clone();
            tokio::spawn(async move { k.get("slow0", false, async { None }).await })
        };
        tokio::task::yield_now().await;
        go.send_replace(true);
        for h in held {
            assert_eq!(h.await.unwrap(), KeyLookup::Key([9; 32]));
        }
        assert_eq!(sharer.await.unwrap(), KeyLookup::Key([9; 32]));
        assert_eq!(k.fetches(), KEY_FETCH_CONCURRENCY as u64);
        drop(wait);
        // A fetch whose asker went away leaves nothing in flight.
        let k = KeyFetches::default();
        let never = k.get("gone", false, std::future::pending());
        let _ = tokio::time::timeout(Duration::from_millis(10), never).await;
        assert!(k.memory.lock().unwrap().inflight.is_empty());
    }
}
