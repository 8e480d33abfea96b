//! Calls to other relays: the requests the core built and signed, and peers' published keys
//! the core asked for. The core decides what to send and what the answer means; this is the
//! HTTP client that carries them.
//!
//! Outbound safety (issue 18). Off the `dev` network a relay reaches peers over https only,
//! and only at public addresses: a peer's name is resolved here, every address it resolves
//! to is checked, and the connection goes to a checked one (the connector is handed only
//! those, so a second resolution cannot swap another in: DNS rebinding is caught). Refused
//! are loopback, private, link-local, CGNAT, multicast, unspecified, reserved and broadcast
//! addresses, and the IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms of them; such a
//! peer is *not attempted*. `--allow-private-peers` lifts the address check.
//!
//! Key fetches for inbound relay requests are the core's: it parks the requests that wait,
//! names one fetch per relay however many wait, and bounds them with its key book; the
//! host carries out the fetch it names ([`start`]) and hands over what the report resumes.

use crate::guest::{Fetch, Handover, HttpRequest, Need, PeerRequest, Resumption, Step};
use crate::{now_ms, refused_address, App};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use relay_core::transport::Fetch as Seen;
use relay_core::transport::{address, outbound};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Connecting (TCP, then TLS) may take at most this long before the attempt counts as not made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole exchange may take at most this long before its outcome counts as unknown
/// (the core's bound; a step's own `timeout_ms` is shorter).
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(relay_core::transport::MAX_EXCHANGE_MS);

/// Where this relay may connect: the core's rules (`transport::address`) for its network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    network: String,
    allow_private: bool,
}

impl Rules {
    /// Anything (the `dev` network, tools and tests).
    pub fn open() -> Rules {
        Rules::on("dev", true)
    }

    /// The rules on `network`, with `--allow-private-peers` or not.
    pub fn on(network: &str, allow_private: bool) -> Rules {
        Rules {
            network: network.to_string(),
            allow_private,
        }
    }

    /// Whether every address a peer's name resolves to is checked.
    fn vet(&self) -> bool {
        address::vetted(&self.network, self.allow_private)
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
pub type PeerIo = TokioIo<Box<dyn crate::net::Conn>>;

impl Connection for Box<dyn crate::net::Conn> {
    fn connected(&self) -> Connected {
        Connected::new()
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
                return Ok(TokioIo::new(
                    Box::new(tcp.into_inner()) as Box<dyn crate::net::Conn>
                ));
            }
            let name = rustls::pki_types::ServerName::try_from(host)?;
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name, tcp.into_inner()))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            Ok(TokioIo::new(Box::new(stream) as Box<dyn crate::net::Conn>))
        })
    }
}

/// Starts the fetch the core named for requests parked in shard `shard`'s core, on a task of
/// its own (a request that goes away meanwhile does not abandon it): a relay's key document
/// (GET, no redirects, under the address rules) or an account's route from a sibling shard.
/// Its report goes to that shard's core, and the resumptions it makes go to their waiters
/// once the report's commit is durable.
pub fn start(app: &Arc<App>, shard: u32, need: Need) {
    let app = app.clone();
    tokio::spawn(async move {
        let delivered = match need {
            Need::Key(k) => {
                let fetch = fetch_key(&app, k.url, k.timeout_ms, &k.relay).await;
                let relay = k.relay;
                app.core(shard)
                    .run(move |c| c.key_fetched(&relay, &fetch, now_ms()))
                    .await
            }
            Need::Route(w) => {
                let wanted = relay_core::transport::RouteWanted {
                    account: w.account,
                    shard: w.shard,
                };
                let request = HttpRequest::from(wanted.request());
                let fetch = internal(&app, wanted.shard, request).await;
                let account = wanted.account;
                app.core(shard)
                    .run(move |c| c.route_fetched(&account, &fetch, now_ms()))
                    .await
            }
        };
        // A failed commit resumed nothing: the waiters' channels close with the deliveries.
        deliver(&app, shard, delivered.unwrap_or_default());
    });
}

