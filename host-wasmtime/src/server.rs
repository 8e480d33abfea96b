//! The transports of protocol.md §6 on one port, as bytes: every request is read whole
//! (within `max_request_bytes` and `--body-timeout`) and handed to the core, which routes,
//! authenticates and answers it; and the admin listener: the operator API (through the core
//! too), `/metrics` and health checks. The host keeps the sockets, the WebSocket protocol,
//! the busy admission and the backup's file work.

use crate::guest::{HttpRequest, HttpResponse, Listener, Resumption, Step, Upgrade};
use crate::hub::Outgoing;
use crate::net::PeerAddr;
use crate::{now_ms, App};
use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use relay_core::transport::ahead::Verdict;
use relay_core::transport::{self, health, socket};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The relay's public port: everything goes to the core (which answers 404 for what is not
/// a route), but health checks.
pub fn router(app: Arc<App>) -> Router {
    // GET and HEAD of the health checks are the host's (`transport::health`); any other
    // method there goes to the core like every other request (404).
    Router::new()
        .route("/healthz", get(healthz).fallback(public))
        .route("/readyz", get(readyz).fallback(public))
        .fallback(public)
        .with_state(app)
}

/// The admin listener: the operator API (the core checks the token), metrics and health checks.
pub fn admin_router(app: Arc<App>) -> Router {
    Router::new()
        .route("/metrics", get(metrics).fallback(admin))
        .route("/healthz", get(healthz).fallback(admin))
        .route("/readyz", get(readyz).fallback(admin))
        .fallback(admin)
        .with_state(app)
}

fn text_response(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    r
}

/// Live: the process serves.
async fn healthz() -> Response {
    native_response(health::answer(health::Check::Live, None))
}

/// Ready: the storage takes commits, the core instance is healthy, and shutdown has not begun.
async fn readyz(State(app): State<Arc<App>>) -> Response {
    native_response(health::answer(health::Check::Ready, app.health.not_ready()))
}

/// The core's counts (every shard's, merged), then the host's own, in the Prometheus text
/// format (0.0.4).
async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut texts = Vec::new();
    for k in 0..app.shard_count() {
        match app.core(k).run(|c| c.metrics(crate::now_ms())).await {
            Some(Ok(text)) => texts.push(text),
            failed => {
                let why = match failed {
                    Some(Err(e)) => format!(": {e}"),
                    _ => String::new(),
                };
                let why = format!("the core's metrics could not be read{why}");
                return native_response(health::answer(health::Check::Ready, Some(&why)));
            }
        }
    }
    let mut text = match texts.len() {
        1 => texts.remove(0),
        _ => relay_core::engine::metrics::merge_shards(&texts),
    };
    text.push_str(&app.metrics.render());
    text_response(StatusCode::OK, health::METRICS_TYPE, text)
}

/// 503 unavailable, `Retry-After: 1`: the relay is busy.
fn busy_response() -> Response {
    native_response(transport::Response::busy())
}

/// An answer the host gives itself, with the core's own words (linked natively).
fn native_response(r: transport::Response) -> Response {
    write_response(
        r.status,
        r.headers.into_iter().map(|(k, v)| (k.to_string(), v)),
        r.body,
    )
}

/// The core's answer, written as it is.
fn core_response(r: HttpResponse) -> Response {
    write_response(r.status, r.headers, r.body)
}

fn write_response(
    status: u16,
    headers: impl IntoIterator<Item = (String, String)>,
    body: Vec<u8>,
) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            axum::http::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            r.headers_mut().insert(k, v);
        }
    }
    r
}

