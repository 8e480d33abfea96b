//! HTTP as the core sees it: a request the host read whole, the answer to write.
//!
//! The host owns sockets, TLS, body limits and timeouts; it hands over the request line's
//! method and target, the headers in [`HEADERS`], the body and the peer's address. The
//! answer's status, headers and body are final: the host writes them as they are.

use super::{Door, Event};
use crate::engine::error_body;
use crate::wire::canonical;
use crate::wire::json::{self, Value};
use crate::{Error, ErrorCode};

/// The request headers the core reads (lowercase); a host may pass only these.
pub const HEADERS: [&str; 8] = [
    "authorization",
    "connection",
    "upgrade",
    "relay-id",
    "relay-timestamp",
    "relay-nonce",
    "relay-signature",
    "relay-route-revision",
];

/// Which listener a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The public port: clients, relays, WebSockets, `/.well-known/relay`.
    Public,
    /// The admin listener (loopback by default): the operator API.
    Admin,
}

/// A request the host read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Where it arrived.
    pub listener: Listener,
    /// The request line's method (`GET`, `POST`).
    pub method: String,
    /// The request target's path, without the query.
    pub path: String,
    /// The query string without `?` (empty when none).
    pub query: String,
    /// Headers by lowercase name; only those in [`HEADERS`] are read.
    pub headers: Vec<(String, String)>,
    /// The body, whole.
    pub body: Vec<u8>,
    /// The peer's IP address as text, no port (IPv4-mapped IPv6 as IPv4); none in process.
    pub origin: Option<String>,
}

impl Request {
    /// A request as the JS hosts pass one across a boundary: the admin listener or the
    /// public one, and `headers` as `name\nvalue\n` per header.
    pub fn from_lines(
        admin: bool,
        method: String,
        path: String,
        query: String,
        headers: &str,
        body: Vec<u8>,
        origin: Option<String>,
    ) -> Request {
        let mut lines = headers.split('\n');
        let mut pairs = Vec::new();
        while let (Some(k), Some(v)) = (lines.next(), lines.next()) {
            pairs.push((k.to_string(), v.to_string()));
        }
        Request {
            listener: if admin {
                Listener::Admin
            } else {
                Listener::Public
            },
            method,
            path,
            query,
            headers: pairs,
            body,
            origin,
        }
    }

    /// The value of header `name` (lowercase), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The bearer token of `Authorization`, if any.
    pub fn bearer(&self) -> Option<&str> {
        self.header("authorization")?
            .strip_prefix("Bearer ")
            .map(str::trim)
    }

    /// The four relay authentication headers, when all are present, and
    /// `Relay-Route-Revision` when it is.
    pub fn relay_headers(&self) -> Option<crate::wire::relay_request::RelayHeaders> {
        Some(crate::wire::relay_request::RelayHeaders {
            relay_id: self.header("relay-id")?.to_string(),
            timestamp: self.header("relay-timestamp")?.to_string(),
            nonce: self.header("relay-nonce")?.to_string(),
            signature: self.header("relay-signature")?.to_string(),
            route_revision: self.header("relay-route-revision").map(str::to_string),
        })
    }

    /// Where the core routes this request: the one routing table every caller of it reads.
    pub fn route(&self) -> Route<'_> {
        let path = self.path.as_str();
        let post = self.method == "POST";
        let call = match self.listener {
            Listener::Public => {
                if let Some(m) = path.strip_prefix("/v1/").filter(|_| post) {
                    Some((Door::Client, m))
                } else if let Some(m) = path.strip_prefix("/relay/v1/").filter(|_| post) {
                    Some((Door::Relay, m))
                } else if self.method == "GET" && path == "/.well-known/relay" {
                    return Route::WellKnown;
                } else if self.method == "GET" && path == "/v1/ws" && self.is_upgrade() {
                    return Route::Upgrade;
                } else {
                    None
                }
            }
            Listener::Admin => path
                .strip_prefix("/admin/v1/")
                .filter(|_| post)
                .map(|m| (Door::Operator, m)),
        };
        match call.filter(|(_, m)| !m.is_empty() && !m.contains('/')) {
            Some((door, name)) => Route::Call(door, name),
            None => Route::NotFound,
        }
    }

    /// Whether the request asks to become a WebSocket (`Connection: upgrade` and `Upgrade:
    /// websocket`, RFC 6455 §4.1): `GET /v1/ws` without both is no endpoint, on every host.
    pub fn is_upgrade(&self) -> bool {
        asks_websocket(self.header("connection"), self.header("upgrade"))
    }

    /// The value of query parameter `name`, if present (no percent-decoding: tokens are base64url).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == name).then_some(v)
        })
    }
}