/// Runs each resumption's events here (its request may have gone away; what the core
/// accepted still has its effects) and hands the answer to the request waiting for it.
fn deliver(app: &Arc<App>, shard: u32, deliveries: Vec<Handover>) {
    for (waiter, mut resumption) in deliveries {
        let events = match &mut resumption {
            Resumption::Http(Step::Respond(r)) => std::mem::take(&mut r.events),
            Resumption::Frame(a) => std::mem::take(&mut a.events),
            Resumption::Http(_) => Vec::new(),
        };
        app.dispatch(shard, events);
        let _ = waiter.send(resumption);
    }
}

/// GETs a relay's key document within the time the core gave.
async fn fetch_key(app: &App, url: String, timeout_ms: u64, relay: &str) -> Fetch {
    app.peers.key_gets.fetch_add(1, Ordering::Relaxed);
    let within = Duration::from_millis(timeout_ms);
    match app
        .peers
        .exchange_within(hyper::Method::GET, &url, &[], Vec::new(), within)
        .await
    {
        Exchange::Answered(s, body) => {
            if s != 200 {
                tracing::debug!(peer = %relay, "key fetch: status {s}");
            }
            Fetch::Answered((s, body))
        }
        Exchange::NotSent(why) => {
            tracing::debug!(peer = %relay, "key fetch not sent: {why}");
            Fetch::NotSent
        }
        Exchange::Unknown(why) => {
            tracing::debug!(peer = %relay, "key fetch failed: {why}");
            Fetch::Unknown
        }
    }
}

