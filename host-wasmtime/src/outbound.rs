//! Calls to other relays: deliveries and route lookups (signed), and peers' published keys.

use crate::guest::{Outcome, PeerMethod, PeerRequest};
use crate::ops::AttemptOutcome;
use crate::{now_ms, App};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use relay_core::wire::identity::RelayId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connecting may take at most this long before the attempt counts as not made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole exchange may take at most this long before its outcome counts as unknown.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest answer read from a peer.
const MAX_ANSWER: usize = 1 << 20;

/// The HTTP client and the cache of peers' keys.
pub struct Peers {
    client: Client<HttpConnector, Full<Bytes>>,
    keys: Mutex<HashMap<String, [u8; 32]>>,
    response_timeout: Duration,
}

/// How an exchange with a peer ended.
pub enum Exchange {
    /// An answer: status and body.
    Answered(u16, Vec<u8>),
    /// The request never left: connection refused, name not resolved, unsupported scheme.
    NotSent(String),
    /// Sent, but no answer: timeout, reset, lost response.
    Unknown(String),
}

impl Peers {
    pub fn new() -> Peers {
        Peers::within(RESPONSE_TIMEOUT)
    }

    /// A client whose exchanges end within the engine's attempt timeout (ms): the host gives
    /// up at two thirds of it, so its verdict reaches the core before the core's own timer.
    pub fn for_attempts(attempt_timeout: u64) -> Peers {
        Peers::within(RESPONSE_TIMEOUT.min(Duration::from_millis((attempt_timeout * 2 / 3).max(1))))
    }

    fn within(response_timeout: Duration) -> Peers {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT.min(response_timeout)));
        http.set_nodelay(true);
        Peers {
            client: Client::builder(TokioExecutor::new()).build(http),
            keys: Mutex::new(HashMap::new()),
            response_timeout,
        }
    }

    /// One HTTP exchange; never follows redirects.
    pub async fn exchange(
        &self,
        method: hyper::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Exchange {
        if !url.starts_with("http://") {
            return Exchange::NotSent(format!("{url}: this build speaks plain HTTP only"));
        }
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(url)
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

    /// A peer relay's published key: cached, fetched from `{relay}/.well-known/relay` on a miss or when `refresh`.
    pub async fn key(&self, relay: &RelayId, network: &str, refresh: bool) -> Option<[u8; 32]> {
        if !refresh {
            if let Some(k) = self
                .keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(relay.as_str())
            {
                return Some(*k);
            }
        }
        let url = format!("{}/.well-known/relay", relay.as_str());
        match self
            .exchange(hyper::Method::GET, &url, &[], Vec::new())
            .await
        {
            Exchange::Answered(200, body) => {
                match relay_core::wire::relay_request::parse_well_known(&body, relay, network) {
                    Ok(k) => {
                        self.keys
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(relay.as_str().to_string(), k);
                        Some(k)
                    }
                    Err(e) => {
                        tracing::warn!(peer = %relay, "bad /.well-known/relay: {e}");
                        None
                    }
                }
            }
            _ => None,
        }
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
    let (task, attempt) = (req.task, req.attempt);
    let effects = app
        .core
        .run(move |c| c.outcome(&task, attempt, &outcome, now_ms()))
        .await;
    app.dispatch(effects);
}