/// Whether a request's `Connection` and `Upgrade` headers ask for a WebSocket: `upgrade`
/// among the connection options, and `websocket` as the protocol.
pub fn asks_websocket(connection: Option<&str>, upgrade: Option<&str>) -> bool {
    let token = |v: &str, t: &str| v.split(',').any(|o| o.trim().eq_ignore_ascii_case(t));
    connection.is_some_and(|c| token(c, "upgrade"))
        && upgrade.is_some_and(|u| token(u, "websocket"))
}

/// Where a request goes, by its listener, method and path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// `GET /.well-known/relay`.
    WellKnown,
    /// `GET /v1/ws` with `Upgrade: websocket`: a WebSocket upgrade.
    Upgrade,
    /// A POST of method `name` through `door`; the body is the call's params.
    Call(Door, &'a str),
    /// Nothing is served there.
    NotFound,
}

/// The answer to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// Headers to send (`content-type` always; `retry-after` with 429 and 503;
    /// `connection: close` with a [`Refusal`]).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// What the host must do once the answer is on its way.
    pub effects: Vec<Event>,
}

/// The body of the answer when the host's queue of work for the core is full.
pub const BUSY: &[u8] =
    br#"{"error":{"code":"unavailable","data":{"retry_after":1000},"message":"the relay is busy; retry"}}"#;

/// The body of the answer when a call was lost before its writes committed (a trap, a
/// failed group commit): nothing was accepted, so a retry is safe.
pub const UNCOMMITTED: &[u8] =
    br#"{"error":{"code":"internal","message":"the relay core failed; nothing was accepted"}}"#;

/// The message of [`UNCOMMITTED`], for the answers that carry it in other forms (a typed
/// call's [`super::typed::Failure::uncommitted`]).
pub const UNCOMMITTED_MESSAGE: &str = "the relay core failed; nothing was accepted";

/// What a host refuses on its own, before any core sees the request (the host reads the
/// body and keeps its time): spelled here once, so every host answers these alike. Each
/// answer closes the connection, since the rest of the request is left unread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The body passes `max_request_bytes`, declared or counted while reading: 413.
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// The body did not arrive whole within the body timeout: 408 `unavailable`.
    BodyTimeout {
        /// The timeout, in milliseconds.
        ms: u64,
    },
    /// The body could not be read (a broken chunked encoding, say): 400.
    UnreadableBody,
    /// The request target is not one the host can read: 400.
    UnreadableTarget,
}

impl Refusal {
    /// The refusal's name as the JS bindings take it (`too_large`, `body_timeout`,
    /// `unreadable_body`, `unreadable_target`), with its number where it has one.
    pub fn from_name(name: &str, n: u64) -> Option<Refusal> {
        Some(match name {
            "too_large" => Refusal::TooLarge { limit: n },
            "body_timeout" => Refusal::BodyTimeout { ms: n },
            "unreadable_body" => Refusal::UnreadableBody,
            "unreadable_target" => Refusal::UnreadableTarget,
            _ => return None,
        })
    }
}

impl Response {
    /// The answer to a request the host refused on its own, with `Connection: close`.
    pub fn refused(r: Refusal) -> Response {
        let (status, code, message) = match r {
            Refusal::TooLarge { limit } => (
                413,
                ErrorCode::PayloadTooLarge,
                format!("request body exceeds max_request_bytes {limit}"),
            ),
            Refusal::BodyTimeout { ms } => (
                408,
                ErrorCode::Unavailable,
                format!("the request body did not arrive within {ms} ms"),
            ),
            Refusal::UnreadableBody => (
                400,
                ErrorCode::InvalidParams,
                "the request body could not be read".to_string(),
            ),
            Refusal::UnreadableTarget => (
                400,
                ErrorCode::InvalidParams,
                "unreadable request target".to_string(),
            ),
        };
        let body = canonical::to_vec(&error_body(&Error::new(code, message)));
        let mut r = Response::json(status, body, Vec::new());
        r.headers.push(("connection", "close".to_string()));
        r
    }

