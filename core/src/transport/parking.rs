//! Requests that wait in the core for what they need: a relay's key (relay authentication)
//! or, on a sharded relay, an account's route from a sibling shard.
//!
//! A request that needs either is parked under the ticket its host gave it: the core keeps
//! it, tells the host which fetch to start (none when one for the same relay or account is
//! already under way, so many waiting requests cost one fetch), and hands its answer back
//! when the host reports the fetch ([`super::Relay::key_fetched`],
//! [`super::Relay::route_fetched`]). The host only executes effects: it never resubmits a
//! request, counts rounds or coalesces fetches. The table is bounded in entries and bytes,
//! and an entry no report reached within [`PARK_ABANDONED`] is answered busy at the next
//! report, so a lost fetch cannot hold a request or its memory for ever. It lives in
//! memory, as the key book does: a core that restarts has no parked requests, and its host
//! answers the requests it was holding for it as uncommitted (nothing was accepted).

use super::http::Request;
use super::keys::FETCH_ABANDONED;
use super::RouteWanted;
use std::collections::VecDeque;

/// Most requests parked at once; beyond, a request that would wait is answered busy (503,
/// retry in a second), and starts no fetch.
pub const MAX_PARKED: usize = 1024;
/// Most bytes (request bodies and frames) parked at once, beside [`MAX_PARKED`].
pub const MAX_PARKED_BYTES: usize = 32 << 20;
/// A parked request no report resumed within this many ms is answered busy at the next
/// report of any fetch (a host must report every fetch it starts; this bounds one that
/// did not).
pub const PARK_ABANDONED: u64 = FETCH_ABANDONED;
/// What a parked entry costs beside its body or text (its path, headers, bookkeeping).
const ENTRY_OVERHEAD: usize = 512;

/// A fetch the host starts for parked requests, then reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// GET `url` (no redirects) within `timeout_ms`; report it with
    /// [`super::Relay::key_fetched`] for `relay` ([`super::Fetch::Unknown`] if the time ran out).
    Key {
        /// The relay whose key is needed.
        relay: String,
        /// Its `/.well-known/relay`.
        url: String,
        /// Give up after this many ms.
        timeout_ms: u64,
    },
    /// POST [`RouteWanted::request`] to sibling shard `shard` of this relay (a public request
    /// to that shard's core); report its answer with [`super::Relay::route_fetched`].
    Route(RouteWanted),
}

/// A request or frame the core keeps until its fetch is reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parked {
    /// The fetch to start; `None`: one already under way brings what this request needs.
    pub start: Option<Need>,
}

/// What a parked request waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Awaited {
    /// The key of this relay.
    Key(String),
    /// The route of this account, from its shard.
    Route(String),
}

/// What is parked: the request or frame, kept whole to run again.
#[derive(Clone, Debug)]
pub(crate) enum Waiter {
    /// An HTTP request.
    Http(Request),
    /// A WebSocket text message of the socket opened for `token`.
    Frame {
        /// The socket's session token.
        token: String,
        /// The socket's origin.
        origin: Option<String>,
        /// The message.
        text: String,
    },
}

impl Waiter {
    /// What parking it costs in [`MAX_PARKED_BYTES`].
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Waiter::Http(r) => http_bytes(r),
            Waiter::Frame { token, text, .. } => frame_bytes(token, text),
        }
    }
}

/// What parking `req` costs in [`MAX_PARKED_BYTES`].
pub(crate) fn http_bytes(req: &Request) -> usize {
    ENTRY_OVERHEAD + req.body.len() + req.path.len() + req.query.len()
}

/// What parking a frame costs in [`MAX_PARKED_BYTES`].
pub(crate) fn frame_bytes(token: &str, text: &str) -> usize {
    ENTRY_OVERHEAD + token.len() + text.len()
}

/// One parked request.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// The host's name for it.
    pub ticket: u32,
    /// The request.
    pub waiter: Waiter,
    /// What it waits for.
    pub awaited: Awaited,
    /// How many times it has waited already (bounded by [`super::ROUNDS`]).
    pub round: u32,
    /// When it was parked.
    pub since: u64,
}

/// The parked requests, in the order they were parked (so they resume in that order).
#[derive(Debug, Default)]
pub(crate) struct Parking {
    entries: VecDeque<Entry>,
    bytes: usize,
}

impl Parking {
    /// Whether a request of `bytes` ([`http_bytes`], [`frame_bytes`]) under `ticket` can be
    /// parked now.
    pub(crate) fn has_room(&self, ticket: u32, bytes: usize) -> bool {
        self.entries.len() < MAX_PARKED
            && self.bytes + bytes <= MAX_PARKED_BYTES
            && !self.entries.iter().any(|e| e.ticket == ticket)
    }

    /// Parks `entry` (the caller checked [`Parking::has_room`]).
    pub(crate) fn park(&mut self, entry: Entry) {
        self.bytes += entry.waiter.bytes();
        self.entries.push_back(entry);
    }

    /// Whether some parked request waits for `awaited` (its fetch is under way).
    pub(crate) fn waits_for(&self, awaited: &Awaited) -> bool {
        self.entries.iter().any(|e| &e.awaited == awaited)
    }

    /// Takes out every request that waits for `awaited`, in the order they were parked.
    pub(crate) fn take(&mut self, awaited: &Awaited) -> Vec<Entry> {
        self.take_where(|e| &e.awaited == awaited)
    }

    /// Takes out every request parked [`PARK_ABANDONED`] ms or more before `now`.
    pub(crate) fn take_abandoned(&mut self, now: u64) -> Vec<Entry> {
        self.take_where(|e| now.saturating_sub(e.since) >= PARK_ABANDONED)
    }

    fn take_where(&mut self, mut f: impl FnMut(&Entry) -> bool) -> Vec<Entry> {
        if !self.entries.iter().any(&mut f) {
            return Vec::new();
        }
        let (taken, kept): (VecDeque<Entry>, VecDeque<Entry>) =
            std::mem::take(&mut self.entries).into_iter().partition(f);
        self.entries = kept;
        self.bytes = self.entries.iter().map(|e| e.waiter.bytes()).sum();
        taken.into()
    }

    /// How many requests are parked.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ticket: u32, len: usize) -> Entry {
        Entry {
            ticket,
            waiter: Waiter::Frame {
                token: "tok".into(),
                origin: None,
                text: "x".repeat(len),
            },
            awaited: Awaited::Route("acc".into()),
            round: 0,
            since: 0,
        }
    }

    #[test]
    fn the_parked_bytes_are_bounded_and_freed_when_taken() {
        let mut p = Parking::default();
        let big = 1 << 20;
        let mut t = 0;
        while p.has_room(t, frame_bytes("tok", &"x".repeat(big))) {
            p.park(frame(t, big));
            t += 1;
        }
        // Far below MAX_PARKED entries, the bytes ran out: 32 frames of 1 MiB do not fit.
        assert_eq!(t as usize, MAX_PARKED_BYTES / (big + ENTRY_OVERHEAD + 3));
        assert!(p.has_room(t, frame_bytes("tok", "small")));
        // Taking them out gives their bytes back.
        assert_eq!(p.take(&Awaited::Route("acc".into())).len(), t as usize);
        assert!(p.has_room(t, frame_bytes("tok", &"x".repeat(big))));
        assert_eq!(p.len(), 0);
    }
}
