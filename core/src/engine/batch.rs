//! `message.deliver.batch` (protocol.md §6 "Relay RPC in batches"): the destination takes
//! a batch item by item, and a source sends what waits for one destination together.
//!
//! Rules decided once (docs/protocol.md "Batches"), a test each below:
//! 1. A batch is judged whole before any item runs. A body over `max_batch_bytes` is
//!    `payload_too_large` before it is parsed; params that are not exactly `{"items"}`, items
//!    that are not a list of 1 to `max_batch`, an item that is not exactly `{"params": object,
//!    "route_revision": integer}` are `invalid_params`. Such a batch stores nothing.
//! 2. Only a relay calls it, and without `Relay-Route-Revision` (each item names its own).
//! 3. Each item is a `message.deliver` of its own, in item order: one operation (one
//!    transaction) each, as the batch's relay aiming at the item's `route_revision`, so an
//!    item's result never depends on another's. An item whose params are over
//!    `max_request_bytes` answers `payload_too_large`.
//! 4. On a relay of several shards a batch reaches the shard of its first item's recipient;
//!    an item for an account of another shard answers `unavailable` (retry: sent again, it
//!    goes alone or first), since that shard's store is not this one's. This relay's own
//!    sources never send such a batch: a batch carries deliveries to one recipient.
//! 5. The answer is `{"results": [...]}`, one per item: the DeliveryStatus, or `{"error"}`.
//! 6. A source sends in one batch only deliveries already parked for the same destination
//!    and recipient, behind one that takes a free slot: a lone delivery goes at once, alone.
//!    A batch carries at most `min(max_batch, 64)` items and `min(max_batch_bytes, 1 MiB)`
//!    bytes (the protocol's defaults, since a destination's limits may be no larger).
//! 7. What became of a batch is what became of each item: a 200 answer's results in order
//!    (an answer that is not exactly one result per item is an unknown outcome for every
//!    item), an error answer the same error for every item, no answer the same for every
//!    item.

use super::config::{MAX_BATCH, MAX_BATCH_BYTES};
use super::{error_body, Caller, Engine, Entropy, Outcome, Response, Storage};
use crate::wire::canonical;
use crate::wire::json::{self, Object, Value};
use crate::{Error, ErrorCode};

/// The method's wire name.
pub const METHOD: &str = "message.deliver.batch";

/// Bytes a batch body spends around its items (`{"items":[` and `]}`).
const FRAME_BYTES: usize = 12;
/// Bytes an item spends around its params (`{"params":`, `,"route_revision":N}` and a comma).
const ITEM_BYTES: usize = 48;

/// One item of a batch as the destination reads it.
struct Item {
    route_revision: u64,
    params: Object,
}

fn invalid(why: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidParams, why.into())
}

/// Rule 1: the batch's items, or why the whole batch is refused.
fn items(mut p: Object, max_batch: u64) -> Result<Vec<Item>, Error> {
    let Some(Value::Array(list)) = p.remove("items") else {
        return Err(invalid(
            "items: a list of {params, route_revision} is required",
        ));
    };
    if let Some((k, _)) = p.iter().next() {
        return Err(invalid(format!("{k}: not a member of a batch")));
    }
    if list.is_empty() {
        return Err(invalid("items: a batch carries at least one item"));
    }
    if list.len() as u64 > max_batch {
        return Err(invalid(format!(
            "items: {} items exceed max_batch {max_batch}",
            list.len()
        )));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, v)| {
            let Value::Object(mut o) = v else {
                return Err(invalid(format!("items[{i}]: not an object")));
            };
            let revision = o.remove("route_revision");
            let params = o.remove("params");
            if let Some((k, _)) = o.iter().next() {
                return Err(invalid(format!("items[{i}].{k}: not a member of an item")));
            }
            let Some(route_revision) = revision.as_ref().and_then(Value::as_protocol_int) else {
                return Err(invalid(format!(
                    "items[{i}].route_revision: an integer is required"
                )));
            };
            let Some(Value::Object(params)) = params else {
                return Err(invalid(format!("items[{i}].params: an object is required")));
            };
            Ok(Item {
                route_revision,
                params,
            })
        })
        .collect()
}

