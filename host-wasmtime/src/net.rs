//! The HTTP listeners facing the internet (issue 18): an accept loop of the host's own over
//! hyper's HTTP/1 connections, with TLS (tokio-rustls) when the public listener has a
//! certificate.
//!
//! - Connections are capped at accept, in all (`--max-connections`, each listener) and per
//!   peer IP address (`--max-connections-per-ip`, the public listener): one over a cap is
//!   closed at once, never queued. Each open connection counts in `relay_open_connections`.
//! - Every connection has a watchdog: a connection that has not sent a whole request line
//!   and headers within `--header-timeout` of opening (or of the first byte of its next
//!   request) is closed; so is a keep-alive connection idle for `--idle-timeout`, and one
//!   that moves nothing either way for `--idle-timeout` + `--body-timeout` while a request
//!   is in progress. The body's own timer (`--body-timeout`, 408) is the handler's
//!   (`server::read_body`). A TLS handshake has `--header-timeout` too.
//! - A response that says `Connection: close` (413 and 408 answered before the body was
//!   read) is followed by a short lingering close: what the client still sends is read and
//!   dropped for at most 250 ms and 256 KiB, so the answer is not lost to a reset at once;
//!   the rest of the body is never read.
//! - Upgraded connections (WebSockets) leave the watchdog: their liveness is ping/pong.

use crate::settings::Limits;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use relay_core::transport::host_metrics::HostMetrics;
use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long a lingering close reads (and drops) what the client still sends, at most ...
const LINGER: Duration = Duration::from_millis(250);
/// ... and how much: the rest of a refused body is never read (the answer has left by then).
const LINGER_BYTES: usize = 256 * 1024;

/// The TCP peer of a request (what `ConnectInfo` hands the handlers).
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub SocketAddr);

/// Milliseconds on a monotonic clock, from 1 (0 means "not set").
fn clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// An IP address as the caps count it: an IPv4-mapped IPv6 address is its IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// What a listener enforces.
#[derive(Clone)]
pub struct Listen {
    pub limits: Limits,
    /// Cap connections per peer IP address too (the public listener).
    pub per_ip: bool,
    /// Serve TLS with this acceptor.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub metrics: Arc<HostMetrics>,
}

/// Open connections, in all and per peer address.
struct Caps {
    max: u64,
    max_per_ip: Option<u64>,
    open: Mutex<(u64, HashMap<IpAddr, u64>)>,
    metrics: Arc<HostMetrics>,
}

/// Why a connection was closed at accept.
enum Refused {
    Limit,
    PerIp,
}

/// One admitted connection; dropping it (the connection closed) gives its place back.
struct Admitted {
    caps: Arc<Caps>,
    ip: IpAddr,
}

impl Caps {
    fn admit(self: &Arc<Caps>, ip: IpAddr) -> Result<Admitted, Refused> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.0 >= self.max {
            return Err(Refused::Limit);
        }
        if let Some(per) = self.max_per_ip {
            let n = open.1.entry(ip).or_insert(0);
            if *n >= per {
                return Err(Refused::PerIp);
            }
            *n += 1;
        }
        open.0 += 1;
        self.metrics.open_connections.inc();
        Ok(Admitted {
            caps: self.clone(),
            ip,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.caps.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 = open.0.saturating_sub(1);
        if self.caps.max_per_ip.is_some() {
            if let Some(n) = open.1.get_mut(&self.ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.1.remove(&self.ip);
                }
            }
        }
        self.caps.metrics.open_connections.dec();
    }
}

/// What a connection's watchdog reads: requests in progress and when things last happened.
#[derive(Debug)]
pub struct ConnState {
    /// Requests whose answer has not been written whole.
    busy: AtomicU32,
    /// When the bytes of the next request began (or the connection opened); 0 when none wait.
    head_since: AtomicU64,
    /// When the last answer was written whole (or the connection opened).
    idle_since: AtomicU64,
    /// When bytes last moved either way.
    last_io: AtomicU64,
    /// Read and drop what the client still sends before closing (an early answer).
    linger: AtomicBool,
}

impl ConnState {
    fn new() -> ConnState {
        let now = clock();
        ConnState {
            busy: AtomicU32::new(0),
            head_since: AtomicU64::new(now),
            idle_since: AtomicU64::new(now),
            last_io: AtomicU64::new(now),
            linger: AtomicBool::new(false),
        }
    }

    fn on_read(&self) {
        let now = clock();
        self.last_io.store(now, Ordering::Relaxed);
        if self.busy.load(Ordering::Relaxed) == 0 && self.head_since.load(Ordering::Relaxed) == 0 {
            self.head_since.store(now, Ordering::Relaxed);
        }
    }

    fn on_write(&self) {
        self.last_io.store(clock(), Ordering::Relaxed);
    }

    /// A request's headers are in: it is being answered.
    fn begin(&self) {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
    }

    /// A request's answer is written whole (or dropped).
    fn end(&self) {
        self.idle_since.store(clock(), Ordering::Relaxed);
        self.busy.fetch_sub(1, Ordering::Relaxed);
    }

