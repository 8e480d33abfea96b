//! The transports of protocol.md §6 on one port: HTTP, WebSocket, relay RPC, `/.well-known/relay`,
//! and health checks; and the admin listener: the operator API, `/metrics` and health checks.

use crate::guest::{Caller, RelayHeaders, Reply};
use crate::hub::Outgoing;
use crate::net::PeerAddr;
use crate::{now_ms, App};
use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use relay_core::wire::canonical;
use relay_core::wire::identity::RelayId;
use relay_core::wire::json::{self, Object, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// Methods other relays may call.
const RELAY_METHODS: &[&str] = &[
    "message.deliver",
    "route.get",
    "route.publish",
    "device.list",
];

/// The relay's public routes (the admin API is not among them).
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/ws", get(websocket))
        .route("/v1/{method}", post(client_call))
        .route("/relay/v1/{method}", post(relay_call))
        .route("/.well-known/relay", get(well_known))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(app)
}

/// The admin listener's routes: the operator API (token), metrics and health checks.
pub fn admin_router(app: Arc<App>) -> Router {
    Router::new()
        .route("/admin/v1/{method}", post(admin_call))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
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
    text_response(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into())
}

/// Ready: the storage takes commits, the core instance is healthy, and shutdown has not begun.
async fn readyz(State(app): State<Arc<App>>) -> Response {
    match app.health.not_ready() {
        None => text_response(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "ready\n".into(),
        ),
        Some(why) => text_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            format!("not ready: {why}\n"),
        ),
    }
}

/// The core's counts, then the host's own, in the Prometheus text format (0.0.4).
async fn metrics(State(app): State<Arc<App>>) -> Response {
    let core = app.core.run(|c| Some(c.metrics())).await;
    match core {
        Some(Ok(mut text)) => {
            text.push_str(&app.metrics.render());
            text_response(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            )
        }
        Some(Err(e)) => text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("the core's metrics could not be read: {e}\n"),
        ),
        None => text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "the core's metrics could not be read\n".into(),
        ),
    }
}

fn json_response(status: u16, body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

fn error_response(code: relay_core::ErrorCode, message: &str) -> Response {
    let e = relay_core::Error::new(code, message);
    json_response(
        code.http_status(),
        canonical::to_vec(&relay_core::engine::error_body(&e)),
    )
}

/// The answer when `--max-pending` requests are in the core or waiting for it.
pub const BUSY: &[u8] =
    br#"{"error":{"code":"unavailable","data":{"retry_after":1000},"message":"the relay is busy; retry"}}"#;

/// 503 unavailable, `Retry-After: 1`: the relay is busy.
fn busy_response() -> Response {
    reply_response(Reply {
        status: 503,
        body: BUSY.to_vec(),
        effects: Vec::new(),
    })
}

/// An answer given before the request was read whole: the connection closes after it
/// (with a lingering close, `net`), the rest of the request unread.
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert("connection", HeaderValue::from_static("close"));
    r
}

fn reply_response(reply: Reply) -> Response {
    let mut r = json_response(reply.status, reply.body.clone());
    if reply.status == 429 || reply.status == 503 {
        // Mirror data.retry_after (ms) as Retry-After (seconds, rounded up, at least 1).
        if let Some(ms) = json::parse(&reply.body)
            .ok()
            .and_then(|v| v.as_object().and_then(|o| o.get("error")).cloned())
            .and_then(|e| e.as_object().and_then(|o| o.get("data")).cloned())
            .and_then(|d| {
                d.as_object()
                    .and_then(|o| o.get("retry_after"))
                    .and_then(Value::as_protocol_int)
            })
        {
            if let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).max(1).to_string()) {
                r.headers_mut().insert("retry-after", v);
            }
        }
    }
    r
}