/// The recipient an item's params name, if they name one.
fn recipient(params: &Object) -> Option<&str> {
    params.get("envelope")?.as_object()?.get("to")?.as_str()
}

impl<S: Storage, E: Entropy> Engine<S, E> {
    /// `message.deliver.batch`: every item through `message.deliver`, in order (rules 1-5).
    pub(crate) fn deliver_batch(&mut self, caller: &Caller, p: Object, now: u64) -> Response {
        let refuse = |e: Error| Response {
            result: Err(e),
            effects: Vec::new(),
        };
        let relay = match caller {
            Caller::Relay {
                relay,
                route_revision: None,
            } => relay.clone(),
            Caller::Relay { .. } => return refuse(invalid(
                "message.deliver.batch carries no Relay-Route-Revision: each item names its own",
            )),
            _ => {
                return refuse(Error::new(
                    ErrorCode::Unauthenticated,
                    "this method needs relay authentication",
                ))
            }
        };
        let items = match items(p, self.config.policies.max_batch) {
            Ok(items) => items,
            Err(e) => return refuse(e),
        };
        let mut results = Vec::with_capacity(items.len());
        let mut effects = Vec::new();
        for item in items {
            let shard = self.config.shard;
            let r = match recipient(&item.params) {
                Some(to) if !shard.owns(to) => refuse(Error::new(
                    ErrorCode::Unavailable,
                    "this item's recipient is served by another shard of this relay: send it alone",
                )),
                _ => {
                    let len = canonical::object_to_vec(&item.params).len();
                    let caller = Caller::relay_at(relay.clone(), Some(item.route_revision));
                    self.call_parsed(&caller, None, super::effect::DELIVER, item.params, len, now)
                }
            };
            results.push(match r.result {
                Ok(v) => v,
                Err(e) => error_body(&e),
            });
            effects.extend(r.effects);
        }
        let mut o = Object::new();
        o.insert("results", Value::Array(results));
        Response {
            result: Ok(Value::Object(o)),
            effects,
        }
    }
}

/// What a source may put in one batch under its policies (rule 6): items and body bytes.
pub(crate) fn budget(max_batch: u64, max_batch_bytes: u64) -> (usize, usize) {
    (
        max_batch.min(MAX_BATCH) as usize,
        max_batch_bytes.min(MAX_BATCH_BYTES) as usize,
    )
}

/// The bytes an item of `params_len` bytes of params adds to a batch body.
pub(crate) fn item_cost(params_len: usize) -> usize {
    params_len + ITEM_BYTES
}

/// The bytes of a batch body before its items.
pub(crate) const fn frame_cost() -> usize {
    FRAME_BYTES
}

/// A batch body of `(canonical params, route revision)` items, canonical JSON itself
/// (`params` sorts before `route_revision`), each item's params byte for byte as sent alone.
pub(crate) fn body<'a>(items: impl IntoIterator<Item = (&'a [u8], u64)>) -> Vec<u8> {
    let mut out = b"{\"items\":[".to_vec();
    for (i, (params, revision)) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"params\":");
        out.extend_from_slice(params);
        out.extend_from_slice(b",\"route_revision\":");
        out.extend_from_slice(revision.to_string().as_bytes());
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

/// Rule 7: what became of each of `n` items of a batch whose exchange had `outcome`.
pub(crate) fn split(outcome: Outcome, n: usize) -> Vec<Outcome> {
    match outcome {
        Outcome::Result(body) => results(&body, n).unwrap_or_else(|| vec![Outcome::Unknown; n]),
        other => vec![other; n],
    }
}

