//! Talking to a relay: `POST {relay}/v1/{method}` over HTTP(S) and `/v1/ws` over WebSocket.
//!
//! Every failure is classified the way the seed needs it: a relay's error
//! answer ([`RelayError`]), a request that certainly never left
//! ([`TransportError::NotAttempted`]), or one whose fate is unknown
//! ([`TransportError::Unknown`]): only the last may have been accepted, and
//! only an unchanged retry to the same relay may follow it.

use crate::error::{CallError, RelayError, TransportError};
use relay_core::wire::json::{self, Object, Value};
use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// The largest answer read from a relay (a full timeline page is well below this).
const MAX_ANSWER: u64 = 16 << 20;

/// A blocking HTTP client for relay methods.
#[derive(Clone)]
pub struct Http {
    agent: ureq::Agent,
}

impl Http {
    /// A client whose calls give up after `timeout` (an unknown outcome after sending).
    pub fn new(timeout: Duration) -> Http {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .timeout_connect(Some(Duration::from_secs(10)))
            // Error statuses carry protocol error objects; we read them ourselves.
            .http_status_as_error(false)
            // Like relay clients, never follow redirects: the request goes to the relay named.
            .max_redirects(0)
            .user_agent(concat!("relayctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Http { agent }
    }

    /// POSTs `body` (exact bytes) to `{relay}/v1/{method}`; the result object or why there is none.
    pub fn call(
        &self,
        relay: &str,
        method: &str,
        session: Option<&str>,
        body: &[u8],
    ) -> Result<Object, CallError> {
        let url = format!("{relay}/v1/{method}");
        let mut req = self
            .agent
            .post(&url)
            .header("content-type", "application/json");
        if let Some(s) = session {
            req = req.header("authorization", &format!("Bearer {s}"));
        }
        let resp = req
            .send(body)
            .map_err(|e| CallError::Transport(classify(&e)))?;
        read_answer(resp)
    }

    /// One operator request to a relay's admin listener (`relayctl admin`): `GET` (metrics)
    /// or `POST` with the operator's bearer token. The status and the whole body, or why
    /// there is none.
    pub fn admin(
        &self,
        method: &str,
        url: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), String> {
        let resp = if method == "GET" {
            self.agent.get(url).call()
        } else {
            let mut req = self
                .agent
                .post(url)
                .header("content-type", "application/json");
            if let Some(a) = authorization {
                req = req.header("authorization", a);
            }
            req.send(body)
        };
        let resp = resp.map_err(|e| format!("{url}: {e}"))?;
        read_body(resp).map_err(|e| format!("{url}: {e}"))
    }

    /// GETs `{relay}/.well-known/relay`.
    pub fn well_known(&self, relay: &str) -> Result<Object, CallError> {
        let url = format!("{relay}/.well-known/relay");
        let resp = self
            .agent
            .get(&url)
            .call()
            .map_err(|e| CallError::Transport(classify(&e)))?;
        read_answer(resp)
    }
}

/// Reads a whole answer (at most `MAX_ANSWER` bytes); a read that breaks off is an unknown outcome.
fn read_answer(resp: ureq::http::Response<ureq::Body>) -> Result<Object, CallError> {
    let (status, bytes) = read_body(resp)
        .map_err(|e| CallError::Transport(TransportError::Unknown(e.to_string())))?;
    answer(status, &bytes)
}

/// An answer's status and whole body (at most `MAX_ANSWER` bytes).
fn read_body(mut resp: ureq::http::Response<ureq::Body>) -> Result<(u16, Vec<u8>), ureq::Error> {
    let status = resp.status().as_u16();
    let bytes = resp
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER)
        .read_to_vec()?;
    Ok((status, bytes))
}

/// Reads an HTTP answer: 200 with a result object, or an error object.
fn answer(status: u16, bytes: &[u8]) -> Result<Object, CallError> {
    let parsed = json::parse_object(bytes);
    match (status, parsed) {
        (200, Ok(o)) => Ok(o),
        (200, Err(e)) => Err(CallError::Transport(TransportError::Unknown(format!(
            "unreadable answer: {e}"
        )))),
        (s, Ok(o)) => match RelayError::from_object(s, &o) {
            Some(e) => Err(CallError::Relay(e)),
            None => Err(CallError::Transport(TransportError::Unknown(format!(
                "HTTP {s} without an error object"
            )))),
        },
        // A 3xx or a proxy's error page: the relay did not process it as we know, so treat it
        // as unknown (the caller retries the same bytes; idempotency makes that safe).
        (s, Err(_)) => Err(CallError::Transport(TransportError::Unknown(format!(
            "HTTP {s} without an error object"
        )))),
    }
}

/// Sorts a ureq error into "never sent" and "maybe sent".
fn classify(e: &ureq::Error) -> TransportError {
    use ureq::Error as E;
    match e {
        E::HostNotFound | E::ConnectionFailed | E::BadUri(_) | E::RequireHttpsOnly(_) => {
            TransportError::NotAttempted(e.to_string())
        }
        E::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => {
            TransportError::NotAttempted(e.to_string())
        }
        E::Io(io) if io.kind() == ErrorKind::ConnectionRefused => {
            TransportError::NotAttempted(e.to_string())
        }
        _ => TransportError::Unknown(e.to_string()),
    }
}

/// What a WebSocket read produced.
#[derive(Debug)]
pub enum Incoming {
    /// A notification frame `{method, params}`.
    Notification { method: String, params: Object },
    /// Nothing arrived within the read timeout.
    Idle,
}

/// Why a socket stopped.
#[derive(Debug)]
pub enum WsError {
    /// The relay closed with 4401: the session ended (expired or revoked).
    SessionEnded,
    /// The relay answered a call with an error.
    Relay(RelayError),
    /// Anything else: the connection is gone.
    Closed(String),
}

impl std::fmt::Display for WsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WsError::SessionEnded => f.write_str("session ended"),
            WsError::Relay(e) => write!(f, "relay error {e}"),
            WsError::Closed(m) => f.write_str(m),
        }
    }
}

