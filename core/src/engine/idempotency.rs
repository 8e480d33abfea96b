//! Idempotency: the logical key (from, message_id) of `message.send` and `message.deliver`,
//! the hash of a request's params, and what a repeated request is answered.
//!
//! The seed: a request whose logical key was accepted before is answered with the stored
//! result when its params hash is the same, and `state_conflict` when it differs; nothing
//! else about it is checked again.

use super::context::Ctx;
use super::keyspace as k;
use super::records::{RecvRec, SendRec};
use super::send::task_id;
use super::status;
use super::storage::Storage;
use super::Entropy;
use crate::wire::base64url;
use crate::wire::canonical;
use crate::wire::crypto::Crypto;
use crate::wire::envelope::MessageEnvelope;
use crate::wire::field::{FieldError, Fields};
use crate::wire::json::{Object, Value};
use crate::{Error, ErrorCode};

/// The logical request hash: base64url(sha256(JCS(params))), where the params are `p`
/// with `envelope` as their `envelope` member (taken out of `p` when it was parsed, so it
/// is not cloned); the envelope's canonical text, which acceptance needs anyway, is spliced in.
pub(crate) fn params_hash(p: &Object, envelope: &MessageEnvelope, crypto: &Crypto) -> String {
    let texts: Vec<(&str, String)> = p
        .iter()
        .filter(|(k, _)| *k != "envelope")
        .map(|(k, v)| (k, canonical::to_string(v)))
        .collect();
    let mut members: Vec<(&str, &str)> = texts.iter().map(|(k, v)| (*k, v.as_str())).collect();
    members.push(("envelope", envelope.canonical_text()));
    canonical_hash(
        canonical::object_of_canonical(&mut members).as_bytes(),
        crypto,
    )
}

/// Takes the required `envelope` object out of `p` and parses it (so it is never cloned).
pub(crate) fn take_envelope(p: &mut Object) -> Result<MessageEnvelope, Error> {
    Fields::new(p).object("envelope")?;
    match p.remove("envelope") {
        Some(Value::Object(o)) => {
            MessageEnvelope::parse(o).map_err(|e| e.within("envelope").into())
        }
        _ => Err(FieldError::invalid("envelope", "must be an object").into()),
    }
}

/// The params hash of params whose canonical form is `jcs`.
pub(crate) fn canonical_hash(jcs: &[u8], crypto: &Crypto) -> String {
    base64url::encode(&crypto.sha256(jcs))
}

/// The answer to a request whose logical key was accepted with other params.
pub(crate) fn state_conflict() -> Error {
    Error::new(
        ErrorCode::StateConflict,
        "a different request with this (from, message_id) was already accepted",
    )
}

impl<S: Storage, E: Entropy> Ctx<'_, S, E> {
    /// The source's answer to a `message.send` seen before: its stored DeliveryStatus, or
    /// `state_conflict`; `None` for a new logical key.
    pub(crate) fn sent_before(
        &mut self,
        from: &str,
        id: &str,
        hash: &str,
    ) -> Result<Option<Value>, Error> {
        if let Some(r) = self.txn.get::<SendRec>(&k::sent(from, id))? {
            if r.hash != hash {
                return Err(state_conflict());
            }
            return Ok(Some(status::from_send(from, id, &r)));
        }
        // Expiry of an earlier acceptance of this key may have removed its sent record and
        // not yet its delivery (a tick expires a bounded batch). A second delivery under the
        // same task id would be erased by that expiry, so until it is cleared the key is
        // answered as the seed allows once retention has ended.
        if !self.txn.is_absent(&k::task(&task_id(from, id)))? {
            return Err(Error::new(
                ErrorCode::MessageExpired,
                "the retention of an earlier acceptance of this message_id has ended; its result is unavailable",
            ));
        }
        Ok(None)
    }

    /// The destination's answer to a `message.deliver` seen before: its receipt, or
    /// `state_conflict`; `None` for a new logical key.
    pub(crate) fn received_before(
        &mut self,
        from: &str,
        id: &str,
        hash: &str,
    ) -> Result<Option<Value>, Error> {
        match self.txn.get::<RecvRec>(&k::received(from, id))? {
            Some(r) if r.hash != hash => Err(state_conflict()),
            Some(r) => Ok(Some(status::from_receipt(from, id, &r))),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::draft;
    use crate::wire::json::parse_object;

    #[test]
    fn the_params_hash_is_the_hash_of_the_canonical_params() {
        let mut body = Object::new();
        body.insert("ct", "Zm9v\u{e9}\"\\");
        let (_, _, _, env) = draft::signed_test_envelope(body, 1_700_000_000_000);
        // Members in a non-canonical order and spacing, as a client may send them.
        let text = format!(
            r#"{{ "recipient_boxes" : [{{"device_id":"x","z":1,"a":[true,null]}}],
                 "envelope" : {}, "authorization": {{"type":"grant","b":"\u00e9"}} }}"#,
            canonical::to_string(&Value::Object(env))
        );
        let p = parse_object(text.as_bytes()).expect("params");
        let c = Crypto::new();
        let want = canonical_hash(&canonical::object_to_vec(&p), &c);
        let mut rest = p.clone();
        let e = take_envelope(&mut rest).expect("envelope parses");
        assert!(!rest.contains("envelope"));
        assert_eq!(params_hash(&rest, &e, &c), want);
        assert_eq!(
            params_hash(&p, &e, &c),
            want,
            "a present envelope member is the same one"
        );
    }
}
