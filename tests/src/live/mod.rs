//! The suite's view of real relays: host processes, a fault-injecting proxy between them,
//! a client over HTTP and WebSocket, and the delivery invariants checked on what the
//! relays answer.

pub mod check;
pub mod client;
pub mod host;
pub mod proxy;