/// Reads a request body, refusing one over the limit before any of it is parsed; the bytes and their parse.
///
/// A declared length over `max_request_bytes`, or a count that passes it while reading
/// (chunked too), is answered 413 at once, the rest unread; a body not read whole within
/// `--body-timeout` is answered 408. Either closes the connection.
async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Vec<u8>, Object), Response> {
    let limit = app.max_request_bytes;
    let too_large = || {
        closing(error_response(
            relay_core::ErrorCode::PayloadTooLarge,
            &format!("request body exceeds max_request_bytes {limit}"),
        ))
    };
    if let Some(len) = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(too_large());
        }
    }
    let within = std::time::Duration::from_millis(app.limits.body_timeout);
    let read = tokio::time::timeout(within, http_body_util::Limited::new(body, limit).collect());
    let bytes = match read.await {
        Ok(Ok(b)) => b.to_bytes().to_vec(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        // The client went away or sent a broken body: nothing to answer it.
        Ok(Err(e)) => {
            return Err(closing(error_response(
                relay_core::ErrorCode::InvalidParams,
                &format!("the request body could not be read: {e}"),
            )))
        }
        Err(_) => {
            let e = relay_core::Error::new(
                relay_core::ErrorCode::Unavailable,
                format!(
                    "the request body did not arrive within {} ms",
                    app.limits.body_timeout
                ),
            );
            return Err(closing(json_response(
                408,
                canonical::to_vec(&relay_core::engine::error_body(&e)),
            )));
        }
    };
    // The core's own strict parser, linked natively: garbage never costs a trip into the guest,
    // and the verdict is the one the guest would give.
    match json::parse_object(&bytes) {
        Ok(parsed) => Ok((bytes, parsed)),
        Err(e) => {
            let e: relay_core::Error = e.into();
            Err(json_response(
                e.code.http_status(),
                canonical::to_vec(&relay_core::engine::error_body(&e)),
            ))
        }
    }
}

/// The network address a call came from, as the core keys its per-address limits: the
/// TCP peer's IP address, without the port.
fn origin(peer: SocketAddr) -> Option<String> {
    Some(peer.ip().to_string())
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get("authorization")?.to_str().ok()?;
    v.strip_prefix("Bearer ").map(|t| t.trim().to_string())
}

/// Whether the request carries the operator token; the bytes are compared in constant time.
fn is_operator(app: &App, headers: &HeaderMap) -> bool {
    use subtle::ConstantTimeEq;
    bearer(headers).is_some_and(|t| bool::from(t.as_bytes().ct_eq(app.admin_token.as_bytes())))
}

async fn client_call(
    State(app): State<Arc<App>>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (body, parsed) = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let caller = match bearer(&headers) {
        Some(t) => Caller::Session(t),
        None => Caller::Anonymous,
    };
    if method.starts_with("admin.") {
        return error_response(relay_core::ErrorCode::NotFound, "unknown method");
    }
    let Some(slot) = app.admit() else {
        return busy_response();
    };
    if let (Some(pre), Caller::Session(t), "message.send") =
        (&app.preverify, &caller, method.as_str())
    {
        pre.send(t, &parsed);
    }
    reply_response(
        app.call_holding(Some(slot), caller, origin(peer), method, body)
            .await,
    )
}

async fn admin_call(
    State(app): State<Arc<App>>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (body, parsed) = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !is_operator(&app, &headers) {
        return error_response(
            relay_core::ErrorCode::Unauthenticated,
            "operator token required",
        );
    }
    if method == "backup" {
        return backup(&app, &parsed).await;
    }
    reply_response(
        app.call(
            Caller::Operator,
            origin(peer),
            format!("admin.{method}"),
            body,
        )
        .await,
    )
}

