//! Connected WebSockets by account and device: where notifications go and which sockets a revocation closes.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc;

/// What a socket's writer task sends.
#[derive(Debug)]
pub enum Outgoing {
    Text(String),
    Close(u16, String),
}

struct Conn {
    id: u64,
    device: String,
    tx: mpsc::UnboundedSender<Outgoing>,
}

/// The registry of open sockets.
#[derive(Default)]
pub struct Hub {
    next: Mutex<u64>,
    by_account: Mutex<HashMap<String, Vec<Conn>>>,
}

impl Hub {
    /// Registers a socket of `device` of `account`; returns its id.
    pub fn add(&self, account: &str, device: &str, tx: mpsc::UnboundedSender<Outgoing>) -> u64 {
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
                tx,
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

    /// Pushes `message.timeline.changed` to every connected device of the account.
    pub fn notify(&self, account: &str, latest_seq: u64) {
        let frame = format!(
            "{{\"method\":\"message.timeline.changed\",\"params\":{{\"account\":\"{account}\",\"latest_seq\":{latest_seq}}}}}"
        );
        if let Some(v) = self
            .by_account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(account)
        {
            for c in v {
                let _ = c.tx.send(Outgoing::Text(frame.clone()));
            }
        }
    }

    /// Closes the device's sockets with 4401 (its sessions ended).
    pub fn end_device(&self, account: &str, device: &str) {
        if let Some(v) = self
            .by_account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(account)
        {
            for c in v.iter().filter(|c| c.device == device) {
                let _ = c.tx.send(Outgoing::Close(4401, "device revoked".into()));
            }
        }
    }
}