/// The HTTP client, the rules it connects by, and the limits on key fetches.
pub struct Peers {
    client: Client<Connector, Full<Bytes>>,
    rules: Rules,
    /// Key documents GET so far (tests).
    key_gets: AtomicU64,
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
        Peers::build(Rules::open(), tls, RESPONSE_TIMEOUT)
    }

    /// A relay's client: connections follow `rules`, https trusts `tls`'s roots, and each
    /// exchange ends within the time the core gave it.
    pub fn for_relay(rules: Rules, tls: Arc<rustls::ClientConfig>) -> Peers {
        Peers::build(rules, tls, RESPONSE_TIMEOUT)
    }

    /// A client with the given rules, TLS roots and response timeout.
    pub fn build(
        rules: Rules,
        tls: Arc<rustls::ClientConfig>,
        response_timeout: Duration,
    ) -> Peers {
        let mut http = HttpConnector::new_with_resolver(Resolver { vet: rules.vet() });
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
            key_gets: AtomicU64::new(0),
            response_timeout,
        }
    }

    /// Key fetches (GETs) started so far.
    pub fn key_fetches(&self) -> u64 {
        self.key_gets.load(Ordering::Relaxed)
    }

    /// Why `url` must not be reached under the rules, before any connection (the core's
    /// `address::refused_url`; a name is checked when it is resolved).
    fn refused_url(&self, url: &hyper::Uri) -> Option<String> {
        let why = address::refused_url(
            &url.to_string(),
            &self.rules.network,
            self.rules.allow_private,
        )?;
        tracing::warn!("peer refused, not attempted: {why}");
        Some(why)
    }

    /// One HTTP exchange; never follows redirects.
    pub async fn exchange(
        &self,
        method: hyper::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Exchange {
        self.exchange_within(method, url, headers, body, self.response_timeout)
            .await
    }

    /// One HTTP exchange that gives up after `within`; never follows redirects. The
    /// headers go as given (`content-type: application/json` unless they name one).
    pub async fn exchange_within(
        &self,
        method: hyper::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
        within: Duration,
    ) -> Exchange {
        let uri: hyper::Uri = match url.parse() {
            Ok(u) => u,
            Err(e) => return Exchange::NotSent(format!("{url}: {e}")),
        };
        if let Some(why) = self.refused_url(&uri) {
            return Exchange::NotSent(why);
        }
        let mut req = hyper::Request::builder().method(method).uri(uri);
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("content-type", "application/json");
        }
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
            let body = http_body_util::Limited::new(resp.into_body(), outbound::MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading answer: {e}"))?
                .to_bytes();
            Ok::<_, anyhow::Error>((status, body.to_vec()))
        };
        match tokio::time::timeout(within, fut).await {
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
}

impl Default for Peers {
    fn default() -> Peers {
        Peers::new()
    }
}

/// Runs `request` on shard `shard`'s core, as a request from the network would run there,
/// and executes its events for that shard: how a sharded relay asks a sibling shard for a
/// route it holds or shares one with it (a delivery between shards goes by `Core::sibling`
/// instead, in [`attempt`]), with no network between.
pub async fn internal(app: &Arc<App>, shard: u32, request: HttpRequest) -> Fetch {
    let request = Arc::new(request);
    let r = request.clone();
    let step = app
        .core(shard)
        .run(move |c| c.handle(&r, None, now_ms()).0)
        .await;
    match step {
        Some(Step::Respond(mut r)) => {
            app.dispatch(shard, std::mem::take(&mut r.events));
            Fetch::Answered((r.status, r.body))
        }
        // A public route.get or route.publish asks for nothing else.
        Some(_) => Fetch::Answered((500, relay_core::transport::Response::uncommitted().body)),
        // Its group commit failed: nothing was accepted there, and nothing is known here.
        None => Fetch::Unknown,
    }
}

/// Carries one `send` event (the core built and signed it) of shard `shard`'s core and
/// reports what became of it: over the network, or to the sibling shard it names.
pub async fn attempt(app: Arc<App>, shard: u32, req: PeerRequest) {
    let started = std::time::Instant::now();
    let exchange = match req.shard {
        // A sibling shard: its core runs the request as the relay's own call (no signature,
        // no nonce, no second verification) and its events run for it.
        Some(sibling) => {
            let (url, body) = (req.url.clone(), req.body.clone());
            let answer = app
                .core(sibling)
                .run(move |c| c.sibling(&url, &body, now_ms()))
                .await;
            match answer {
                Some(mut r) => {
                    app.dispatch(sibling, std::mem::take(&mut r.events));
                    Exchange::Answered(r.status, r.body)
                }
                // Its group commit failed: nothing was accepted there, and nothing is known here.
                None => Exchange::Unknown("the sibling shard's commit failed".into()),
            }
        }
        None => {
            let headers: Vec<(&str, &str)> = req
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let within = Duration::from_millis(req.timeout_ms.max(1));
            app.peers
                .exchange_within(
                    hyper::Method::POST,
                    &req.url,
                    &headers,
                    req.body.clone(),
                    within,
                )
                .await
        }
    };
    let (fetch, seen) = match exchange {
        Exchange::Answered(200, body) => (
            Fetch::Answered((200, body)),
            Seen::Answered(200, Vec::new()),
        ),
        Exchange::Answered(s, body) => {
            tracing::debug!(peer = %req.target, status = s, "peer rejected {}", req.url);
            (Fetch::Answered((s, body)), Seen::Answered(s, Vec::new()))
        }
        Exchange::NotSent(why) => {
            tracing::debug!(peer = %req.target, "not sent: {why}");
            (Fetch::NotSent, Seen::NotSent)
        }
        Exchange::Unknown(why) => {
            tracing::debug!(peer = %req.target, "unknown outcome: {why}");
            (Fetch::Unknown, Seen::Unknown)
        }
    };
    app.metrics.attempt(&seen, started.elapsed().as_secs_f64());
    // The outcome reaches the core even through a trap or a storage fault: a report that was
    // not kept (its group commit failed, or the call failed) is made again, after 100 ms,
    // then twice as long each time; after the longest wait the core's own attempt timeout
    // decides instead.
    let mut wait = relay_core::transport::alarm::RETRY_FIRST_MS;
    loop {
        let (task, f) = (req.task.clone(), fetch.clone());
        let attempt = req.attempt;
        let kept = app
            .core(shard)
            .run(move |c| c.fetched(&task, attempt, &f, now_ms()))
            .await;
        let why = match kept {
            Some(Ok(events)) => {
                app.dispatch(shard, events);
                return;
            }
            Some(Err(why)) => why,
            None => "its group commit failed".to_string(),
        };
        if wait > relay_core::transport::alarm::RETRY_MAX_MS {
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
}