/// `POST /admin/v1/backup {"path": FILE}`: a consistent copy of the database to FILE (an
/// absolute path on the relay's machine), taken between commit groups.
async fn backup(app: &App, params: &Object) -> Response {
    let path = match params.get("path").and_then(Value::as_str) {
        Some(p) if std::path::Path::new(p).is_absolute() => std::path::PathBuf::from(p),
        _ => {
            return error_response(
                relay_core::ErrorCode::InvalidParams,
                "backup takes {\"path\": an absolute file name}",
            )
        }
    };
    let started = std::time::Instant::now();
    let target = path.clone();
    match app.core.alone(move |c| c.backup(&target)).await {
        Ok(bytes) => {
            tracing::info!(path = %path.display(), bytes, ms = started.elapsed().as_millis() as u64, "backup written");
            let mut o = Object::new();
            o.insert("path", path.display().to_string());
            o.insert("bytes", bytes);
            json_response(200, canonical::to_vec(&Value::Object(o)))
        }
        Err(e) => {
            tracing::error!("backup to {}: {e}", path.display());
            error_response(relay_core::ErrorCode::Internal, &format!("backup: {e}"))
        }
    }
}

fn relay_headers(h: &HeaderMap) -> Option<RelayHeaders> {
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    Some(RelayHeaders {
        relay_id: get("relay-id")?,
        timestamp: get("relay-timestamp")?,
        nonce: get("relay-nonce")?,
        signature: get("relay-signature")?,
    })
}

async fn relay_call(
    State(app): State<Arc<App>>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (body, parsed) = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !RELAY_METHODS.contains(&method.as_str()) {
        return error_response(relay_core::ErrorCode::NotFound, "not a relay method");
    }
    let Some(h) = relay_headers(&headers) else {
        return error_response(
            relay_core::ErrorCode::Unauthenticated,
            "relay authentication headers are missing",
        );
    };
    let Some(slot) = app.admit() else {
        return busy_response();
    };
    // to, method and ts first; only then the source's key.
    let (h2, m2, b2) = (h.clone(), method.clone(), body.clone());
    let source = match app
        .core
        .run_holding(Some(slot.clone()), move |c| {
            c.check_request(&h2, &m2, &b2, now_ms())
        })
        .await
    {
        Ok(s) => s,
        Err(r) => return reply_response(r),
    };
    let Ok(source_id) = RelayId::parse(&source) else {
        return error_response(relay_core::ErrorCode::Unauthenticated, "bad Relay-Id");
    };
    // The key within the limits of protocol.md §6: one fetch per claimed relay per 10 s,
    // failures remembered 60 s, 8 in flight in all (beyond: 503).
    let mut verdict = None;
    for refresh in [false, true] {
        let key = match app.peers.key(&source_id, &app.network, refresh).await {
            crate::KeyLookup::Key(k) => k,
            crate::KeyLookup::None => continue,
            crate::KeyLookup::Busy => {
                let e = relay_core::Error::new(
                    relay_core::ErrorCode::Unavailable,
                    "too many key fetches in flight; retry",
                )
                .with_data(Value::Object({
                    let mut d = Object::new();
                    d.insert("retry_after", 1000u64);
                    d
                }));
                return reply_response(Reply {
                    status: 503,
                    body: canonical::to_vec(&relay_core::engine::error_body(&e)),
                    effects: Vec::new(),
                });
            }
        };
        let (h2, m2, b2) = (h.clone(), method.clone(), body.clone());
        let r = app
            .core
            .run_holding(Some(slot.clone()), move |c| {
                c.authenticate_request(&h2, &m2, &b2, now_ms(), &key)
            })
            .await;
        let retry = r.is_err() && !refresh;
        verdict = Some(r);
        if !retry {
            break;
        }
    }
    match verdict {
        Some(Ok(_)) => {
            if let (Some(pre), "message.deliver") = (&app.preverify, method.as_str()) {
                pre.deliver(&parsed);
            }
            reply_response(
                app.call_holding(
                    Some(slot),
                    Caller::Relay(source),
                    origin(peer),
                    method,
                    body,
                )
                .await,
            )
        }
        Some(Err(r)) => reply_response(r),
        None => error_response(
            relay_core::ErrorCode::Unauthenticated,
            "could not fetch the source relay's key",
        ),
    }
}

async fn well_known(State(app): State<Arc<App>>) -> Response {
    let Some(slot) = app.admit() else {
        return busy_response();
    };
    json_response(
        200,
        app.core.run_holding(Some(slot), |c| c.well_known()).await,
    )
}