/// A plain or TLS connection under the WebSocket.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl std::io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl std::io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A WebSocket connection to a relay with one session.
pub struct Ws {
    socket: WebSocket<Stream>,
    next_id: u64,
    /// Notifications that arrived while waiting for an answer.
    pending: Vec<(String, Object)>,
}

impl Ws {
    /// Connects to `{relay}/v1/ws` with `session` as the bearer token.
    pub fn connect(relay: &str, session: &str, read_timeout: Duration) -> Result<Ws, WsError> {
        let (ws_url, tls) = if let Some(rest) = relay.strip_prefix("https://") {
            (format!("wss://{rest}/v1/ws"), true)
        } else if let Some(rest) = relay.strip_prefix("http://") {
            (format!("ws://{rest}/v1/ws"), false)
        } else {
            return Err(WsError::Closed(format!("{relay} is not an http(s) URL")));
        };
        let mut request = ws_url
            .as_str()
            .into_client_request()
            .map_err(|e| WsError::Closed(e.to_string()))?;
        let auth = format!("Bearer {session}")
            .parse()
            .map_err(|_| WsError::Closed("session token is not a header value".into()))?;
        request.headers_mut().insert("authorization", auth);
        let uri = request.uri().clone();
        let host = uri
            .host()
            .unwrap_or("")
            .trim_matches(['[', ']'])
            .to_string();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let tcp = TcpStream::connect((host.as_str(), port))
            .map_err(|e| WsError::Closed(format!("connecting to {host}:{port}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let stream = if tls {
            Stream::Tls(Box::new(tls_stream(&host, tcp)?))
        } else {
            Stream::Plain(tcp)
        };
        let (socket, _) = tungstenite::client(request, stream).map_err(|e| match e {
            tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))
                if r.status() == 401 =>
            {
                WsError::SessionEnded
            }
            other => WsError::Closed(format!("WebSocket handshake: {other}")),
        })?;
        let tcp = match socket.get_ref() {
            Stream::Plain(t) => t,
            Stream::Tls(t) => t.get_ref(),
        };
        // The read timeout lets a follower wake up to ping and notice a dead connection.
        let _ = tcp.set_read_timeout(Some(read_timeout));
        Ok(Ws {
            socket,
            next_id: 1,
            pending: Vec::new(),
        })
    }