    /// A JSON answer with `status`; 429 and 503 carry `Retry-After` from `data.retry_after`.
    pub fn json(status: u16, body: Vec<u8>, effects: Vec<Event>) -> Response {
        let mut headers = vec![("content-type", "application/json".to_string())];
        if status == 429 || status == 503 {
            if let Some(s) = retry_after_seconds(&body) {
                headers.push(("retry-after", s.to_string()));
            }
        }
        Response {
            status,
            headers,
            body,
            effects,
        }
    }

    /// The error answer for `e`, with the status protocol.md §4 gives its code.
    pub fn error(e: &Error) -> Response {
        Response::json(
            e.code.http_status(),
            canonical::to_vec(&error_body(e)),
            Vec::new(),
        )
    }

    /// An error answer from a code and message.
    pub fn fail(code: ErrorCode, message: &str) -> Response {
        Response::error(&Error::new(code, message))
    }

    /// 503: the host's queue of work for the core is full, or a request may not wait for
    /// what it needs ([`super::ROUNDS`], [`super::parking::MAX_PARKED`]); retry in a second.
    pub fn busy() -> Response {
        Response::json(503, BUSY.to_vec(), Vec::new())
    }

    /// 503: the relay's core cannot be started here (a store it must not open, a bad
    /// configuration, a trap it did not recover from); `why` says which. Retry later.
    pub fn cannot_start(why: &str) -> Response {
        Response::fail(
            ErrorCode::Unavailable,
            &format!("the relay cannot start: {why}"),
        )
    }

    /// 400: a WebSocket handshake reached a path that takes none (a host hands handshakes
    /// to the core only as HTTP upgrades).
    pub fn misrouted_handshake() -> Response {
        Response::fail(
            ErrorCode::InvalidParams,
            "a WebSocket handshake comes as an HTTP upgrade",
        )
    }

    /// 404: this host has no backup of its own to write (`why`: where its data is backed up).
    pub fn no_backup(why: &str) -> Response {
        Response::fail(ErrorCode::NotFound, &format!("backup: {why}"))
    }

    /// 500: the call was lost before it committed; nothing was accepted.
    pub fn uncommitted() -> Response {
        Response::json(500, UNCOMMITTED.to_vec(), Vec::new())
    }

    /// The answer to a backup the host was asked for ([`super::Step::Backup`]): `{"bytes",
    /// "path"}` once it is written, or 500 `internal` saying why it is not.
    pub fn backup(path: &str, written: Result<u64, &str>) -> Response {
        match written {
            Ok(bytes) => {
                let mut o = crate::wire::json::Object::new();
                o.insert("path", path);
                o.insert("bytes", bytes);
                Response::ok(&Value::Object(o))
            }
            Err(why) => Response::fail(ErrorCode::Internal, &format!("backup: {why}")),
        }
    }

    /// A 200 answer holding `value`, canonical.
    pub fn ok(value: &Value) -> Response {
        Response::json(200, canonical::to_vec(value), Vec::new())
    }
}