async fn websocket(
    State(app): State<Arc<App>>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    up: WebSocketUpgrade,
) -> Response {
    let Some(token) = bearer(&headers).or_else(|| q.get("session").cloned()) else {
        return error_response(
            relay_core::ErrorCode::Unauthenticated,
            "a session is required",
        );
    };
    let Some(slot) = app.admit() else {
        return busy_response();
    };
    let t = token.clone();
    let info = match app
        .core
        .run_holding(Some(slot), move |c| c.session(&t, now_ms()))
        .await
    {
        Ok(i) => i,
        Err(r) => return reply_response(r),
    };
    // Every message (and frame) at most max_request_bytes: a bigger one closes the socket
    // with 1009 before it is read.
    let limit = app.max_request_bytes;
    up.max_message_size(limit)
        .max_frame_size(limit)
        .on_failed_upgrade(|e| tracing::debug!("websocket upgrade failed: {e}"))
        .on_upgrade(move |socket| serve_socket(app, socket, token, info, origin(peer)))
        .into_response()
}

/// Parses a frame; admin methods are never reachable from a socket.
fn parse_frame(text: &str) -> Result<(Value, String, Vec<u8>), (Value, relay_core::Error)> {
    let f = relay_core::wire::frame::parse(text.as_bytes())?;
    if f.method.starts_with("admin.") {
        return Err((
            f.id,
            relay_core::Error::new(relay_core::ErrorCode::NotFound, "unknown method"),
        ));
    }
    Ok((f.id, f.method, f.params))
}

fn answer_frame(id: Value, body: &[u8], ok: bool) -> String {
    let mut o = Object::new();
    o.insert("id", id);
    let v = json::parse(body).unwrap_or(Value::Null);
    if ok {
        o.insert("result", v);
    } else {
        let e = v
            .as_object()
            .and_then(|o| o.get("error"))
            .cloned()
            .unwrap_or(Value::Null);
        o.insert("error", e);
    }
    canonical::to_string(&Value::Object(o))
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
async fn serve_socket(
    app: Arc<App>,
    socket: WebSocket,
    token: String,
    info: crate::guest::SessionInfo,
    origin: Option<String>,
) {
    use crate::hub::Outbox;
    use futures_util::{SinkExt, StreamExt};
    /// Takes the socket off `relay_open_websockets` however the task ends.
    struct Open(prometheus_client::metrics::gauge::Gauge);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    app.metrics.open_websockets.inc();
    let _open = Open(app.metrics.open_websockets.clone());
    let (mut sink, mut stream) = socket.split();
    let (out, mut rx) = Outbox::new(
        app.limits.ws_send_queue as usize,
        app.metrics.websockets_dropped.clone(),
    );
    let conn = app.hub.add(&info.account, &info.device_id, out.clone());
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
                closed_cleanly = out.push(Outgoing::Close(4401, "session expired".into()));
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
        let frame = match parse_frame(&text) {
            Ok(f) => f,
            Err((id, e)) => {
                let body = canonical::to_vec(&relay_core::engine::error_body(&e));
                if !out.push(Outgoing::Text(answer_frame(id, &body, false))) {
                    break;
                }
                continue;
            }
        };
        let (id, method, params) = frame;
        let Some(slot) = app.admit() else {
            if !out.push(Outgoing::Text(answer_frame(id, BUSY, false))) {
                break;
            }
            continue;
        };
        if let (Some(pre), "message.send") = (&app.preverify, method.as_str()) {
            if let Ok(p) = json::parse_object(&params) {
                pre.send(&token, &p);
            }
        }
        let reply = app
            .call_holding(
                Some(slot),
                Caller::Session(token.clone()),
                origin.clone(),
                method,
                params,
            )
            .await;
        if !out.push(Outgoing::Text(answer_frame(
            id,
            &reply.body,
            reply.status == 200,
        ))) {
            break;
        }
        if reply.status == 401 {
            closed_cleanly = out.push(Outgoing::Close(4401, "session ended".into()));
            break;
        }
    }
    app.hub.remove(&info.account, conn);
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