    /// Calls `method` with `params` (exact bytes) and waits for its answer.
    pub fn call(&mut self, method: &str, params: &[u8]) -> Result<Object, WsError> {
        let id = self.next_id;
        self.next_id += 1;
        let params = std::str::from_utf8(params)
            .map_err(|_| WsError::Closed("params are not UTF-8".into()))?;
        // The params text is spliced in verbatim: the relay compares params as sent.
        let frame = format!(
            "{{\"id\":{id},\"method\":{},\"params\":{params}}}",
            quote(method)
        );
        self.socket.send(Message::text(frame)).map_err(ws_closed)?;
        let mut idle = 0;
        loop {
            match self.read_frame()? {
                None => {
                    // Two read timeouts without an answer: treat the call as lost.
                    idle += 1;
                    if idle >= 2 {
                        return Err(WsError::Closed(format!("no answer to {method}")));
                    }
                }
                Some(o) => {
                    if o.get("id").and_then(Value::as_protocol_int) == Some(id) {
                        if let Some(Value::Object(r)) = o.get("result") {
                            return Ok(r.clone());
                        }
                        return Err(match RelayError::from_object(0, &o) {
                            Some(e) => WsError::Relay(e),
                            None => WsError::Closed("answer has neither result nor error".into()),
                        });
                    }
                    if let (None, Some(m), Some(Value::Object(p))) = (
                        o.get("id"),
                        o.get("method").and_then(Value::as_str),
                        o.get("params"),
                    ) {
                        self.pending.push((m.to_string(), p.clone()));
                    }
                }
            }
        }
    }

    /// The next notification, or [`Incoming::Idle`] after the read timeout.
    pub fn next_incoming(&mut self) -> Result<Incoming, WsError> {
        if !self.pending.is_empty() {
            let (method, params) = self.pending.remove(0);
            return Ok(Incoming::Notification { method, params });
        }
        loop {
            match self.read_frame()? {
                None => return Ok(Incoming::Idle),
                Some(o) => {
                    if let (None, Some(m), Some(Value::Object(p))) = (
                        o.get("id"),
                        o.get("method").and_then(Value::as_str),
                        o.get("params"),
                    ) {
                        return Ok(Incoming::Notification {
                            method: m.to_string(),
                            params: p.clone(),
                        });
                    }
                    // A stray answer (to a call we gave up on): ignore it.
                }
            }
        }
    }

    /// Sends a ping (keeps middleboxes from dropping an idle connection).
    pub fn ping(&mut self) -> Result<(), WsError> {
        self.socket
            .send(Message::Ping(Vec::new().into()))
            .map_err(ws_closed)
    }

    /// Closes the connection politely.
    pub fn close(mut self) {
        let _ = self.socket.close(None);
        let _ = self.socket.flush();
    }

    /// One JSON object frame, `None` on read timeout.
    fn read_frame(&mut self) -> Result<Option<Object>, WsError> {
        loop {
            match self.socket.read() {
                Ok(Message::Text(t)) => {
                    return json::parse_object(t.as_bytes())
                        .map(Some)
                        .map_err(|e| WsError::Closed(format!("unreadable frame: {e}")));
                }
                Ok(Message::Close(c)) => {
                    return Err(match c {
                        Some(f) if f.code == CloseCode::from(4401) => WsError::SessionEnded,
                        Some(f) => {
                            WsError::Closed(format!("closed by relay: {} {}", f.code, f.reason))
                        }
                        None => WsError::Closed("closed by relay".into()),
                    })
                }
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(ws_closed(e)),
            }
        }
    }
}

fn ws_closed(e: tungstenite::Error) -> WsError {
    WsError::Closed(e.to_string())
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    relay_core::wire::canonical::to_string(&Value::from(s))
}

/// A rustls client stream to `host` with the webpki roots (the same trust ureq uses).
fn tls_stream(
    host: &str,
    tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, WsError> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| WsError::Closed(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| WsError::Closed(format!("{host}: {e}")))?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name)
        .map_err(|e| WsError::Closed(e.to_string()))?;
    Ok(rustls::StreamOwned::new(conn, tcp))
}