/// Reads a request body, refusing one over the limit before any of it is parsed.
///
/// A declared length over the path's limit (`max_request_bytes`; `max_batch_bytes` for
/// relay RPC in batches), or a count that passes it while reading (chunked too), is refused
/// at once, the rest unread; so is a body not read whole within `--body-timeout`, or one
/// that cannot be read. The core spells each answer.
async fn read_body(
    app: &App,
    path: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<u8>, Response> {
    let limit = app.policies.body_limit(path) as usize;
    let refused = |r| native_response(transport::Response::refused(r));
    let too_large = transport::Refusal::TooLarge {
        limit: limit as u64,
    };
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(refused(too_large));
    }
    let within = std::time::Duration::from_millis(app.limits.body_timeout);
    let read = tokio::time::timeout(within, http_body_util::Limited::new(body, limit).collect());
    match read.await {
        Ok(Ok(b)) => Ok(b.to_bytes().to_vec()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(refused(too_large)),
        Ok(Err(e)) => {
            tracing::debug!("a request body could not be read: {e}");
            Err(refused(transport::Refusal::UnreadableBody))
        }
        Err(_) => Err(refused(transport::Refusal::BodyTimeout {
            ms: app.limits.body_timeout,
        })),
    }
}

/// The network address a call came from, as the core keys its per-address limits: the
/// TCP peer's IP address, without the port (an IPv4-mapped IPv6 address as IPv4).
fn origin(peer: SocketAddr) -> Option<String> {
    Some(peer.ip().to_canonical().to_string())
}

/// The headers the core reads, by lowercase name (values that are not text are left out).
fn core_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    transport::http::HEADERS
        .iter()
        .filter_map(|n| {
            let v = headers.get(*n)?.to_str().ok()?;
            Some((n.to_string(), v.to_string()))
        })
        .collect()
}

async fn public(
    State(app): State<Arc<App>>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    req: axum::extract::Request,
) -> Response {
    serve(app, Listener::Public, peer, req).await
}

async fn admin(
    State(app): State<Arc<App>>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    req: axum::extract::Request,
) -> Response {
    serve(app, Listener::Admin, peer, req).await
}