/// `Retry-After` in whole seconds (rounded up, at least 1) from an error body's
/// `data.retry_after` (ms), if it has one.
pub fn retry_after_seconds(body: &[u8]) -> Option<u64> {
    let v = json::parse(body).ok()?;
    let ms = v
        .as_object()?
        .get("error")?
        .as_object()?
        .get("data")?
        .as_object()?
        .get("retry_after")?
        .as_protocol_int()?;
    Some(ms.div_ceil(1000).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncommitted_call_is_answered_alike_over_http_and_typed() {
        let r = Response::uncommitted();
        assert_eq!(r.status, 500);
        let f = super::super::typed::Failure::uncommitted();
        assert_eq!((f.code, f.status), (crate::ErrorCode::Internal, 500));
        assert_eq!(f.error.message, UNCOMMITTED_MESSAGE);
        let body = crate::wire::json::parse(&r.body).unwrap();
        let message = body
            .as_object()
            .and_then(|o| o.get("error"))
            .and_then(|e| e.as_object()?.get("message")?.as_str().map(str::to_string));
        assert_eq!(message.as_deref(), Some(UNCOMMITTED_MESSAGE));
    }

    #[test]
    fn the_hosts_own_refusals_are_spelled_once_and_close_the_connection() {
        let cases = [
            (Refusal::TooLarge { limit: 262144 }, 413, br#"{"error":{"code":"payload_too_large","message":"request body exceeds max_request_bytes 262144"}}"#.as_slice()),
            (Refusal::BodyTimeout { ms: 30000 }, 408, br#"{"error":{"code":"unavailable","message":"the request body did not arrive within 30000 ms"}}"#),
            (Refusal::UnreadableBody, 400, br#"{"error":{"code":"invalid_params","message":"the request body could not be read"}}"#),
            (Refusal::UnreadableTarget, 400, br#"{"error":{"code":"invalid_params","message":"unreadable request target"}}"#),
        ];
        for (refusal, status, body) in cases {
            let r = Response::refused(refusal);
            assert_eq!((r.status, r.body.as_slice()), (status, body), "{refusal:?}");
            assert_eq!(
                r.headers,
                vec![
                    ("content-type", "application/json".to_string()),
                    ("connection", "close".to_string())
                ],
                "{refusal:?}"
            );
        }
        // The names the JS bindings pass.
        assert_eq!(
            Refusal::from_name("too_large", 7),
            Some(Refusal::TooLarge { limit: 7 })
        );
        assert_eq!(
            Refusal::from_name("body_timeout", 9),
            Some(Refusal::BodyTimeout { ms: 9 })
        );
        assert_eq!(
            Refusal::from_name("unreadable_body", 0),
            Some(Refusal::UnreadableBody)
        );
        assert_eq!(
            Refusal::from_name("unreadable_target", 0),
            Some(Refusal::UnreadableTarget)
        );
        assert_eq!(Refusal::from_name("teapot", 0), None);
    }

    #[test]
    fn a_backup_is_answered_with_its_path_and_size_or_why_it_failed() {
        let ok = Response::backup("/b/relay.db", Ok(4096));
        assert_eq!(
            (ok.status, ok.body.as_slice()),
            (200, br#"{"bytes":4096,"path":"/b/relay.db"}"#.as_slice())
        );
        let failed = Response::backup("/b/relay.db", Err("disk full"));
        assert_eq!(
            (failed.status, failed.body.as_slice()),
            (
                500,
                br#"{"error":{"code":"internal","message":"backup: disk full"}}"#.as_slice()
            )
        );
    }

    #[test]
    fn get_v1_ws_is_an_upgrade_only_when_it_asks_for_a_websocket() {
        let mut r = Request {
            listener: Listener::Public,
            method: "GET".into(),
            path: "/v1/ws".into(),
            query: String::new(),
            headers: Vec::new(),
            body: Vec::new(),
            origin: None,
        };
        assert_eq!(r.route(), Route::NotFound);
        r.headers.push(("upgrade".into(), "h2c".into()));
        r.headers
            .push(("connection".into(), "keep-alive, Upgrade".into()));
        assert_eq!(r.route(), Route::NotFound);
        r.headers[0].1 = "WebSocket".into();
        assert_eq!(r.route(), Route::Upgrade);
        // Both headers: `Upgrade: websocket` alone is no handshake.
        r.headers[1].1 = "keep-alive".into();
        assert_eq!(r.route(), Route::NotFound);
        r.headers[1].1 = "upgrade".into();
        r.listener = Listener::Admin;
        assert_eq!(r.route(), Route::NotFound);
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(retry_after_seconds(BUSY), Some(1));
        let b = br#"{"error":{"code":"rate_limited","message":"m","data":{"retry_after":1001}}}"#;
        assert_eq!(retry_after_seconds(b), Some(2));
        let r = Response::json(429, b.to_vec(), Vec::new());
        assert!(r.headers.contains(&("retry-after", "2".to_string())));
        let r = Response::json(400, b.to_vec(), Vec::new());
        assert!(r.headers.iter().all(|(k, _)| *k != "retry-after"));
    }

    #[test]
    fn bearer_and_query() {
        let r = Request {
            listener: Listener::Public,
            method: "GET".into(),
            path: "/v1/ws".into(),
            query: "a=1&session=tok".into(),
            headers: vec![("authorization".into(), "Bearer  abc ".into())],
            body: Vec::new(),
            origin: None,
        };
        assert_eq!(r.bearer(), Some("abc"));
        assert_eq!(r.query_param("session"), Some("tok"));
        assert_eq!(r.query_param("b"), None);
    }
}