/// The items' answers in a 200 batch answer, when it holds exactly `n` objects.
fn results(body: &[u8], n: usize) -> Option<Vec<Outcome>> {
    let mut o = json::parse_object(body).ok()?;
    let Some(Value::Array(list)) = o.remove("results") else {
        return None;
    };
    if list.len() != n {
        return None;
    }
    list.into_iter()
        .map(|v| match v {
            Value::Object(item) => {
                let is_error = item.get("error").is_some();
                let bytes = canonical::object_to_vec(&item);
                Some(if is_error {
                    Outcome::Error(bytes)
                } else {
                    Outcome::Result(bytes)
                })
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Item>, Error> {
        items(json::parse_object(text.as_bytes()).unwrap(), 2)
    }

    #[test]
    fn rule_1_a_malformed_batch_is_refused_whole() {
        for bad in [
            r#"{}"#,
            r#"{"items":{}}"#,
            r#"{"items":[]}"#,
            r#"{"items":[{"params":{},"route_revision":1}],"extra":1}"#,
            r#"{"items":[{"params":{},"route_revision":1},{"params":{},"route_revision":1},{"params":{},"route_revision":1}]}"#,
            r#"{"items":[1]}"#,
            r#"{"items":[{"params":{}}]}"#,
            r#"{"items":[{"route_revision":1}]}"#,
            r#"{"items":[{"params":[],"route_revision":1}]}"#,
            r#"{"items":[{"params":{},"route_revision":-1}]}"#,
            r#"{"items":[{"params":{},"route_revision":1.5}]}"#,
            r#"{"items":[{"params":{},"route_revision":1,"x":0}]}"#,
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} was taken"));
            assert_eq!(e.code, ErrorCode::InvalidParams, "{bad}");
        }
        let ok = parse(r#"{"items":[{"params":{"a":1},"route_revision":7}]}"#).unwrap();
        assert_eq!(ok[0].route_revision, 7);
        assert_eq!(canonical::object_to_string(&ok[0].params), r#"{"a":1}"#);
    }

    #[test]
    fn rule_6_a_batch_body_is_canonical_and_keeps_each_items_params() {
        let b = body([(&br#"{"a":1}"#[..], 3), (&br#"{"b":2}"#[..], 4)]);
        assert_eq!(
            b,
            br#"{"items":[{"params":{"a":1},"route_revision":3},{"params":{"b":2},"route_revision":4}]}"#
        );
        let parsed = json::parse_object(&b).unwrap();
        assert_eq!(canonical::object_to_vec(&parsed), b);
        let cost = frame_cost() + item_cost(7) + item_cost(7);
        assert!(cost >= b.len(), "{cost} < {}", b.len());
        assert_eq!(budget(1000, 1 << 30), (64, 1 << 20));
        assert_eq!(budget(8, 4096), (8, 4096));
    }

    #[test]
    fn rule_7_each_item_takes_its_own_answer_or_the_batchs() {
        let ok = br#"{"results":[{"status":"target_accepted"},{"error":{"code":"not_found","message":"x"}}]}"#;
        assert_eq!(
            split(Outcome::Result(ok.to_vec()), 2),
            vec![
                Outcome::Result(br#"{"status":"target_accepted"}"#.to_vec()),
                Outcome::Error(br#"{"error":{"code":"not_found","message":"x"}}"#.to_vec()),
            ]
        );
        // One result too few, or a result that is not an object: nothing is known of any.
        assert_eq!(
            split(Outcome::Result(ok.to_vec()), 3),
            vec![Outcome::Unknown; 3]
        );
        assert_eq!(
            split(Outcome::Result(br#"{"results":[1]}"#.to_vec()), 1),
            vec![Outcome::Unknown]
        );
        let refused = br#"{"error":{"code":"unauthenticated","message":"x"}}"#.to_vec();
        assert_eq!(
            split(Outcome::Error(refused.clone()), 2),
            vec![Outcome::Error(refused.clone()), Outcome::Error(refused)]
        );
        assert_eq!(
            split(Outcome::NotAttempted, 2),
            vec![Outcome::NotAttempted; 2]
        );
    }
}