    /// Why the connection must close now, if it must.
    fn overdue(&self, limits: &Limits) -> Option<&'static str> {
        let now = clock();
        if self.busy.load(Ordering::Relaxed) == 0 {
            let head = self.head_since.load(Ordering::Relaxed);
            if head != 0 {
                return (now.saturating_sub(head) >= limits.header_timeout)
                    .then_some("the request headers did not arrive within --header-timeout");
            }
            let idle = self.idle_since.load(Ordering::Relaxed);
            return (now.saturating_sub(idle) >= limits.idle_timeout)
                .then_some("idle for --idle-timeout");
        }
        let quiet = now.saturating_sub(self.last_io.load(Ordering::Relaxed));
        (quiet >= limits.idle_timeout.saturating_add(limits.body_timeout))
            .then_some("nothing moved for --idle-timeout + --body-timeout")
    }
}

/// A byte stream: plain TCP, or TLS over it.
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Conn for T {}

/// A connection's byte stream, plain or TLS (tokio reads and writes a `Box` of either,
/// vectored writes included).
pub type Stream = Box<dyn Conn>;

/// An accepted connection: its stream, what the watchdog reads, and its place under the caps.
pub struct Io {
    stream: Option<Stream>,
    state: Arc<ConnState>,
    admitted: Option<Admitted>,
}

impl Io {
    fn stream(&mut self) -> &mut Stream {
        self.stream
            .as_mut()
            .expect("the stream is there until drop")
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        if !self.state.linger.load(Ordering::Relaxed) {
            return;
        }
        let (Some(stream), Ok(rt)) = (self.stream.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let admitted = self.admitted.take();
        rt.spawn(async move {
            linger(stream).await;
            drop(admitted);
        });
    }
}

/// Reads and drops what the client still sends, for a moment, then closes.
async fn linger(mut s: Stream) {
    let _ = s.shutdown().await;
    let mut buf = vec![0u8; 16 * 1024];
    let _ = tokio::time::timeout(LINGER, async {
        let mut read = 0;
        while let Ok(n) = s.read(&mut buf).await {
            read += n;
            if n == 0 || read >= LINGER_BYTES {
                break;
            }
        }
    })
    .await;
}

impl AsyncRead for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(self.stream()).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.on_read();
        }
        r
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(self.stream()).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.state.on_write();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(self.stream()).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.state.on_write();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.stream()).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.stream()).poll_shutdown(cx)
    }
}

/// A response body that tells the connection's watchdog when it has been written whole.
struct Tracked {
    body: axum::body::Body,
    state: Arc<ConnState>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.state.end();
    }
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves `router` on `listener` until `stop`; then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    listen: Listen,
    mut stop: watch::Receiver<bool>,
) {
    let caps = Arc::new(Caps {
        max: listen.limits.max_connections,
        max_per_ip: listen
            .per_ip
            .then_some(listen.limits.max_connections_per_ip),
        open: Mutex::new((0, HashMap::new())),
        metrics: listen.metrics.clone(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors (or a connection gone before it was taken): wait a
                // moment instead of spinning on the error.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admitted = match caps.admit(canonical(peer.ip())) {
            Ok(a) => a,
            Err(cause) => {
                match cause {
                    Refused::Limit => listen.metrics.refused_limit.inc(),
                    Refused::PerIp => listen.metrics.refused_per_ip.inc(),
                };
                tracing::debug!(peer = %peer, "connection closed at accept: over the cap");
                drop(tcp);
                continue;
            }
        };
        tasks.spawn(connection(
            tcp,
            peer,
            admitted,
            router.clone(),
            listen.clone(),
            stop.clone(),
        ));
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    admitted: Admitted,
    router: Router,
    listen: Listen,
    mut stop: watch::Receiver<bool>,
) {
    let _ = tcp.set_nodelay(true);
    let limits = listen.limits;
    let state = Arc::new(ConnState::new());
    let stream = match &listen.tls {
        None => Box::new(tcp) as Stream,
        Some(acceptor) => {
            let handshake = tokio::time::timeout(
                Duration::from_millis(limits.header_timeout),
                acceptor.accept(tcp),
            );
            match handshake.await {
                Ok(Ok(s)) => Box::new(s),
                Ok(Err(e)) => {
                    tracing::debug!(peer = %peer, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(peer = %peer, "TLS handshake not done within --header-timeout");
                    return;
                }
            }
        }
    };
    let io = Io {
        stream: Some(stream),
        state: state.clone(),
        admitted: Some(admitted),
    };
    let conn_state = state.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let state = conn_state.clone();
        state.begin();
        req.extensions_mut().insert(ConnectInfo(PeerAddr(peer)));
        let mut router = router.clone();
        async move {
            let resp = tower_service::Service::call(&mut router, req)
                .await
                .unwrap_or_else(|e: Infallible| match e {});
            let closing = resp
                .headers()
                .get(hyper::header::CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            if closing {
                state.linger.store(true, Ordering::Relaxed);
            }
            Ok::<_, Infallible>(resp.map(|body| Tracked { body, state }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let every = Duration::from_millis(
        (limits
            .header_timeout
            .min(limits.idle_timeout)
            .min(limits.body_timeout)
            / 4)
        .clamp(50, 1000),
    );
    let mut watch = tokio::time::interval(every);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(peer = %peer, "connection: {e}");
                }
                return;
            }
            _ = watch.tick() => {
                if let Some(why) = state.overdue(&limits) {
                    tracing::debug!(peer = %peer, "connection closed: {why}");
                    return;
                }
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
