//! The HTTP listeners' sockets, counted: a connection adds one to `relay_open_connections`
//! when it is accepted and takes it away when it closes (an atomic each way, nothing per request).

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use prometheus_client::metrics::gauge::Gauge;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener whose connections are counted in `open`.
pub struct Counting {
    inner: TcpListener,
    open: Gauge,
}

impl Counting {
    pub fn new(inner: TcpListener, open: Gauge) -> Counting {
        Counting { inner, open }
    }
}

/// An accepted connection; dropping it (the connection closed) takes it off the count.
pub struct Counted {
    stream: TcpStream,
    open: Gauge,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl Listener for Counting {
    type Io = Counted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Counted, SocketAddr) {
        let (stream, addr) = Listener::accept(&mut self.inner).await;
        self.open.inc();
        let open = self.open.clone();
        (Counted { stream, open }, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// The TCP peer of a request (what `ConnectInfo` hands the handlers).
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, Counting>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, Counting>) -> PeerAddr {
        PeerAddr(*stream.remote_addr())
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