/// Reads one request whole and hands it to the core; executes what the core asks for.
async fn serve(
    app: Arc<App>,
    listener: Listener,
    peer: SocketAddr,
    req: axum::extract::Request,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let method = parts.method.as_str().to_string();
    let path = parts.uri.path().to_string();
    // The WebSocket handshake is checked first, as before the session: a GET of /v1/ws that
    // asks to upgrade but is not a valid handshake is refused by the WebSocket layer; one
    // that does not ask is the core's to answer (no such endpoint).
    let header = |n| {
        parts
            .headers
            .get(n)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let asks = transport::http::asks_websocket(header("connection"), header("upgrade"));
    let upgrade = if listener == Listener::Public && method == "GET" && path == "/v1/ws" && asks {
        match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(u) => Some(u),
            Err(e) => return e.into_response(),
        }
    } else {
        None
    };
    let body = match read_body(&app, &path, &parts.headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let request = transport::Request {
        listener: match listener {
            Listener::Public => transport::Listener::Public,
            Listener::Admin => transport::Listener::Admin,
        },
        method,
        query: parts.uri.query().unwrap_or("").to_string(),
        headers: core_headers(&parts.headers),
        body,
        origin: origin(peer),
        path,
    };
    // The core's rules for a request on this thread (`transport::ahead`), natively: what it
    // would answer without its state is answered here, and an envelope it will verify may
    // be verified here, in parallel with the core's thread.
    let sending = match app.ahead.request(&request, now_ms()) {
        Verdict::Answer(r) => return native_response(r),
        Verdict::Core { sending } => sending,
    };
    // The operator's listener is not subject to the busy admission (as before).
    let slot = match listener {
        Listener::Public => match app.admit() {
            Some(s) => Some(s),
            None => return busy_response(),
        },
        Listener::Admin => None,
    };
    let shard = app.shard_of(&request);
    let request = HttpRequest::from(request);
    let request = Arc::new(request);
    let r = request.clone();
    app.core_calls.fetch_add(1, Ordering::Relaxed);
    let handled = app
        .core(shard)
        .run_holding(slot.clone(), move |c| {
            c.handle(&r, sending.as_deref(), now_ms())
        })
        .await;
    let Some((mut step, mut waiting)) = handled else {
        return native_response(transport::Response::uncommitted());
    };
    loop {
        match step {
            Step::Respond(mut r) => {
                let events = std::mem::take(&mut r.events);
                app.dispatch(shard, events);
                return core_response(r);
            }
            // The request waits in the core: start the fetch it names, if any, and wait for
            // its resumption (the core bounds how often and how long it waits).
            Step::Parked(p) => {
                if let Some(need) = p.start {
                    crate::outbound::start(&app, shard, need);
                }
                match waiting.as_mut() {
                    Some(w) => match resumption(w).await {
                        Some(Resumption::Http(next)) => step = next,
                        // The core restarted or the report's commit failed: nothing was accepted.
                        _ => return native_response(transport::Response::uncommitted()),
                    },
                    None => return native_response(transport::Response::uncommitted()),
                }
                continue;
            }
            Step::Upgrade(u) => {
                let Some(up) = upgrade else {
                    return native_response(transport::Response::uncommitted());
                };
                // Every message (and frame) at most max_request_bytes: a bigger one closes
                // the socket with 1009 before it is read.
                let limit = app.max_request_bytes;
                let origin = request.origin.clone();
                // The socket joins the hub before the 101 is written: a notification
                // committed after the client saw the upgrade finds it (queued until it runs).
                let (out, rx) =
                    crate::hub::Outbox::new(app.limits.ws_send_queue as usize, app.metrics.clone());
                let registered = Registered {
                    id: app.hub.add(&u.account, &u.device_id, out.clone()),
                    account: u.account.clone(),
                    app: app.clone(),
                };
                return up
                    .max_message_size(limit)
                    .max_frame_size(limit)
                    .on_failed_upgrade(|e| tracing::debug!("websocket upgrade failed: {e}"))
                    .on_upgrade(move |socket| {
                        serve_socket(app, shard, socket, u, origin, (out, rx, registered))
                    })
                    .into_response();
            }
            Step::Backup(path) => return backup(&app, shard, path).await,
        }
    }
}

/// The next resumption of a request parked in the core, or none once it cannot come: the
/// core restarted, the report's commit failed, or (a backstop, should a report that re-parked
/// it be lost with a failed commit) no report reached it within the core's own bound on a
/// parked request plus one exchange. None is answered as uncommitted: nothing was accepted.
async fn resumption(w: &mut crate::guest::Waiting) -> Option<Resumption> {
    let bound = transport::parking::PARK_ABANDONED + transport::MAX_EXCHANGE_MS;
    tokio::time::timeout(std::time::Duration::from_millis(bound), w.recv())
        .await
        .ok()
        .flatten()
}

/// `POST /admin/v1/backup {"path": FILE}` as the core accepted it: a consistent copy of the
/// database to FILE (an absolute path on the relay's machine), taken between commit groups.
async fn backup(app: &App, shard: u32, path: String) -> Response {
    let path = std::path::PathBuf::from(path);
    let started = std::time::Instant::now();
    let target = path.clone();
    let written = app.core(shard).alone(move |c| c.backup(&target)).await;
    match &written {
        Ok(bytes) => {
            tracing::info!(path = %path.display(), bytes, ms = started.elapsed().as_millis() as u64, "backup written")
        }
        Err(e) => tracing::error!("backup to {}: {e}", path.display()),
    }
    let path = path.display().to_string();
    native_response(transport::Response::backup(
        &path,
        written.as_ref().copied().map_err(String::as_str),
    ))
}

/// The close code for an error read from a client's socket: 1009 for a message or frame
/// over the limit, 1007 for text that is not UTF-8, 1002 for any other protocol error
/// (reserved bits, an unmasked frame, a reserved opcode, ...); `None` when the connection
/// itself is gone.
fn close_code(e: axum::Error) -> Option<(u16, &'static str)> {
    use tungstenite::Error as E;
    let inner = e.into_inner();
    match inner.downcast_ref::<E>()? {
        E::Capacity(_) => Some((1009, "message too big")),
        E::Utf8(_) => Some((1007, "invalid UTF-8")),
        E::Protocol(tungstenite::error::ProtocolError::ResetWithoutClosingHandshake) => None,
        E::Protocol(_) => Some((1002, "protocol error")),
        _ => None,
    }
}

/// Serves one WebSocket: frames are answered in the order they came, one at a time; the
/// answers, notifications and pings go out through a queue of `--ws-send-queue` messages
/// (a client that lets it fill is dropped); a ping every `--ws-ping-interval`, and a socket
/// from which nothing came since the last one is closed.
/// A socket's place in the hub, given back when dropped: after the socket is served, or
/// when its upgrade failed or never happened (the upgrade callback is dropped unrun).
struct Registered {
    app: Arc<App>,
    account: String,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.app.hub.remove(&self.account, self.id);
    }
}

