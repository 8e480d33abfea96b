//! Connected WebSockets by account and device: where notifications go and which sockets a revocation closes.
//!
//! Each socket's outbound queue is bounded (`--ws-send-queue`): a client that does not read
//! lets it fill, and is then dropped ([`Outbox::push`] says so and wakes its socket's task).

use relay_core::transport::host_metrics::HostMetrics;
use relay_core::transport::socket::STOPPING;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};

/// What a socket's writer task sends.
#[derive(Debug)]
pub enum Outgoing {
    Text(String),
    Ping,
    Close(u16, String),
}

/// A socket's outbound queue, and the signal that drops the socket.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Outgoing>,
    /// Notified when the socket must be dropped (its client does not read).
    pub kill: Arc<Notify>,
    metrics: Arc<HostMetrics>,
}

impl Outbox {
    /// A queue of `bound` messages; the receiver is the writer's.
    pub fn new(bound: usize, metrics: Arc<HostMetrics>) -> (Outbox, mpsc::Receiver<Outgoing>) {
        let (tx, rx) = mpsc::channel(bound.max(1));
        (
            Outbox {
                tx,
                kill: Arc::new(Notify::new()),
                metrics,
            },
            rx,
        )
    }

    /// Queues `m`; `false` when the socket is gone or its queue is full (then it is dropped).
    pub fn push(&self, m: Outgoing) -> bool {
        match self.tx.try_send(m) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::info!("websocket dropped: its client does not read (send queue full)");
                self.metrics.websockets_dropped.inc();
                self.kill.notify_one();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

struct Conn {
    id: u64,
    device: String,
    out: Outbox,
}

/// The registry of open sockets.
#[derive(Default)]
pub struct Hub {
    next: Mutex<u64>,
    by_account: Mutex<HashMap<String, Vec<Conn>>>,
}

impl Hub {
    /// Registers a socket of `device` of `account`; returns its id.
    pub fn add(&self, account: &str, device: &str, out: Outbox) -> u64 {
        let id = {
            let mut n = self.next.lock().unwrap_or_else(|e| e.into_inner());
            *n += 1;
            *n
        };
        self.by_account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(account.to_string())
            .or_default()
            .push(Conn {
                id,
                device: device.to_string(),
                out,
            });
        id
    }

    /// Forgets a socket.
    pub fn remove(&self, account: &str, id: u64) {
        let mut map = self.by_account.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get_mut(account) {
            v.retain(|c| c.id != id);
            if v.is_empty() {
                map.remove(account);
            }
        }
    }

    /// Pushes `frame` (the core's notification) to every connected device of the account.
    pub fn notify(&self, account: &str, frame: &str) {
        if let Some(v) = self
            .by_account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(account)
        {
            for c in v {
                c.out.push(Outgoing::Text(frame.to_string()));
            }
        }
    }

    /// Closes the device's sockets with the core's `code` and `reason` (its sessions ended).
    pub fn close_device(&self, account: &str, device: &str, code: u16, reason: &str) {
        if let Some(v) = self
            .by_account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(account)
        {
            for c in v.iter().filter(|c| c.device == device) {
                c.out.push(Outgoing::Close(code, reason.to_string()));
            }
        }
    }

    /// Closes every socket with the core's [`STOPPING`] (1001).
    pub fn close_all(&self) {
        for v in self
            .by_account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            for c in v {
                if !c.out.push(Outgoing::Close(STOPPING.0, STOPPING.1.into())) {
                    c.out.kill.notify_one();
                }
            }
        }
    }
}