async fn serve_socket(
    app: Arc<App>,
    shard: u32,
    socket: WebSocket,
    info: Upgrade,
    origin: Option<String>,
    (out, mut rx, registered): (
        crate::hub::Outbox,
        tokio::sync::mpsc::Receiver<Outgoing>,
        Registered,
    ),
) {
    use futures_util::{SinkExt, StreamExt};
    /// Takes the socket off `relay_open_websockets` however the task ends.
    struct Open(Arc<relay_core::transport::host_metrics::HostMetrics>);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.open_websockets.dec();
        }
    }
    app.metrics.open_websockets.inc();
    let _open = Open(app.metrics.clone());
    let (mut sink, mut stream) = socket.split();
    let expiry = tokio::time::sleep(std::time::Duration::from_millis(
        info.expires_at.saturating_sub(now_ms()),
    ));
    tokio::pin!(expiry);
    let mut writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let (msg, last) = match m {
                Outgoing::Text(t) => (Message::Text(t.into()), false),
                Outgoing::Ping => (Message::Ping(Default::default()), false),
                Outgoing::Close(code, reason) => (
                    Message::Close(Some(CloseFrame {
                        code,
                        reason: reason.into(),
                    })),
                    true,
                ),
            };
            if sink.send(msg).await.is_err() || last {
                break;
            }
        }
    });
    let every = std::time::Duration::from_millis(app.limits.ws_ping_interval);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut alive = true;
    // Whether the socket ends with a close frame (waited for briefly) or is dropped at once.
    let mut closed_cleanly = false;
    loop {
        let msg = tokio::select! {
            _ = out.kill.notified() => break,
            _ = &mut expiry => {
                closed_cleanly = out.push(Outgoing::Close(
                    socket::SESSION_CLOSED,
                    socket::EXPIRED.into(),
                ));
                break;
            }
            _ = ping.tick() => {
                if !alive {
                    tracing::debug!("websocket closed: nothing came since the last ping");
                    break;
                }
                alive = false;
                if !out.push(Outgoing::Ping) {
                    break;
                }
                continue;
            }
            msg = stream.next() => msg,
        };
        let msg = match msg {
            None => break,
            Some(Err(e)) => {
                if let Some((code, reason)) = close_code(e) {
                    tracing::debug!("websocket closed with {code}: {reason}");
                    closed_cleanly = out.push(Outgoing::Close(code, reason.into()));
                }
                break;
            }
            Some(Ok(m)) => m,
        };
        alive = true;
        let text = match msg {
            Message::Text(t) => t.as_str().to_string(),
            Message::Close(_) => {
                // Sends the close frame tungstenite queued in answer.
                closed_cleanly = out.push(Outgoing::Close(1000, String::new()));
                break;
            }
            _ => continue,
        };
        let Some(slot) = app.admit() else {
            if !out.push(Outgoing::Text(socket::busy_frame(&text))) {
                break;
            }
            continue;
        };
        // A message.send's envelope may be verified here, ahead of the core's thread.
        let sending = app.ahead.frame(&info.token, &text);
        let (token, o, t) = (info.token.clone(), origin.clone(), text.clone());
        let (mut answer, mut waiting) = app
            .core(shard)
            .run_holding(Some(slot.clone()), move |c| {
                c.message(&token, o.as_deref(), &t, sending, now_ms())
            })
            .await
            .unwrap_or_else(|| (crate::guest::uncommitted_answer(&text), None));
        // The frame waits in the core (for a sibling shard's route): start the fetch it
        // names, if any, and wait for its answer.
        while let Some(p) = answer.parked.take() {
            if let Some(need) = p.start {
                crate::outbound::start(&app, shard, need);
            }
            answer = match waiting.as_mut() {
                Some(w) => match resumption(w).await {
                    Some(Resumption::Frame(a)) => a,
                    _ => crate::guest::uncommitted_answer(&text),
                },
                None => crate::guest::uncommitted_answer(&text),
            };
        }
        app.dispatch(shard, answer.events);
        if !out.push(Outgoing::Text(answer.text)) {
            break;
        }
        if let Some((code, reason)) = answer.close {
            closed_cleanly = out.push(Outgoing::Close(code, reason));
            break;
        }
    }
    drop(registered);
    drop(out);
    if closed_cleanly {
        // The close frame goes out (briefly waited for); then the connection closes.
        if tokio::time::timeout(std::time::Duration::from_secs(1), &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
    } else {
        writer.abort();
    }
}
